"""In-sandbox tools outside a sandbox: the argv a sandbox CLI call becomes, and a real stdio MCP server
spoken to with the runner's standard-library client."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.local_tools import LocalTools, ToolRefused, build_argv, run_cli
from runner.mcp_stdio import StdioMcpError

ROOT = Path(__file__).resolve().parents[2]
ECHO = {"command": "printf", "args": ["[%s]\\n", "{text}"]}
GREP = {"command": "grep", "args": ["-n", "{pattern}", "--", "{path}"]}


def test_each_value_is_exactly_one_argument_and_never_a_shell_line(tmp_path: Path) -> None:
    assert build_argv(ECHO, {"text": "; rm -rf /"}) == ["printf", "[%s]\\n", "; rm -rf /"]
    assert run_cli(ECHO, {"text": "$(id) `id` ; rm -rf / && echo hi"}, str(tmp_path)) == (
        0,
        "[$(id) `id` ; rm -rf / && echo hi]\n",
    )


def test_no_flag_the_template_did_not_declare() -> None:
    with pytest.raises(ToolRefused, match="may not start with '-'"):
        build_argv(GREP, {"pattern": "--include=*", "path": "a"})
    # After the template's own `--` a leading dash is an operand, not an option.
    assert build_argv(GREP, {"pattern": "x", "path": "-weird-name"}) == ["grep", "-n", "x", "--", "-weird-name"]
    with pytest.raises(ToolRefused, match="undeclared argument"):
        build_argv(GREP, {"pattern": "x", "flags": "-r"})
    with pytest.raises(ToolRefused, match="string or a number"):
        build_argv(GREP, {"pattern": ["a", "b"]})
    assert build_argv(GREP, {"pattern": "x"}) == ["grep", "-n", "x", "--"], "an optional argument left out"


def test_a_real_stdio_mcp_server_answers_and_is_closed(tmp_path: Path) -> None:
    shutil.copy(ROOT / "tests" / "mcp_stdio_server.py", tmp_path / "server.py")
    caps = {"servers": [{"class": "sandbox", "name": "probe", "command": sys.executable, "args": ["server.py"],
                         "tools": [{"name": "add"}, {"name": "probe"}]}]}  # fmt: skip
    local = LocalTools.from_capabilities(json.dumps(caps))
    assert local.owns("mcp__probe__add") and not local.owns("mcp__probe__other") and not local.owns("Bash")
    try:
        first = local.call("mcp__probe__add", {"a": 2, "b": 40}, str(tmp_path))
        second = local.call("mcp__probe__add", {"a": 1, "b": 1}, str(tmp_path))
        assert first["content"][0]["text"] == "42" and second["content"][0]["text"] == "2"
        proc = local._running["probe"]._proc
        assert proc is not None, "one process serves every call"
    finally:
        local.close()
    assert proc.poll() is not None, "closing stops the server"


def test_a_server_that_cannot_start_fails_the_call_with_the_reason(tmp_path: Path) -> None:
    caps = {
        "servers": [
            {"class": "sandbox", "name": "gone", "command": str(tmp_path / "missing"), "tools": [{"name": "t"}]}
        ]
    }
    local = LocalTools.from_capabilities(json.dumps(caps))
    with pytest.raises(StdioMcpError, match="cannot start MCP server 'gone'"):
        local.call("mcp__gone__t", {}, str(tmp_path))


def _git(cwd: Path, *args: str) -> None:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", **who}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def test_git_never_looks_into_a_submodule_whose_own_configuration_names_commands(tmp_path: Path) -> None:
    """A submodule's configuration is read by a child git that the superproject's overrides cannot enumerate;
    the CLI's git ignores submodules, even where ``.gitmodules`` and the repository ask it to look."""
    marks = tmp_path / "marks"
    marks.mkdir()
    upstream, ws = tmp_path / "upstream", tmp_path / "ws"
    for repo in (upstream, ws):
        repo.mkdir()
        _git(repo, "init", "-q", "-b", "main")
        (repo / "a.txt").write_text("a\n")
        _git(repo, "add", "a.txt")
    _git(upstream, "commit", "-qm", "upstream")
    _git(ws, "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(upstream), "sub")
    _git(ws, "commit", "-qm", "with a submodule")
    _git(ws, "config", "--remove-section", "submodule.sub")  # only .gitmodules names it now
    module_config = ws / ".git" / "modules" / "sub" / "config"
    module_config.write_text(
        module_config.read_text()
        + f'[filter "evil"]\n\tclean = touch {marks}/clean && cat\n'
        + f"[diff \"evil\"]\n\ttextconv = sh -c 'touch {marks}/textconv && cat $0'\n"
    )
    (ws / "sub" / ".gitattributes").write_text("*.txt filter=evil diff=evil\n")
    (ws / "sub" / "a.txt").write_text("changed in the submodule\n")
    (ws / ".gitmodules").write_text((ws / ".gitmodules").read_text() + "\tignore = none\n")
    with (ws / ".git" / "config").open("a") as config:
        config.write("[diff]\n\tsubmodule = diff\n[status]\n\tsubmoduleSummary = true\n")
    status = {"command": "git", "args": ["-c", "safe.directory=*", "status", "--short"]}
    diff = {"command": "git", "args": ["-c", "safe.directory=*", "diff", "--no-ext-diff"]}
    status_out, (code, diff_out) = run_cli(status, {}, str(ws)), run_cli(diff, {}, str(ws))
    assert sorted(p.name for p in marks.iterdir()) == [], "a command the submodule's configuration names ran"
    assert status_out == (0, " M .gitmodules\n")
    assert code == 0 and "+\tignore = none" in diff_out and "changed in the submodule" not in diff_out
