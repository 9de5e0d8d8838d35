"""Workspace preparation and diff collection, control-plane side.

The agent's tree is data, never a repository. Git is never pointed at it: this module walks the tree
itself (``lstat``, never following a link), writes every file, symlink and directory as a git object
into a bare baseline repository that lives outside the sandbox, and only then asks git to compare two
trees. So nothing the agent can write changes what the diff shows or makes git run anything:

- ``.git`` directories and files (nested repositories, ``gitdir:`` links, hooks, configs, excludes)
  are ordinary entries and show up in the patch like any other file;
- ``.gitignore`` and ``.gitattributes`` are ordinary files: there is no work tree or index for git to
  apply them to, and attributes are pinned to the empty tree and ``/dev/null`` besides;
- symlinks are recorded as links (their target is the content), FIFOs, sockets and devices as a one-line
  placeholder, files over ``MAX_BLOB_BYTES`` as their size and sha256, files over ``MAX_HASH_BYTES`` as
  their size and allocated size, never read.

Nothing the agent leaves can make a collection unbounded: a :class:`Budget` caps what one file and one
collection read and how long a collection runs (what is left after that is noted, and the diff says it was
cut); collections run on a small executor of their own (never the default one the rest of the worker's
threads share), report progress for heartbeats and stop between files and chunks once cancelled.

The same walk records the baseline in ``prepare``, so a source tree with ignored files or nested
repositories is baselined whole. It also writes a manifest (mode, size, sha256 per path) that lets
``listing`` say what changed without git when the diff itself cannot be produced.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import ipaddress
import json
import os
import re
import shutil
import stat
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from integrations.urls import AdmittedUrl, UrlPolicy, UrlRefused, same_origin_path

T = TypeVar("T")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fluidbox",
    "GIT_AUTHOR_EMAIL": "fluidbox@localhost",
    "GIT_COMMITTER_NAME": "fluidbox",
    "GIT_COMMITTER_EMAIL": "fluidbox@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_TERMINAL_PROMPT": "0",
}
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
# Belt and braces: the repository is bare and never sees the agent's tree, but no attribute, hook,
# external diff or textconv may apply even if a future git reads attributes from HEAD in bare repos.
GIT_OPTS = (
    "-c", "safe.directory=*",
    "-c", "core.attributesFile=/dev/null",
    "-c", f"attr.tree={EMPTY_TREE}",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.quotePath=true",
    "-c", "commit.gpgsign=false",
)  # fmt: skip
MIB = 1024 * 1024
MAX_DIFF_BYTES = 1024 * 1024
MAX_BLOB_BYTES = 16 * MIB
# A file larger than this is noted by its size and allocated size and never read (``truncate -s 15T``
# costs the agent nothing and would cost a full read here); baseline and diff apply the same cap.
MAX_HASH_BYTES = 1024 * MIB
# What one collection (a diff, a listing) reads in all, and how long it may take from when it is asked
# for (waiting for a collector thread included); past either, the rest is noted and the diff says so.
# Stored blobs cost about 20-45 ms per MB (zlib), hashed-only files about 1 (bench/collector.py): the
# byte budget alone keeps a collection of real data well inside the time budget.
MAX_READ_BYTES = 2 * 1024 * MIB
COLLECT_SECS = 120.0
# Collections run here, never on the event loop's default executor, which every asyncio.to_thread of the
# worker shares: a burst of pathological runs queues behind these threads and starves nothing else.
COLLECTOR_THREADS = 4
BEAT_SECS = 5.0  # how often a waiting collection reports its progress (for the activity's heartbeat)
GIT_MIN_SECS = 30.0  # what git diff-tree gets at least, whatever the walk left of the time budget
CHUNK = MIB
MANIFEST = "baseline.manifest.json"
TREE_MODE = b"40000"
MAX_DEPTH = 200
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SPECIAL = {stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "char device", stat.S_IFBLK: "block device"}


class WorkspaceError(Exception):
    pass


class _Cancelled(Exception):
    """The collection was cancelled: the thread walking it ends at the next file or chunk."""


@dataclass
class Budget:
    """What one walk may read (per file, in all) and until when, and what it has done so far.

    Shared with the thread that walks: the event loop reads the counters for heartbeats and sets ``stop``
    when the collection is cancelled; the walk looks at both between files and between chunks.
    """

    file_bytes: int = MAX_HASH_BYTES
    total_bytes: int | None = None
    secs: float | None = None
    started: float = field(default_factory=time.monotonic)
    stop: threading.Event = field(default_factory=threading.Event)
    entries: int = 0
    read: int = 0
    cut: str | None = None  # why the walk stopped reading (None: it read everything it could)

    @classmethod
    def collection(cls, secs: float = COLLECT_SECS, total_bytes: int = MAX_READ_BYTES) -> Budget:
        """A diff's or a listing's budget, counted from now."""
        return cls(total_bytes=total_bytes, secs=secs)

    def remaining(self) -> float | None:
        return None if self.secs is None else self.secs - (time.monotonic() - self.started)

    def spent(self) -> str | None:
        """Why the walk must read nothing more (None: go on).

        Raises:
            _Cancelled: the collection was cancelled.
        """
        if self.stop.is_set():
            raise _Cancelled()
        left = self.remaining()
        if self.cut is None and left is not None and left <= 0:
            self.cut = f"its {self.secs:g}s time budget was spent"
        return self.cut

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes of the total; False (and the walk is cut) when they are not there."""
        if self.total_bytes is not None and self.read + size > self.total_bytes:
            self.cut = f"its {self.total_bytes}-byte read budget was spent"
            return False
        self.read += size
        return True

    def progress(self) -> dict[str, object]:
        return {"entries": self.entries, "bytes_read": self.read, "cut": self.cut}


