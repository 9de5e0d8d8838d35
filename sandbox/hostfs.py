"""What a sandbox leaves on the host filesystem, handed over and taken back safely.

Before a sandbox starts, its workspace is given to the sandbox account (it must be able to write there).
After it is gone, the workspace is taken back: everything owned by the control plane again, every
setuid/setgid bit cleared, and anything that is neither a regular file, a directory nor a symlink (a
fifo, a socket, a device) removed, so nothing an agent left behind can raise a host user's privileges or
block a reader. Nothing here follows a symlink: the agent chose where they point.
"""

from __future__ import annotations

import contextlib
import os
import stat

_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID


def give(top: str, uid: int, gid: int) -> None:
    """Make ``top`` and everything below it owned by ``uid``:``gid`` (symlinks themselves, not targets)."""
    _chown_tree(top, uid, gid)


def take_back(top: str) -> list[str]:
    """Own ``top`` again as this process, clear setuid/setgid bits and remove special files.

    Returns the paths (relative to ``top``) of what was removed or changed, for the record.
    """
    changed: list[str] = []
    if not os.path.isdir(top) or os.path.islink(top):
        return changed
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode) or stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                if mode & _PRIVILEGE_BITS and not stat.S_ISLNK(mode):
                    _clear_privilege_bits(path, mode)
                    changed.append(os.path.relpath(path, top))
                continue
            with contextlib.suppress(OSError):
                os.unlink(path)
                changed.append(os.path.relpath(path, top))
    uid, gid = os.getuid(), os.getgid()
    _chown_tree(top, uid, gid)
    return changed


def _clear_privilege_bits(path: str, mode: int) -> None:
    # No lchmod on Linux: open without following (the sandbox is gone, so nothing can swap the entry).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if stat.S_ISDIR(mode):
        flags |= os.O_DIRECTORY
    try:
        fd = os.open(path, flags)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # a regular file we cannot open is removed rather than left setuid
        return
    try:
        os.fchmod(fd, stat.S_IMODE(mode) & ~_PRIVILEGE_BITS)
    finally:
        os.close(fd)


def _chown_tree(top: str, uid: int, gid: int) -> None:
    if os.path.islink(top) or not os.path.isdir(top):
        return
    os.chown(top, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            with contextlib.suppress(FileNotFoundError):
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
