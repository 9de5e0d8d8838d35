"""A shell command line split into the words bash would pass, quotes removed (pure).

Shell rules of a policy judge what the shell runs, not how it was spelled: ``"--output"=f``, ``'--output'=f``,
``--o\\utput=f`` and ``$'\\x2d-output=f'`` are all the word ``--output=f`` to bash. :func:`split` does bash's
splitting and quote removal for one command line:

- words are separated by unquoted spaces, tabs and newlines (a newline also ends a command in bash; the words
  after it are kept, so a deny pattern still sees them);
- ``'...'`` is literal; ``"..."`` is literal except that a backslash escapes ``$``, `````, ``"``, ``\\`` and a
  newline (which it removes); outside quotes a backslash escapes the next character (``\\`` + newline is a line
  continuation, removed; a trailing lone backslash stays);
- ``$'...'`` is bash's ANSI-C quoting, decoded as bash decodes it (``\\n``, ``\\x2d``, ``\\055``, ``\\u2014``,
  ``\\cA``…); ``$"..."`` (a locale translation) is read as ``"..."``. Neither form is known to :mod:`shlex`,
  which is why this module exists.

Nothing is *expanded*: ``$X``, ``${X}``, ``$(…)``, backticks, globs, ``{a,b}`` braces and ``~`` are left as
written, so a word containing one is not what runs. A policy that must see every word denies those constructs
(the seeded ``governed`` policy does). Operators (``;``, ``|``, ``&&``, redirections) are not split off either:
they stay inside the words they touch, which only ever makes a prefix match less likely.

Errors::

    ShellSyntaxError   an unterminated quote (str(): which one)
"""

from __future__ import annotations

import re

__all__ = ["ShellSyntaxError", "split"]

_BLANKS = re.compile(r"[ \t\n]+")
_QUOTING = re.compile(r"['\"\\]")
_ANSI_SIMPLE = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip


class ShellSyntaxError(ValueError):
    """The command line cannot be split: a quote is never closed."""


# One alternative per piece of a word; finditer walks a line piece by piece, not character by character.
_PIECE = re.compile(
    r"""(?P<blank>[ \t\n]+)
      | (?P<plain>[^ \t\n'"\\$]+)
      | '(?P<single>[^']*)'
      | \$'(?P<ansi>(?:[^'\\]|\\.)*)'
      | \$?"(?P<double>(?:[^"\\]|\\.)*)"
      | \\\n
      | \\(?P<escaped>.)
      | (?P<open>'|\$'|\$?")
      | (?P<literal>\\\Z|\$)""",
    re.VERBOSE | re.DOTALL,
)
_DQ_ESCAPE = re.compile(r'\\([$`"\\\n])')
_ANSI_ESCAPE = re.compile(
    r"\\(?:([abeEfnrtv\\'\"?])|([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{1,4})|U([0-9a-fA-F]{1,8})|c(.)|)", re.S
)
_OPENED = {"'": "an unterminated single quote (')", "$'": "an unterminated ANSI-C quote ($')"}


def split(command: str) -> list[str]:
    """The words of ``command`` after bash's word splitting and quote removal (no expansion).

    Raises:
        ShellSyntaxError: a ``'``, ``"`` or ``$'`` quote is not closed.
    """
    if not _QUOTING.search(command):  # the common case: nothing to unquote
        return [w for w in _BLANKS.split(command) if w]
    words: list[str] = []
    word: list[str] = []
    in_word = False  # a quoted empty string ('') is still a word
    for m in _PIECE.finditer(command):
        kind = m.lastgroup
        if kind == "blank":
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            continue
        if kind is None:  # a line continuation: gone, as if never written
            continue
        if kind == "open":
            raise ShellSyntaxError(_OPENED.get(m.group(kind), 'an unterminated double quote (")'))
        in_word = True
        text = m.group(kind)
        if kind == "double":
            text = _DQ_ESCAPE.sub(_dq_unescape, text) if "\\" in text else text
        elif kind == "ansi":
            text = _ANSI_ESCAPE.sub(_ansi_unescape, text) if "\\" in text else text
        word.append(text)
    if in_word:
        words.append("".join(word))
    return words


def _dq_unescape(m: re.Match[str]) -> str:
    return "" if m.group(1) == "\n" else m.group(1)


def _ansi_unescape(m: re.Match[str]) -> str:
    simple, octal, hex2, hex4, hex8, control = m.groups()
    if simple is not None:
        return _ANSI_SIMPLE[simple]
    if octal is not None:
        return chr(int(octal, 8) & 0xFF)
    for digits in (hex2, hex4, hex8):
        if digits is not None:
            code = int(digits, 16)
            return chr(code) if code <= 0x10FFFF else "\ufffd"
    if control is not None:
        return chr(ord(control) & 0x1F)
    return m.group(0)  # an escape bash does not know stays as written