@dataclass(frozen=True)
class Leaf:
    """One non-directory entry of a walked tree, as it will be stored and listed."""

    path: bytes  # relative, ``/``-separated, raw bytes from the file system
    mode: bytes  # git mode: 100644, 100755 or 120000
    data: bytes  # what the blob holds (the content, a link target or a placeholder)
    size: int  # the entry's real size
    sha256: str  # of the real content (or link target)


async def _git(
    baseline: Path, *args: str, limit: int | None = None, timeout: float | None = None
) -> tuple[bytes, bool]:
    """Run git on the bare baseline only; with ``limit``, stop reading (and kill git) past that many bytes,
    with ``timeout``, after that many seconds (what was read by then is returned, as cut)."""
    proc = await asyncio.create_subprocess_exec(
        "git",
        f"--git-dir={baseline}",
        *GIT_OPTS,
        *args,
        cwd=baseline,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GIT_ENV},
    )
    assert proc.stdout is not None and proc.stderr is not None
    err_task = asyncio.ensure_future(proc.stderr.read())
    chunks: list[bytes] = []
    got, cut = 0, False
    try:
        async with asyncio.timeout(timeout):
            while chunk := await proc.stdout.read(1024 * 1024):
                chunks.append(chunk)
                got += len(chunk)
                if limit is not None and got > limit:  # bounded memory whatever the agent wrote
                    cut = True
                    proc.kill()
                    break
    except TimeoutError:
        cut = True
        proc.kill()
    except asyncio.CancelledError:
        proc.kill()
        err_task.cancel()
        raise
    err = await err_task
    out = b"".join(chunks)
    code = await proc.wait()
    if code != 0 and not cut:
        raise WorkspaceError(f"git {args[0]} failed: {err.decode(errors='replace').strip()[:500]}")
    return out, cut


def _readable(dfd: int, name: bytes, st: os.stat_result, bits: int) -> None:
    """Give the owner ``bits`` back on an entry the agent locked (the sandbox is gone; the tree is ours)."""
    os.chmod(name, stat.S_IMODE(st.st_mode) | bits, dir_fd=dfd)


