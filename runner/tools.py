"""Tool executors for the in-sandbox runner: real effects, confined to the workspace.

The sandbox (bubblewrap / a Pod) is the security boundary. These executors still refuse paths that
resolve outside the workspace and start shells with a scrubbed environment, so a misconfigured sandbox
never lets a tool call write outside ``/workspace`` or read the session tokens from its environment.

A path starting with ``/workspace`` is rebased onto ``root``: scripts are written against the sandbox
layout, while tests (and a bare local process) run them against any directory.

Exceptions: every refusal is a ``ValueError``; I/O failures surface as ``OSError``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import IO, TYPE_CHECKING

from core.wire import SANDBOX_WORKSPACE

if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_ROOT = SANDBOX_WORKSPACE
OUTPUT_CAP_BYTES = 16 * 1024
DEFAULT_BASH_TIMEOUT_S = 60.0
TIMEOUT_EXIT_CODE = 124
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# How long to keep reading after bash itself exited: a backgrounded child may still hold the pipe open.
_DRAIN_GRACE_S = 0.5
_READ_CHUNK = 64 * 1024

_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


def resolve_path(path: str, root: str | os.PathLike[str] = DEFAULT_ROOT) -> Path:
    """Map a tool's path onto the workspace and refuse anything that resolves outside it.

    Args:
        path: absolute (``/workspace/...`` is rebased onto ``root``) or relative to ``root``.
        root: the workspace directory.

    Returns:
        The fully resolved path (symlinks followed).

    Raises:
        ValueError: the path is empty or resolves outside ``root``.
    """
    if not path or "\x00" in path:
        raise ValueError(f"invalid path: {path!r}")
    root_str = os.fspath(root)
    if path == SANDBOX_WORKSPACE or path.startswith(SANDBOX_WORKSPACE + "/"):
        candidate = os.path.join(root_str, path[len(SANDBOX_WORKSPACE) :].lstrip("/"))
    else:
        # os.path.join discards root when path is absolute, which is what we want: it is then checked.
        candidate = os.path.join(root_str, path)
    real_root = os.path.realpath(root_str)
    real = os.path.realpath(candidate)
    if os.path.commonpath([real, real_root]) != real_root:
        raise ValueError(f"path escapes the workspace: {path}")
    # Imported here: a run whose tools touch no file (Bash only) never loads pathlib and urllib (issue 12).
    from pathlib import Path

    return Path(real)


def write_file(path: str, content: str, root: str | os.PathLike[str] = DEFAULT_ROOT) -> int:
    """Write ``content`` (UTF-8) to ``path``, creating parent directories; returns the bytes written."""
    target = resolve_path(path, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8")
    target.write_bytes(data)
    return len(data)


def edit_file(path: str, old_string: str, new_string: str, root: str | os.PathLike[str] = DEFAULT_ROOT) -> None:
    """Replace the single occurrence of ``old_string`` in ``path`` with ``new_string``.

    Raises:
        ValueError: ``old_string`` is empty or does not occur exactly once (the message names the count).
    """
    if not old_string:
        raise ValueError("old_string must not be empty")
    target = resolve_path(path, root)
    # Bytes round-trip: text mode would silently rewrite CRLF line endings.
    text = target.read_bytes().decode("utf-8")
    count = text.count(old_string)
    if count != 1:
        raise ValueError(f"old_string occurs {count} times in {path}; it must occur exactly once")
    target.write_bytes(text.replace(old_string, new_string, 1).encode("utf-8"))


def read_file(path: str, root: str | os.PathLike[str] = DEFAULT_ROOT) -> str:
    """Return the file's text (UTF-8, undecodable bytes replaced), capped at 16 KiB with a note."""
    target = resolve_path(path, root)
    with target.open("rb") as fh:
        data = fh.read(OUTPUT_CAP_BYTES + 1)
        total = os.fstat(fh.fileno()).st_size
    return _cap(data, max(total, len(data)))


def child_env(root: str | os.PathLike[str] = DEFAULT_ROOT) -> dict[str, str]:
    """The complete environment of a tool's shell: an allow-list, so no token or FLUIDBOX_* leaks."""
    return {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": os.fspath(root),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def run_bash(
    command: str, root: str | os.PathLike[str] = DEFAULT_ROOT, timeout_s: float = DEFAULT_BASH_TIMEOUT_S
) -> tuple[int, str]:
    """Run ``bash -c command`` in ``root``; returns ``(exit_code, merged stdout+stderr)``.

    Output is capped at 16 KiB (with a truncation note). On timeout the whole process group is killed
    and the exit code is 124, as with coreutils ``timeout``. Death by signal N reports 128+N, as shells do.
    """
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=os.fspath(root),
        env=child_env(root),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # Own process group, so a timeout or a quiesce can kill grandchildren too.
        start_new_session=True,
    )
    assert proc.stdout is not None
    with _running_lock:
        _running.add(proc)
    capture = _Capture(proc.stdout)
    capture.start()
    timed_out = False
    try:
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            code = proc.wait()
        capture.join(_DRAIN_GRACE_S)
        if capture.is_alive():
            _kill_group(proc)
            # A child that left our session can keep the pipe open forever; keep what we have.
            capture.join(_DRAIN_GRACE_S)
    finally:
        with _running_lock:
            _running.discard(proc)
    output = capture.text()
    if timed_out:
        return TIMEOUT_EXIT_CODE, output + f"\n[command timed out after {timeout_s:g}s]"
    return (128 - code if code < 0 else code), output


def kill_running() -> None:
    """Kill every shell started by :func:`run_bash` that is still running (used when quiescing)."""
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _cap(data: bytes, total: int) -> str:
    if total <= OUTPUT_CAP_BYTES and len(data) <= OUTPUT_CAP_BYTES:
        return data.decode("utf-8", errors="replace")
    shown = data[:OUTPUT_CAP_BYTES].decode("utf-8", errors="replace")
    return shown + f"\n[output truncated: showing the first {OUTPUT_CAP_BYTES} of {total} bytes]"


class _Capture(threading.Thread):
    """Drains a pipe, keeping the first bytes up to the cap, so a chatty child never blocks on a full pipe."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(name="fluidbox-bash-output", daemon=True)
        self._stream = stream
        self._lock = threading.Lock()
        self._buf = bytearray()
        self._total = 0

    def run(self) -> None:
        fd = self._stream.fileno()
        try:
            while chunk := os.read(fd, _READ_CHUNK):
                with self._lock:
                    self._total += len(chunk)
                    room = OUTPUT_CAP_BYTES + 1 - len(self._buf)
                    if room > 0:
                        self._buf += chunk[:room]
        except OSError:
            pass
        finally:
            self._stream.close()

    def text(self) -> str:
        with self._lock:
            return _cap(bytes(self._buf), self._total)
