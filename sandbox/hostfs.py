"""What a sandbox leaves on the host filesystem, handed over and taken back safely.

Before a sandbox starts, its workspace is given to the sandbox account (it must be able to write there).
After it is gone, the workspace is taken back: everything owned by the control plane again, every
setuid/setgid bit cleared, and anything that is neither a regular file, a directory nor a symlink (a
fifo, a socket, a device) removed, so nothing an agent left behind can raise a host user's privileges or
block a reader. Nothing here follows a symlink: the agent chose where they point.

Nothing here recurses or builds a path either: the agent chooses the tree's depth and its names, and
``os.walk`` over 1,500 nested directories raises ``RecursionError``, a path past ``PATH_MAX`` raises
``ENAMETOOLONG``. :func:`_walk` holds one directory descriptor at a time (going back up through ``..``,
checked against the device and inode it came down from), so a tree of any depth costs a few descriptors
and every call is relative to one. What cannot be taken back is removed (:func:`remove_tree`, the same
walk), and when the walk itself cannot go on, the caller removes the whole tree.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable

_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_REPORTED = 100  # changed paths returned by take_back (the count of the rest follows them)
MAX_SHOWN = 300  # characters of one reported path (a deep path is shown by its end)


class HostFsError(OSError):
    """The walk cannot go on: a directory is not where it was, or cannot be opened at all."""


# visit(dir_fd, name, lstat, where) → enter it (directories only); leave(dir_fd, name) after its entries;
# refused(dir_fd, name, lstat, where, error): a directory that could not be entered (without it, the walk raises).
Visit = Callable[[int, str, os.stat_result, "_Where"], bool]
Leave = Callable[[int, str], None]
Refused = Callable[[int, str, os.stat_result, "_Where", OSError], None]


class _Where:
    """The names from the walk's top down to the directory being read, for the record only."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def path(self, name: str) -> str:
        path = os.path.join(*self.names, name)
        return path if len(path) <= MAX_SHOWN else f"…{path[-MAX_SHOWN:]} ({len(self.names) + 1} levels)"


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _open_dir(dfd: int, name: str, st: os.stat_result) -> int:
    """Open a directory below ``dfd`` (giving its owner rwx back if it was locked), checked to be ``st``."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dfd)
    except PermissionError:
        os.chmod(name, stat.S_IMODE(st.st_mode) | stat.S_IRWXU, dir_fd=dfd)
        fd = os.open(name, DIR_FLAGS, dir_fd=dfd)
    if _ident(os.fstat(fd)) != _ident(st):
        os.close(fd)
        raise HostFsError(f"directory {name!r} changed while it was walked")
    return fd


def _enter(dfd: int, name: str, st: os.stat_result) -> tuple[int, list[str]]:
    fd = _open_dir(dfd, name, st)
    try:
        return fd, os.listdir(fd)
    except BaseException:
        os.close(fd)
        raise


def _walk(fd: int, visit: Visit, leave: Leave | None = None, refused: Refused | None = None) -> None:
    """Call ``visit`` for every entry below the open directory ``fd`` (closed here), a directory before
    what it holds, depth first.

    Iterative, one descriptor held at a time: each directory's names are listed when it is entered and
    kept (names only) until they are visited, and the walk goes back up through ``..``.

    Raises:
        OSError: ``fd`` cannot be listed, or a directory cannot be entered and ``refused`` is None
            (``HostFsError``: a directory is not where the walk left it).
    """
    where = _Where()
    try:
        idents = [_ident(os.fstat(fd))]
        pending = [os.listdir(fd)]
        while pending:
            if not pending[-1]:
                pending.pop()
                idents.pop()
                if not idents:
                    break
                parent = os.open("..", DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                if _ident(os.fstat(fd)) != idents[-1]:
                    raise HostFsError("a directory moved while it was walked")
                name = where.names.pop()
                if leave is not None:
                    leave(fd, name)
                continue
            name = pending[-1].pop()
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            if not visit(fd, name, st, where) or not stat.S_ISDIR(st.st_mode):
                continue
            try:
                sub, names = _enter(fd, name, st)
            except OSError as err:
                if refused is None or isinstance(err, HostFsError):
                    raise
                refused(fd, name, st, where, err)
                continue
            os.close(fd)
            fd = sub
            idents.append(_ident(st))
            pending.append(names)
            where.names.append(name)
    finally:
        os.close(fd)


def give(top: str, uid: int, gid: int) -> None:
    """Make ``top`` and everything below it owned by ``uid``:``gid`` (symlinks themselves, not targets)."""
    _chown_tree(top, uid, gid)


def take_back(top: str) -> list[str]:
    """Own ``top`` again as this process, clear setuid/setgid bits and remove special files.

    An entry that cannot be taken back (not owned back, a directory that cannot be entered) is removed.
    Returns the paths (relative to ``top``) of what was removed or changed, for the record: the first
    ``MAX_REPORTED``, then how many more.

    Raises:
        OSError: the walk could not go on; part of the tree may still be the sandbox account's (the caller
            removes it).
    """
    changed: list[str] = []
    more = 0
    if not os.path.isdir(top) or os.path.islink(top):
        return changed
    uid, gid = os.getuid(), os.getgid()
    os.chown(top, uid, gid, follow_symlinks=False)

    def record(what: str) -> None:
        nonlocal more
        if len(changed) < MAX_REPORTED:
            changed.append(what)
        else:
            more += 1

    def visit(dfd: int, name: str, st: os.stat_result, where: _Where) -> bool:
        mode = st.st_mode
        if not (stat.S_ISLNK(mode) or stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
                record(where.path(name))
            return False
        try:
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
            if mode & _PRIVILEGE_BITS and not stat.S_ISLNK(mode):
                _clear_privilege_bits(dfd, name, mode)
                record(where.path(name))
        except FileNotFoundError:
            return False
        except OSError as err:
            refused(dfd, name, st, where, err)
            return False
        return True

    def refused(dfd: int, name: str, st: os.stat_result, where: _Where, err: OSError) -> None:
        _remove_at(dfd, name, st)
        record(f"{where.path(name)} (removed, could not be taken back: {err.strerror or err})")

    _walk(os.open(top, DIR_FLAGS), visit, refused=refused)
    if more:
        changed.append(f"… and {more} more")
    return changed


def remove_tree(top: str) -> None:
    """Remove ``top`` and everything below it, however deep or long its paths (``shutil.rmtree`` recurses).

    A symlink ``top`` is removed itself, never followed; a ``top`` already gone is fine.

    Raises:
        OSError: something could not be removed.
    """
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(top)
        return
    parent, name = os.path.split(os.path.abspath(top))
    dfd = os.open(parent, DIR_FLAGS)
    try:
        _remove_at(dfd, name, st, quiet=False)
    finally:
        os.close(dfd)


def _remove_at(dfd: int, name: str, st: os.stat_result, *, quiet: bool = True) -> None:
    """Remove the entry ``name`` below ``dfd`` (a directory with all it holds); errors raise unless ``quiet``."""

    def unlocked(dfd: int, name: str, st: os.stat_result) -> None:
        if stat.S_IMODE(st.st_mode) & stat.S_IRWXU != stat.S_IRWXU:  # entries go only from a writable one
            os.chmod(name, stat.S_IMODE(st.st_mode) | stat.S_IRWXU, dir_fd=dfd)

    def visit(dfd: int, name: str, st: os.stat_result, where: _Where) -> bool:
        if stat.S_ISDIR(st.st_mode):
            unlocked(dfd, name, st)
            return True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)
        return False

    def leave(dfd: int, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=dfd)

    try:
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dfd)
            return
        unlocked(dfd, name, st)
        _walk(_open_dir(dfd, name, st), visit, leave)
        os.rmdir(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except OSError:
        if not quiet:
            raise


def _clear_privilege_bits(dfd: int, name: str, mode: int) -> None:
    # No lchmod on Linux: open without following (the sandbox is gone, so nothing can swap the entry).
    flags = FILE_FLAGS | (os.O_DIRECTORY if stat.S_ISDIR(mode) else 0)
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)  # a regular file we cannot open is removed rather than left setuid
        return
    try:
        os.fchmod(fd, stat.S_IMODE(mode) & ~_PRIVILEGE_BITS)
    finally:
        os.close(fd)


def _chown_tree(top: str, uid: int, gid: int) -> None:
    if os.path.islink(top) or not os.path.isdir(top):
        return
    os.chown(top, uid, gid, follow_symlinks=False)

    def visit(dfd: int, name: str, st: os.stat_result, where: _Where) -> bool:
        with contextlib.suppress(FileNotFoundError):
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
        return True

    _walk(os.open(top, DIR_FLAGS), visit)