def _open_at(dfd: int, name: bytes, st: os.stat_result, flags: int, bits: int) -> int:
    try:
        return os.open(name, flags, dir_fd=dfd)
    except PermissionError:
        _readable(dfd, name, st, bits)
        return os.open(name, flags, dir_fd=dfd)


def _open(dfd: int, name: bytes, st: os.stat_result) -> BinaryIO:
    """Open a regular file for reading: never through a link, never blocking (on a FIFO swapped in)."""
    return os.fdopen(_open_at(dfd, name, st, FILE_FLAGS, stat.S_IRUSR), "rb")


def _note(path: bytes, text: str) -> Leaf:
    data = f"(fluidbox: {text})\n".encode()
    return Leaf(path, b"100644", data, 0, hashlib.sha256(data).hexdigest())


def _unread(path: bytes, text: str, mode: bytes = b"100644", size: int = 0) -> Leaf:
    """An entry recorded without reading it: no digest (``listing`` never calls it unchanged)."""
    return Leaf(path, mode, f"(fluidbox: {text})\n".encode(), size, "")


def _cut(path: bytes, budget: Budget) -> Leaf:
    return _unread(path, f"not collected: the collection stopped early ({budget.cut}); not compared")


def _leaf(dfd: int, name: bytes, path: bytes, st: os.stat_result, budget: Budget) -> Leaf:
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=dfd)
        return Leaf(path, b"120000", target, len(target), hashlib.sha256(target).hexdigest())
    if not stat.S_ISREG(st.st_mode):
        return _note(path, f"not a regular file: {SPECIAL.get(stat.S_IFMT(st.st_mode), 'unknown type')}")
    mode = b"100755" if st.st_mode & stat.S_IXUSR else b"100644"
    if st.st_size > budget.file_bytes:
        # Reading costs st_size whatever is allocated (holes read as zeros); the allocated size tells a
        # sparse file from a real one. Both are in the note, so changing either shows in the diff.
        text = (
            f"file not read: {st.st_size} bytes ({st.st_blocks * 512} allocated),"
            f" over the {budget.file_bytes}-byte limit per file; not hashed"
        )
        return _unread(path, text, mode, st.st_size)
    if not budget.take(st.st_size):
        return _cut(path, budget)
    with _open(dfd, name, st) as fh:
        if st.st_size <= MAX_BLOB_BYTES:
            data = fh.read(MAX_BLOB_BYTES + 1)
            return Leaf(path, mode, data, len(data), hashlib.sha256(data).hexdigest())
        h = hashlib.sha256()
        while chunk := fh.read(CHUNK):
            if budget.spent():
                return _cut(path, budget)
            h.update(chunk)
    big = f"(fluidbox: file not diffed, too large: {st.st_size} bytes, sha256 {h.hexdigest()})\n"
    return Leaf(path, mode, big.encode(), st.st_size, h.hexdigest())


def _children(dfd: int, rel: bytes, depth: int, budget: Budget) -> Iterator[Leaf]:
    """Every non-directory entry below the open directory ``dfd``; what cannot be read becomes a note.

    Every call is relative to a directory descriptor, so no path is ever resolved through a link and
    no path length limit applies; depth is bounded so a pathological tree cannot exhaust descriptors.
    Once ``budget`` is spent, every entry left in the directories already listed is noted without even
    an ``lstat`` (a directory among them as one entry): what is left costs no more than its names.
    """
    try:
        names = sorted(os.fsencode(n) for n in os.listdir(dfd))
    except OSError as err:
        if not rel:
            raise WorkspaceError(f"the workspace is not readable: {err.strerror or err}") from err
        yield _note(rel, f"directory not readable: {err.strerror or err}")
        return
    for name in names:
        path = rel + b"/" + name if rel else name
        if budget.spent():
            yield _cut(path, budget)
            continue
        budget.entries += 1
        try:
            st = os.lstat(name, dir_fd=dfd)
            if not stat.S_ISDIR(st.st_mode):
                yield _leaf(dfd, name, path, st, budget)
                continue
            if depth >= MAX_DEPTH:
                yield _note(path, f"directory not walked: deeper than {MAX_DEPTH} levels")
                continue
            sub = _open_at(dfd, name, st, DIR_FLAGS, stat.S_IRWXU)
        except OSError as err:
            yield _note(path, f"not readable: {err.strerror or err}")
            continue
        try:
            yield from _children(sub, path, depth + 1, budget)
        finally:
            os.close(sub)


