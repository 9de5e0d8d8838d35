"""The shell word splitter the policy engine judges commands by, checked against real bash: for any command line
of quotes, escapes and ANSI-C strings, :func:`core.shell_words.split` gives exactly the words bash passes."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from core.shell_words import ShellSyntaxError, split
from tests.helpers import examples

# Pieces bash treats specially when splitting and unquoting. Nothing here may expand, which the splitter never
# does: bash runs with globbing and brace expansion off, and "$" comes only as $'...' or $"..." (a "\\$" piece
# after a lone backslash would make "\\$a", a parameter expansion, for instance).
PIECES = [
    "a", "-", "=", "x", "0", "5", "7", "u", "c", "e", ",", " ", "\t", "'", '"', "\\", "$'", '$"', "\\\n",
    "\\x2d", "\\055", "\\u2014", "\\U0001F600", "\\cA", "\\'", '\\"', "\\\\", "\\n", "--output",
]  # fmt: skip
lines = st.lists(st.sampled_from(PIECES), max_size=14).map("".join)


def bash_words(command: str) -> list[str] | None:
    """The words bash passes to a command given ``command`` as its arguments; None if bash refuses the line.
    In the sandbox's locale (C.UTF-8: the runner sets it for every tool), where $'\\u…' decodes."""
    script = "set -f +B; w() { [ $# -gt 0 ] && printf '%s\\0' \"$@\"; printf '\\1'; }; w " + command
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, check=False
    )
    if done.returncode != 0 or not done.stdout.endswith(b"\x01"):
        return None
    out = done.stdout[:-1]
    return [w.decode("utf-8", "surrogateescape") for w in out.split(b"\0")[:-1]]


@settings(max_examples=examples(300), deadline=None, database=None)
@given(command=lines)
@example(command="git diff \"--output\"=f '--out'put=g --o\\utput=h $'\\x2d-output=i' $\"--output\"=j")
@example(command="a\\\n b")
def test_the_words_are_the_ones_bash_passes(command: str) -> None:
    try:
        mine: list[str] | None = split(command)
    except ShellSyntaxError:
        mine = None
    if mine is not None and any("\0" in w for w in mine):
        return  # bash cuts a word at a NUL ($'\0'); the splitter keeps it, which only shows deny patterns more
    theirs = bash_words(command)
    # A newline no backslash continues ends the command: bash runs the rest as a second one, which this oracle
    # cannot show (the splitter keeps those words too, for deny patterns to see).
    assume(theirs is not None or "\n" not in command)
    # Bash drops a lone backslash at the very end of a line that continues a single-quoted newline; the splitter
    # keeps it (as bash does everywhere else), which only shows a deny pattern one character more.
    trailing_backslashes = len(command) - len(command.rstrip("\\"))
    assume("\n" not in command or trailing_backslashes % 2 == 0)
    assert mine == theirs


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("", []),
        ("  ls \t -la  ", ["ls", "-la"]),
        ('git diff "--output"=f', ["git", "diff", "--output=f"]),
        ("git diff '--output'=f", ["git", "diff", "--output=f"]),
        ("git diff --o\\utput=f", ["git", "diff", "--output=f"]),
        ("git diff $'\\x2d\\055output=f'", ["git", "diff", "--output=f"]),
        ("grep 'foo$' x", ["grep", "foo$", "x"]),
        ("echo '' \"\"", ["echo", "", ""]),
        ('echo "a\\$b\\q"', ["echo", "a$b\\q"]),
        ("echo $X ${Y} {a,b} *", ["echo", "$X", "${Y}", "{a,b}", "*"]),  # nothing is expanded
        ("ls;rm x", ["ls;rm", "x"]),  # operators stay in their words
        ("echo a\\", ["echo", "a\\"]),
    ],
)
def test_examples(command: str, words: list[str]) -> None:
    assert split(command) == words


@pytest.mark.parametrize(
    ("command", "message"),
    [("echo 'a", "single quote"), ('echo "a', "double quote"), ("echo $'a", "ANSI-C quote"), ('echo "a\\"', "double")],
)
def test_an_unterminated_quote_is_an_error_naming_it(command: str, message: str) -> None:
    with pytest.raises(ShellSyntaxError, match=message):
        split(command)
