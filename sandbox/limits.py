"""Memory and process limits for a sandbox, through a cgroup of its own.

Where this process may make cgroups depends on the host, and is decided per controller:

* cgroup v1 (or the v1 half of a hybrid host): each controller has a hierarchy of its own, mounted
  somewhere (``/sys/fs/cgroup/memory``…). A sandbox's cgroup nests under this process's own cgroup in
  that hierarchy, ``<mount>/<own path>/fluidbox/<name>``, so it also stays inside whatever limits the
  process itself runs under.
* cgroup v2: one hierarchy, where a controller reaches a child only once its parent lists it in
  ``cgroup.subtree_control``, and a cgroup that hands controllers to children may hold no process itself
  (the root excepted). ``<own>/fluidbox`` holds no process, so it enables them for the sandboxes; ``<own>``
  must already hand them down, or accept the write (the root, or a cgroup with no process of its own):
  this process never moves itself to make room.

A v1 hierarchy with the controller wins over cgroup v2: on a hybrid host the controller can only be live
in one of them. The parsers (``parse_mountinfo``, ``parse_proc_cgroup``, ``cgroup_dir``) are pure; the
rest touches ``/sys/fs/cgroup`` and never raises for a missing controller, it reports why instead.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

CONTROLLERS = ("memory", "pids")
PARENT = "fluidbox"
MIB = 1024 * 1024

_NAME = re.compile(r"[A-Za-z0-9-]{1,100}")
_SUFFIX_LEN = 8
_REMOVE_WAIT_SECS = 5.0
_POLL_SECS = 0.01
# Mount options of a v1 hierarchy that are not controllers (those with "=" are skipped as well).
_V1_OPTIONS = frozenset({"rw", "ro", "xattr", "noprefix", "clone_children", "cpuset_v2_mode", "favordynmods"})

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What a sandbox may use; None leaves that resource unlimited."""

    memory_bytes: int | None = None
    pids: int | None = None

    def wanted(self) -> dict[str, str]:
        """Controller → how its limit reads in a handle (``memory=2048MiB``), for the limits that are set."""
        out: dict[str, str] = {}
        if self.memory_bytes is not None:
            mem = self.memory_bytes
            out["memory"] = f"memory={mem // MIB}MiB" if mem % MIB == 0 else f"memory={mem}B"
        if self.pids is not None:
            out["pids"] = f"pids={self.pids}"
        return out


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup filesystem mount, from ``/proc/self/mountinfo``."""

    mount_point: str
    root: str  # the cgroup of the hierarchy that this mount shows at mount_point
    version: int  # 1 or 2
    controllers: frozenset[str]  # v1: the controllers of this hierarchy; v2: empty (see cgroup.controllers)
    read_only: bool


@dataclass(frozen=True)
class OwnCgroups:
    """This process's cgroups, from ``/proc/self/cgroup``: per v1 controller, and its cgroup v2 path."""

    v1: dict[str, str] = field(default_factory=dict)
    unified: str | None = None


@dataclass(frozen=True)
class Placement:
    """Where the cgroups of sandboxes go for one controller."""

    controller: str
    version: int
    base: str  # this process's own cgroup directory; sandboxes go under <base>/fluidbox

    @property
    def parent(self) -> str:
        return os.path.join(self.base, PARENT)


@dataclass(frozen=True)
class Prepared:
    """The outcome of ``CgroupLimiter.prepare``."""

    dirs: tuple[str, ...] = ()  # the cgroups created for the sandbox (remove them with remove_dirs)
    procs: tuple[str, ...] = ()  # the cgroup.procs files the sandbox must join
    applied: tuple[str, ...] = ()  # e.g. ("memory=2048MiB", "pids=512")
    missing: dict[str, str] = field(default_factory=dict)  # controller → why its limit is not applied