def _walk(root: Path, budget: Budget) -> Iterator[Leaf]:
    """Every non-directory entry under ``root``, depth first, links never followed."""
    try:
        fd = os.open(root, DIR_FLAGS)  # O_NOFOLLOW: a root swapped for a link is refused
    except OSError as err:
        raise WorkspaceError(f"the workspace is not a readable directory: {err.strerror or err}") from err
    try:
        yield from _children(fd, b"", 1, budget)
    finally:
        os.close(fd)


def _store(objects: Path, kind: bytes, body: bytes) -> bytes:
    """Write one loose object (the format git reads) and return its binary id."""
    raw = kind + b" " + str(len(body)).encode() + b"\0" + body
    oid = hashlib.sha1(raw, usedforsecurity=False).digest()
    name = oid.hex()
    path = objects / name[:2] / name[2:]
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        tmp = path.parent / f"tmp_{name[2:]}_{os.urandom(8).hex()}"  # a retried collection may race this one
        tmp.write_bytes(zlib.compress(raw, 1))
        os.replace(tmp, path)
    return oid


Node = dict[bytes, "Node | tuple[bytes, bytes]"]


def _store_tree(objects: Path, node: Node) -> bytes:
    entries: list[tuple[bytes, bytes, bytes]] = []
    for name, child in node.items():
        if isinstance(child, dict):
            entries.append((TREE_MODE, name, _store_tree(objects, child)))
        else:
            entries.append((child[0], name, child[1]))
    # Git's order: names as bytes, a directory compared as if its name ended in "/".
    entries.sort(key=lambda e: e[1] + b"/" if e[0] == TREE_MODE else e[1])
    return _store(objects, b"tree", b"".join(mode + b" " + name + b"\0" + oid for mode, name, oid in entries))


def _snapshot(worktree: Path, baseline: Path, budget: Budget) -> tuple[str, dict[str, list[object]]]:
    """Store the tree under ``worktree`` as git objects; its tree id and a manifest of every entry."""
    objects = baseline / "objects"
    root: Node = {}
    manifest: dict[str, list[object]] = {}
    for leaf in _walk(worktree, budget):
        *dirs, name = leaf.path.split(b"/")
        node = root
        for part in dirs:
            node = node.setdefault(part, {})  # type: ignore[assignment]
        node[name] = (leaf.mode, _store(objects, b"blob", leaf.data))
        manifest[os.fsdecode(leaf.path)] = [leaf.mode.decode(), leaf.size, leaf.sha256]
    return _store_tree(objects, root).hex(), manifest


def _copy(source: Path | None, dest: Path, baseline: Path) -> None:
    if source is not None and (not source.is_absolute() or not source.is_dir()):
        raise WorkspaceError(f"workspace path {source} is not an existing absolute directory")
    for stale in (dest, baseline):  # a retried preparation starts over
        if stale.exists():
            shutil.rmtree(stale)
    baseline.mkdir(parents=True)
    if source is not None:
        shutil.copytree(source, dest, symlinks=True)
    else:
        dest.mkdir(parents=True)
    dest.chmod(0o755)


BASELINE_BRANCH = b"refs/heads/baseline"
BASELINE_CONFIG = b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n"


