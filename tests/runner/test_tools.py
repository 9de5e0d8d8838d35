"""Tool executors: workspace confinement, Edit uniqueness, output cap, timeout, scrubbed environment."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from core.contract import TOKEN_ENV_VARS
from runner import tools


def test_workspace_paths_are_rebased_onto_the_root(tmp_path: Path) -> None:
    assert tools.resolve_path("/workspace/app.py", tmp_path) == tmp_path.resolve() / "app.py"
    assert tools.resolve_path("/workspace", tmp_path) == tmp_path.resolve()
    assert tools.resolve_path("/workspace/", tmp_path) == tmp_path.resolve()


def test_relative_paths_are_relative_to_the_root(tmp_path: Path) -> None:
    assert tools.resolve_path("src/app.py", tmp_path) == tmp_path.resolve() / "src" / "app.py"
    assert tools.resolve_path("./a/../b", tmp_path) == tmp_path.resolve() / "b"


def test_an_absolute_path_inside_the_root_is_accepted(tmp_path: Path) -> None:
    inside = str(tmp_path / "x.txt")
    assert tools.resolve_path(inside, tmp_path) == tmp_path.resolve() / "x.txt"


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "/workspacefoo/x", "/workspace/../etc", "a/../../b"])
def test_paths_outside_the_root_are_refused(tmp_path: Path, path: str) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    with pytest.raises(ValueError, match="path escapes the workspace"):
        tools.resolve_path(path, root)


def test_a_symlink_pointing_outside_is_refused_for_every_tool(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    (root / "link.txt").symlink_to(secret)
    (root / "linkdir").symlink_to(tmp_path)

    with pytest.raises(ValueError, match="path escapes the workspace"):
        tools.read_file("link.txt", root)
    with pytest.raises(ValueError, match="path escapes the workspace"):
        tools.write_file("/workspace/link.txt", "overwritten", root)
    with pytest.raises(ValueError, match="path escapes the workspace"):
        tools.edit_file("link.txt", "top", "no", root)
    with pytest.raises(ValueError, match="path escapes the workspace"):
        tools.write_file("linkdir/new.txt", "x", root)
    assert secret.read_text() == "top secret\n"
    assert not (tmp_path / "new.txt").exists()


def test_write_creates_parent_directories_and_reports_bytes(tmp_path: Path) -> None:
    assert tools.write_file("/workspace/pkg/mod.py", "héllo\n", tmp_path) == len("héllo\n".encode())
    assert (tmp_path / "pkg" / "mod.py").read_text(encoding="utf-8") == "héllo\n"


def test_edit_replaces_a_unique_occurrence_and_keeps_line_endings(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"one\r\ntwo\r\n")
    tools.edit_file("f.txt", "two", "2", tmp_path)
    assert (tmp_path / "f.txt").read_bytes() == b"one\r\n2\r\n"


@pytest.mark.parametrize(("content", "count"), [("nothing here", 0), ("x = 1\nx = 1\n", 2)])
def test_edit_refuses_unless_old_string_occurs_exactly_once(tmp_path: Path, content: str, count: int) -> None:
    (tmp_path / "f.py").write_text(content)
    with pytest.raises(ValueError, match=f"occurs {count} times"):
        tools.edit_file("f.py", "x = 1", "x = 2", tmp_path)
    assert (tmp_path / "f.py").read_text() == content


def test_edit_refuses_an_empty_old_string(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("abc")
    with pytest.raises(ValueError, match="must not be empty"):
        tools.edit_file("f.py", "", "x", tmp_path)


def test_read_is_capped(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("y" * (tools.OUTPUT_CAP_BYTES * 2))
    text = tools.read_file("big.txt", tmp_path)
    assert text.startswith("y" * tools.OUTPUT_CAP_BYTES)
    assert "[output truncated" in text
    assert len(text) < tools.OUTPUT_CAP_BYTES + 200


def test_bash_runs_in_the_root_and_merges_stderr(tmp_path: Path) -> None:
    code, output = tools.run_bash("pwd; echo oops >&2; exit 3", tmp_path)
    assert code == 3
    assert output.splitlines() == [str(tmp_path), "oops"]


def test_bash_stdin_is_devnull(tmp_path: Path) -> None:
    assert tools.run_bash("cat; echo done", tmp_path, timeout_s=10) == (0, "done\n")


def test_bash_output_is_capped_with_a_note(tmp_path: Path) -> None:
    code, output = tools.run_bash("head -c 100000 /dev/zero | tr '\\0' x", tmp_path)
    assert code == 0
    assert output.startswith("x" * tools.OUTPUT_CAP_BYTES)
    assert "[output truncated: showing the first 16384 of 100000 bytes]" in output
    assert len(output) < tools.OUTPUT_CAP_BYTES + 200


def test_bash_timeout_kills_the_command_and_exits_124(tmp_path: Path) -> None:
    started = time.monotonic()
    code, output = tools.run_bash("echo started; sleep 30", tmp_path, timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert code == tools.TIMEOUT_EXIT_CODE
    assert output.startswith("started\n")
    assert "timed out after 0.5s" in output


def test_bash_does_not_hang_on_a_background_child_holding_the_pipe(tmp_path: Path) -> None:
    started = time.monotonic()
    code, output = tools.run_bash("sleep 30 & echo hi", tmp_path, timeout_s=20)
    assert time.monotonic() - started < 10
    assert (code, output) == (0, "hi\n")


def test_bash_death_by_signal_reports_128_plus_n(tmp_path: Path) -> None:
    code, _ = tools.run_bash("kill -9 $$", tmp_path)
    assert code == 128 + 9


def test_bash_child_environment_holds_no_token_and_no_fluidbox_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in TOKEN_ENV_VARS:
        monkeypatch.setenv(name, f"secret-{name}")
    monkeypatch.setenv("FLUIDBOX_SESSION_ID", "session-123")
    monkeypatch.setenv("FLUIDBOX_CONTROL_SOCKET", "/run/fluidbox/api.sock")
    code, output = tools.run_bash("env", tmp_path)
    assert code == 0
    env = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    assert not [name for name in env if name.startswith("FLUIDBOX_")]
    assert not set(TOKEN_ENV_VARS) & set(env)
    assert "secret-" not in output
    assert env["HOME"] == str(tmp_path)
    assert env["LANG"] == "C.UTF-8"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"] == os.environ["PATH"]