def _unescape(value: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """Every cgroup (v1) and cgroup2 mount listed in a ``/proc/<pid>/mountinfo`` text, in order."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        fstype, super_options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        if fstype not in ("cgroup", "cgroup2"):
            continue
        options = set(fields[5].split(","))
        controllers = (
            frozenset(opt for opt in super_options.split(",") if fstype == "cgroup" and opt and "=" not in opt)
            - _V1_OPTIONS
        )
        mounts.append(
            CgroupMount(
                mount_point=_unescape(fields[4]),
                root=_unescape(fields[3]),
                version=2 if fstype == "cgroup2" else 1,
                controllers=controllers,
                read_only="ro" in options,
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> OwnCgroups:
    """The cgroups listed in a ``/proc/<pid>/cgroup`` text (``id:controllers:path`` per line)."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            unified = path
            continue
        for controller in controllers.split(","):
            if controller and not controller.startswith("name="):
                v1[controller] = path
    return OwnCgroups(v1=v1, unified=unified)


def cgroup_dir(mount: CgroupMount, own_path: str) -> str | None:
    """The directory of cgroup ``own_path`` under ``mount``, or None when the mount does not show it.

    A mount may show only a subtree of its hierarchy (a container's bind mount): its ``root`` is then a
    prefix of ``own_path``, or the cgroup is outside it and unreachable through this mount.
    """
    root = mount.root.rstrip("/")
    own = own_path.rstrip("/")
    if own != root and not own.startswith(root + "/"):
        return None
    rest = own[len(root) :].lstrip("/")
    return os.path.normpath(os.path.join(mount.mount_point, rest)) if rest else os.path.normpath(mount.mount_point)


def cgroup_name(run_id: str) -> str:
    """A fresh cgroup name for a sandbox of ``run_id``: the run id made safe, plus a random suffix.

    The suffix keeps a new sandbox for the same run (a retry) out of the previous one's cgroup.
    """
    safe = re.sub(r"[^A-Za-z0-9-]", "-", run_id)[:64]
    if safe != run_id or not safe:
        safe = f"{safe[:48]}-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}".lstrip("-")
    return f"{safe}-{secrets.token_hex(_SUFFIX_LEN // 2)}"


def _same_run(name: str, run_id: str) -> bool:
    """Whether ``name`` came from ``cgroup_name(run_id)``, whatever its suffix."""
    probe = cgroup_name(run_id)
    stem = probe[: -_SUFFIX_LEN - 1]
    suffix = name[-_SUFFIX_LEN:]
    return len(name) == len(probe) and name.startswith(stem + "-") and all(c in "0123456789abcdef" for c in suffix)


def check_name(name: str) -> str:
    """``name`` itself, if it is safe as a cgroup directory name.

    Raises:
        ValueError: anything but 1-100 of [A-Za-z0-9-].
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid cgroup name {name!r}: only letters, digits and '-' are allowed")
    return name


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    # One write(2) per value, without O_TRUNC or buffering: cgroup files take one value per write.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _why(err: OSError) -> str:
    return err.strerror or str(err)


class CgroupLimiter:
    """Creates, configures and removes the cgroups of sandboxes on this host.

    ``mountinfo`` and ``proc_cgroup`` stand in for this process's ``/proc/self/mountinfo`` and
    ``/proc/self/cgroup`` texts: tests use them to describe another host (a cgroup root that does not
    exist, say). What they describe is detected once, on first use.
    """

    def __init__(self, *, mountinfo: str | None = None, proc_cgroup: str | None = None) -> None:
        self._mountinfo = mountinfo
        self._proc_cgroup = proc_cgroup
        self._detected: tuple[dict[str, Placement], dict[str, str]] | None = None

    def detect(self) -> tuple[dict[str, Placement], dict[str, str]]:
        """Per controller, where sandbox cgroups go, and for the others why they cannot be made."""
        if self._detected is None:
            mountinfo = self._mountinfo if self._mountinfo is not None else _read("/proc/self/mountinfo") or ""
            own_text = self._proc_cgroup if self._proc_cgroup is not None else _read("/proc/self/cgroup") or ""
            self._detected = _locate(parse_mountinfo(mountinfo), parse_proc_cgroup(own_text))
        return self._detected

    def prepare(self, name: str, limits: Limits) -> Prepared:
        """Create the cgroups of sandbox ``name`` and write ``limits`` into them.

        Never raises for what the host lacks: ``missing`` says which limits are not applied and why.

        Raises:
            ValueError: ``name`` is not a safe cgroup name.
        """
        check_name(name)
        wanted = limits.wanted()
        placements, unavailable = self.detect()
        missing = {c: unavailable[c] for c in wanted if c in unavailable}
        groups: dict[str, list[Placement]] = {}
        for controller in wanted:
            if controller in placements:
                placement = placements[controller]
                groups.setdefault(placement.base, []).append(placement)
        dirs: list[str] = []
        procs: list[str] = []
        applied: list[str] = []
        for group in groups.values():
            try:
                leaf = _make_leaf(group, name)
            except OSError as err:
                for placement in group:
                    missing[placement.controller] = f"cannot create a cgroup under {placement.parent}: {_why(err)}"
                continue
            dirs.append(leaf)
            live = False
            for placement in group:
                try:
                    _set_limit(leaf, placement, limits)
                except OSError as err:
                    missing[placement.controller] = f"cannot set its limit in {leaf}: {_why(err)}"
                else:
                    applied.append(wanted[placement.controller])
                    live = True
            if live:
                procs.append(os.path.join(leaf, "cgroup.procs"))
            else:
                remove_dirs([leaf], wait_secs=0)
                dirs.remove(leaf)
        return Prepared(tuple(dirs), tuple(procs), tuple(applied), dict(sorted(missing.items())))

    def remove(self, name: str, *, wait_secs: float = _REMOVE_WAIT_SECS) -> bool:
        """Remove the cgroups of sandbox ``name`` (see ``remove_dirs``); True if none is left."""
        check_name(name)
        placements, _ = self.detect()
        return remove_dirs(sorted({os.path.join(p.parent, name) for p in placements.values()}), wait_secs=wait_secs)

    def sweep(self, run_id: str) -> None:
        """Remove empty cgroups left by earlier sandboxes of ``run_id`` (one attempt each).

        A worker that died between creating a cgroup and recording it leaves one behind; so does a
        sandbox that ended by itself and was replaced without being destroyed.
        """
        placements, _ = self.detect()
        for parent in sorted({p.parent for p in placements.values()}):
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            remove_dirs([os.path.join(parent, n) for n in names if _same_run(n, run_id)], wait_secs=0)


def _locate(mounts: list[CgroupMount], own: OwnCgroups) -> tuple[dict[str, Placement], dict[str, str]]:
    placements: dict[str, Placement] = {}
    missing: dict[str, str] = {}
    unified = [m for m in mounts if m.version == 2]
    for controller in CONTROLLERS:
        reasons: list[str] = []
        for mount in (m for m in mounts if m.version == 1 and controller in m.controllers):
            base = cgroup_dir(mount, own.v1.get(controller, "/"))
            if mount.read_only:
                reasons.append(f"the v1 {controller} hierarchy at {mount.mount_point} is mounted read-only")
            elif base is None or not os.path.isdir(base):
                reasons.append(f"this process's {controller} cgroup is not visible under {mount.mount_point}")
            else:
                placements[controller] = Placement(controller, 1, base)
                break
        if controller in placements:
            continue
        for mount in unified:
            base = cgroup_dir(mount, own.unified) if own.unified is not None else None
            offered = _read(os.path.join(base, "cgroup.controllers")) if base is not None else None
            if mount.read_only:
                reasons.append(f"cgroup2 at {mount.mount_point} is mounted read-only")
            elif base is None or offered is None:
                reasons.append(f"this process's cgroup is not visible under {mount.mount_point}")
            elif controller not in offered.split():
                reasons.append(f"cgroup2 does not offer it to {base} (cgroup.controllers: {offered.strip() or 'none'})")
            else:
                placements[controller] = Placement(controller, 2, base)
                break
        if controller not in placements:
            missing[controller] = "; ".join(reasons) or "no cgroup hierarchy on this host offers it"
    return placements, missing


def _make_leaf(group: list[Placement], name: str) -> str:
    """Create ``<base>/fluidbox/<name>`` for placements sharing one base; its path."""
    first = group[0]
    leaf = os.path.join(first.parent, name)
    # Another sandbox's removal may take the shared parent away between our two mkdirs: try again.
    for attempt in range(3):
        if first.version == 2:
            _delegate(first.base, [p.controller for p in group], is_own=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(first.parent, 0o755)
        if first.version == 2:
            _delegate(first.parent, [p.controller for p in group], is_own=False)
        try:
            os.mkdir(leaf, 0o755)
            return leaf
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _delegate(cgroup: str, controllers: list[str], *, is_own: bool) -> None:
    """Make sure cgroup v2 ``cgroup`` hands ``controllers`` to its children."""
    enabled = (_read(os.path.join(cgroup, "cgroup.subtree_control")) or "").split()
    todo = [c for c in controllers if c not in enabled]
    if not todo:
        return
    try:
        _write(os.path.join(cgroup, "cgroup.subtree_control"), " ".join(f"+{c}" for c in todo))
    except OSError as err:
        if is_own and err.errno == errno.EBUSY:
            raise OSError(
                err.errno,
                f"cgroup v2 lets {cgroup} hand {', '.join(todo)} to child cgroups only once it holds no "
                "process, and this process runs in it (only the root cgroup is exempt)",
            ) from err
        raise


def _set_limit(leaf: str, placement: Placement, limits: Limits) -> None:
    if placement.controller == "memory" and limits.memory_bytes is not None:
        value = str(limits.memory_bytes)
        if placement.version == 1:
            _write(os.path.join(leaf, "memory.limit_in_bytes"), value)
            # Memory plus swap: without it a limited sandbox would page out instead of being stopped.
            # Absent when the kernel does not account swap; then there is nothing more to do.
            with contextlib.suppress(OSError):
                _write(os.path.join(leaf, "memory.memsw.limit_in_bytes"), value)
        else:
            _write(os.path.join(leaf, "memory.max"), value)
            if os.path.exists(os.path.join(leaf, "memory.swap.max")):
                _write(os.path.join(leaf, "memory.swap.max"), "0")
    elif placement.controller == "pids" and limits.pids is not None:
        _write(os.path.join(leaf, "pids.max"), str(limits.pids))


def is_sandbox_cgroup(path: str) -> bool:
    """Whether ``path`` has the shape of a sandbox cgroup, ``…/fluidbox/<safe name>``."""
    parent, name = os.path.split(os.path.normpath(path))
    return os.path.isabs(path) and os.path.basename(parent) == PARENT and bool(_NAME.fullmatch(name))


def remove_dirs(dirs: Iterable[str], *, wait_secs: float = _REMOVE_WAIT_SECS) -> bool:
    """Remove sandbox cgroups (never their shared ``fluidbox`` parent); True if none is left.

    Ending the processes inside is the caller's job: while the kernel still counts tasks in one, this
    retries for up to ``wait_secs``. A cgroup already gone counts as removed; nothing here raises.
    """
    ok = True
    for path in dirs:
        if not is_sandbox_cgroup(path):
            log.warning("not removing %s: not a sandbox cgroup", path)
            ok = False
            continue
        deadline = time.monotonic() + wait_secs
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError as err:
                if err.errno in (errno.EBUSY, errno.ENOTEMPTY) and time.monotonic() < deadline:
                    time.sleep(_POLL_SECS)
                    continue
                if wait_secs > 0:
                    log.warning("could not remove cgroup %s: %s", path, _why(err))
                ok = False
                break
        # The shared ``fluidbox`` parent stays: removing it while another sandbox is being prepared (between
        # its mkdir and its controller delegation) would leave that sandbox without limits.
        if not ok and wait_secs <= 0:
            log.warning("cgroup %s is left behind: processes may still be inside", path)
    return ok