def _init_bare(baseline: Path) -> None:
    """The smallest bare repository git reads: ``HEAD``, ``config``, ``objects/`` and ``refs/``.

    Written directly rather than by ``git init``, which would copy its hook templates too: a run's start
    spawns no git process at all (``diff`` is the first, at the end of the run)."""
    for sub in ("objects", "refs/heads", "refs/tags"):
        (baseline / sub).mkdir(parents=True, exist_ok=True)
    (baseline / "config").write_bytes(BASELINE_CONFIG)
    (baseline / "HEAD").write_bytes(b"ref: " + BASELINE_BRANCH + b"\n")


def _commit(baseline: Path, tree: str) -> str:
    """Store the baseline commit of ``tree`` (fluidbox as author and committer, now) and point HEAD at it."""
    who = f"{GIT_ENV['GIT_AUTHOR_NAME']} <{GIT_ENV['GIT_AUTHOR_EMAIL']}> {int(time.time())} +0000".encode()
    body = b"tree " + tree.encode() + b"\nauthor " + who + b"\ncommitter " + who + b"\n\nfluidbox baseline\n"
    commit = _store(baseline / "objects", b"commit", body).hex()
    ref = baseline / os.fsdecode(BASELINE_BRANCH)
    tmp = ref.with_name(f".{ref.name}.{os.urandom(4).hex()}")
    tmp.write_text(commit + "\n")
    os.replace(tmp, ref)
    return commit


def _baseline(worktree: Path, baseline: Path, run_dir: Path) -> tuple[str, int]:
    _init_bare(baseline)
    try:
        # The control plane's own copy: only the per-file cap applies (the diff applies the same one).
        tree, manifest = _snapshot(worktree, baseline, Budget())
    except (OSError, RecursionError) as err:
        raise WorkspaceError(f"cannot read the workspace copy: {err}") from err
    (run_dir / MANIFEST).write_text(json.dumps(manifest))
    return _commit(baseline, tree), len(manifest)


async def prepare(run_dir: Path, source: str | None) -> tuple[str, int]:
    """Copy ``source`` (or nothing, for scratch) into ``run_dir/workspace`` and commit a baseline of all of it.

    One thread hop, no process: the bare repository, its objects, the commit and its ref are written here."""
    worktree, baseline = run_dir / "workspace", run_dir / "baseline.git"

    def work() -> tuple[str, int]:
        _copy(Path(source) if source else None, worktree, baseline)
        return _baseline(worktree, baseline, run_dir)

    return await asyncio.to_thread(work)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _collector() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(COLLECTOR_THREADS, thread_name_prefix="fluidbox-collector")
        return _pool


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a cancelled collection's _Cancelled is expected: not "never retrieved"


Beat = Callable[[dict[str, object]], None]


async def _collect(job: Callable[[], T], budget: Budget, beat: Beat | None) -> T:
    """Run ``job`` on the collector's executor, reporting ``budget.progress()`` to ``beat`` every ``BEAT_SECS``.

    A thread cannot be interrupted: cancelling this sets ``budget.stop``, and the walk ends at its next
    file or chunk instead of going on for as long as the agent's tree would make it."""
    future = asyncio.get_running_loop().run_in_executor(_collector(), job)
    future.add_done_callback(_retrieve)
    try:
        while True:
            if beat is not None:
                beat(budget.progress())
            done, _ = await asyncio.wait({future}, timeout=BEAT_SECS)
            if done:
                return future.result()
    except asyncio.CancelledError:
        budget.stop.set()
        raise


async def diff(run_dir: Path, budget: Budget | None = None, beat: Beat | None = None) -> tuple[str, bool]:
    """The workspace's changes against the baseline as a binary-safe patch, and whether it was cut.

    Bounded by ``budget`` (default :meth:`Budget.collection`); a walk it cut says so on the patch's first
    line, and every entry it did not reach is in the patch as a note."""
    worktree, baseline = run_dir / "workspace", run_dir / "baseline.git"
    budget = budget if budget is not None else Budget.collection()

    def snapshot() -> str:
        if not ((baseline / "objects").is_dir() and worktree.is_dir()):
            raise WorkspaceError("workspace is gone")
        return _snapshot(worktree, baseline, budget)[0]

    try:
        tree = await _collect(snapshot, budget, beat)
        left = budget.remaining()
        out, cut = await _git(
            baseline,
            "diff-tree", "-r", "-p", "--binary", "--no-renames", "--no-textconv", "--no-ext-diff", "--no-color",
            "HEAD", tree,
            limit=MAX_DIFF_BYTES,
            timeout=None if left is None else max(left, GIT_MIN_SECS),
        )  # fmt: skip
    except (OSError, RecursionError) as err:
        raise WorkspaceError(f"cannot read the workspace: {err}") from err
    patch = out[:MAX_DIFF_BYTES].decode(errors="replace" if not cut else "ignore")
    if budget.cut:
        patch = f"# fluidbox: the collection stopped early ({budget.cut}); what it did not reach is noted\n" + patch
    if cut:
        return patch + "\n(diff truncated)\n", True
    return patch, budget.cut is not None


def _show(path: str) -> str:
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return text if text.isprintable() and not text.startswith('"') else json.dumps(text)


def _listing(run_dir: Path, budget: Budget) -> str:
    try:
        before: dict[str, list[object]] = json.loads((run_dir / MANIFEST).read_text())
        header = "# files against the baseline manifest (state, mode, size, sha256, path)"
    except (OSError, ValueError) as err:
        before, header = {}, f"# no baseline manifest ({err}); every file listed (state, mode, size, sha256, path)"
    lines = [header]
    seen: set[str] = set()
    try:
        for leaf in _walk(run_dir / "workspace", budget):
            path = os.fsdecode(leaf.path)
            seen.add(path)
            now = [leaf.mode.decode(), leaf.size, leaf.sha256]
            old = before.get(path)
            state = "present" if not before else "added" if old is None else "unchanged" if old == now else "modified"
            if not leaf.sha256:
                state = "unread"  # never "unchanged": nothing was compared
            if state != "unchanged":
                lines.append(f"{state:<9} {now[0]} {leaf.size:>12} {leaf.sha256 or '-':<64} {_show(path)}")
    except (OSError, WorkspaceError) as err:
        lines.append(f"(walk stopped: {err})")
    if budget.cut:
        lines.insert(
            1, f"# the walk stopped early ({budget.cut}): what it did not reach is unread, what was below that unseen"
        )
    gone = "deleted" if budget.cut is None else "unseen"  # below a directory the walk did not reach, maybe
    for path in sorted(set(before) - seen):
        mode, size, digest = before[path]
        lines.append(f"{gone:<9} {mode} {size:>12} {digest or '-':<64} {_show(path)}")
    return "\n".join(lines) + "\n"


async def listing(run_dir: Path, budget: Budget | None = None, beat: Beat | None = None) -> str:
    """What changed in the workspace, found without git: for review when no diff could be produced.

    Bounded like :func:`diff` (a budget of its own by default)."""
    budget = budget if budget is not None else Budget.collection()
    return await _collect(lambda: _listing(run_dir, budget), budget, beat)


# ---- archives: the workspace over the runner plane (sandboxes that do not share this disk) ----------


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Ownership is the extractor's, never ours; special files do not travel (the walk notes them)."""
    if not (info.isfile() or info.isdir() or info.issym()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(tree: Path, max_bytes: int) -> bytes:
    """``tree`` as a gzip'd tar (links kept as links, never followed).

    Raises:
        WorkspaceError: the archive is larger than ``max_bytes``.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(os.listdir(tree)):
            tar.add(tree / entry, arcname=entry, recursive=True, filter=_normalized)
    data = buf.getvalue()
    if len(data) > max_bytes:
        raise WorkspaceError(f"the workspace archive is {len(data)} bytes, over the {max_bytes}-byte limit")
    return data


def unpack(data: bytes, dest: Path, max_expanded: int) -> list[str]:
    """Extract a gzip'd tar into ``dest`` (created empty) under tarfile's ``data`` filter: nothing lands
    outside ``dest``, no link points out of it, no device, setuid bit or foreign owner survives.
    Members the filter refuses are skipped and returned (``path: why``), so a sandbox that planted
    one cannot make the whole state unreadable.

    Raises:
        WorkspaceError: not a gzip'd tar, or it expands to more than ``max_expanded`` bytes.
    """
    skipped: list[str] = []

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        try:
            return tarfile.data_filter(member, path)
        except tarfile.FilterError as err:
            skipped.append(f"{member.name}: {err}")
            return None

    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = tar.getmembers()
            if sum(m.size for m in members) > max_expanded:
                raise WorkspaceError(f"the workspace archive expands past {max_expanded} bytes")
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            tar.extractall(dest, members=members, filter=keep)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise WorkspaceError(f"the workspace archive cannot be read: {err}") from err
    return skipped


# ---- git_repository: a repository fetched control-plane side ------------------------------------

CLONE_TIMEOUT_SECS = 300.0
# Only these transports: ext::, ssh and the git protocol could run commands or reach anywhere.
CLONE_OPTS = (
    "-c", "protocol.allow=never",
    "-c", "protocol.https.allow=always",
    "-c", "protocol.file.allow=always",
    "-c", "core.hooksPath=/dev/null",
    "-c", "credential.helper=",
)  # fmt: skip


@dataclass(frozen=True)
class GitAuth:
    """How to authenticate one clone: ``Basic`` (``user:token``) or ``Bearer``. Never stored, logged or shown:
    :func:`clone` hands it to git as an ``Authorization`` header through the environment of git alone."""

    scheme: str
    secret: str = field(repr=False)

    def header(self) -> str:
        value = base64.b64encode(self.secret.encode()).decode() if self.scheme == "Basic" else self.secret
        return f"Authorization: {self.scheme} {value}"


def _pinned_config(admitted: AdmittedUrl | None, auth: GitAuth | None) -> list[tuple[str, str]]:
    """The configuration every clone gets through the environment: redirects never followed, and for an
    http(s) URL its host pinned to the addresses admission vetted.

    ``http.curloptResolve`` (curl's ``CURLOPT_RESOLVE``, ``host:port:addr[,addr]``; an IPv6 address in
    brackets) seeds curl's name cache, so git connects to exactly those addresses and never asks DNS again:
    a resolver that answered a public address for the admission cannot answer ``127.0.0.1`` or the metadata
    address for the clone. The entry matches the name case-insensitively but spells a trailing dot as
    written, so the name goes in both with and without one. An IP literal host is never resolved at all."""
    pairs: list[tuple[str, str]] = [("http.followRedirects", "false")]
    if admitted is not None and not _is_ip_literal(admitted.host):
        addrs = ",".join(f"[{a}]" if a.version == 6 else str(a) for a in admitted.addresses)
        for name in dict.fromkeys((admitted.host, admitted.host.rstrip("."))):
            pairs.append(("http.curloptResolve", f"{name}:{admitted.port}:{addrs}"))
    if auth is not None:
        pairs.append(("http.extraHeader", auth.header()))
    return pairs


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _config_env(pairs: list[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


async def fetch(url: str, ref: str | None, dest: Path, policy: UrlPolicy, auth: GitAuth | None = None) -> str:
    """Admit ``url`` under ``policy`` (an http(s) one must resolve to addresses it permits), then :func:`clone`
    it pinned to what admission saw; returns the commit.

    Raises:
        WorkspaceError: the URL is refused (naming why), or the clone failed.
    """
    admitted = None
    if url.startswith(("https:", "http:")):
        try:
            admitted = await policy.admit(url)
        except UrlRefused as err:
            raise WorkspaceError(f"repository URL refused: {err.reason}") from None
    return await clone(url, ref, dest, auth, admitted)


async def clone(
    url: str, ref: str | None, dest: Path, auth: GitAuth | None = None, admitted: AdmittedUrl | None = None
) -> str:
    """A shallow clone of ``url`` (at ``ref``) into ``dest`` as a plain tree (its ``.git`` removed: the
    agent gets files, and the baseline is the control plane's own); returns the commit it was.

    An http(s) ``url`` is cloned only with its admission (``admitted``, see :func:`fetch`): git connects to the
    admitted addresses alone and follows no redirect, with or without a credential, so neither a second DNS
    answer nor a ``302`` can send the clone anywhere admission did not vet.

    With ``auth``, the header reaches git only through ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``VALUE_n`` in
    the environment of this git process: not its argv (other users could read that), not a file, not the clone's
    ``.git/config``.

    Raises:
        WorkspaceError: the clone failed (the remote refusing the credential or redirecting says so) or took
            longer than ``CLONE_TIMEOUT_SECS``. Messages name the repository, never the credential.
    """
    if url.startswith(("https:", "http:")) and (admitted is None or not same_origin_path(admitted, url)):
        raise WorkspaceError(f"cannot clone {url}: an http(s) repository is cloned only pinned to its admission")
    await asyncio.to_thread(shutil.rmtree, dest, True)  # a retried provisioning starts over
    opts = list(CLONE_OPTS)
    if url.startswith("http:"):
        opts += ["-c", "protocol.http.allow=always"]  # a loopback test server only (checked before this)
    args = ["git", *GIT_OPTS, *opts, "clone", "--quiet", "--depth", "1", "--no-tags", "--single-branch"]
    if ref:
        args += ["--branch", ref]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GIT_ENV}
    clone_env = {**env, **_config_env(_pinned_config(admitted, auth))}
    proc = await asyncio.create_subprocess_exec(
        *args, "--", url, str(dest), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clone_env,
    )  # fmt: skip
    try:
        async with asyncio.timeout(CLONE_TIMEOUT_SECS):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise WorkspaceError(f"cloning {url} took longer than {CLONE_TIMEOUT_SECS:g}s") from None
    if proc.returncode != 0:
        text = err.decode(errors="replace")
        if auth is not None:
            text = text.replace(auth.secret, "[redacted]").replace(auth.header(), "[redacted]")
        if AUTH_REFUSED.search(text):
            given = "the remote refused the stored credential" if auth else "it needs a credential"
            raise WorkspaceError(f"cannot clone {url}: {given} (authentication failed)")
        if redirect := REDIRECTED.search(text):
            raise WorkspaceError(
                f"cannot clone {url}: the server answered with a redirect (HTTP {redirect.group(1)}), which is "
                "never followed; give the repository's final URL"
            )
        raise WorkspaceError(f"cannot clone {url}: {text.strip()[:300]}")
    head = await asyncio.create_subprocess_exec(
        "git", f"--git-dir={dest / '.git'}", *GIT_OPTS, "rev-parse", "HEAD",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    out, _ = await head.communicate()
    await asyncio.to_thread(shutil.rmtree, dest / ".git")
    return out.decode().strip()


# With ``http.followRedirects=false`` git reports a 3xx answer as an error status.
REDIRECTED = re.compile(r"The requested URL returned error: (3\d\d)")
# What git prints when the server answers 401/403 (with prompting off it cannot ask for anything else).
AUTH_REFUSED = re.compile(
    r"Authentication failed|could not read Username|could not read Password|terminal prompts disabled"
    r"|The requested URL returned error: 40[13]",
    re.IGNORECASE,
)
