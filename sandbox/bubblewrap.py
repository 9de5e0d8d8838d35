"""Run each sandbox as a detached bubblewrap (``bwrap``) process on this host.

Why it is shaped this way:

* bwrap is started through a tiny fork + ``setsid`` launcher, so it is not a child of the worker: a worker
  restart neither kills nor zombies it, and a new worker reattaches through ``sandbox.pid`` (next to the
  log), which holds the serialized handle.
* A handle names processes by pid *and* start time (field 22 of ``/proc/<pid>/stat``), so a recycled pid
  is never mistaken for the sandbox. It also records the sandbox's init process (bwrap's child, pid 1 of
  the new pid namespace): SIGTERM to the outer bwrap process is not forwarded, it only orphans the
  sandbox, and SIGKILL to that init is what tears the whole namespace down.
* bwrap itself is exec'd with an empty environment: the sandbox's pid 1 is a fork of bwrap, and its
  ``/proc/1/environ`` is readable from inside.
* The sandbox never maps onto host root. A root worker starts bwrap as an unprivileged account
  (``sandbox.account``), so the agent's uid is that account's on the host: what it writes is that
  account's, a setuid bit it sets grants nothing, and ``/proc/sys`` is closed to it (and bound read-only
  in every case). The root is a read-only tmpfs, every bind but ``/workspace`` is read-only, and entries
  under ``/etc`` that other users cannot read (``/etc/shadow``…) are masked.
* The run's tokens reach only the runner: a pipe inherited on fd 4 that it reads after making itself
  non-dumpable. bwrap never reads it, so its pid 1 in the sandbox (dumpable, readable by the agent)
  never holds a copy.
* The workspace is handed to the sandbox account before start and taken back after destroy
  (``sandbox.hostfs``): owned by the control plane again, setuid/setgid bits cleared, devices,
  fifos and sockets removed.
* A syscall filter (``sandbox.seccomp``, through ``--seccomp``) refuses ptrace, new namespaces, mounts,
  io_uring, BPF, socket families beyond Unix, IP and netlink routing (vsock is not network-namespaced)
  and the rest of the kernel surface no tool needs; bwrap installs it last, over everything.
* Memory and process limits come from a cgroup per sandbox (see ``sandbox.limits``). The launcher joins
  it before forking bwrap, so bwrap and everything in the sandbox are inside and the worker never is;
  the handle records the cgroup directories, so whichever worker destroys the sandbox removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import glob
import json
import logging
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from core.contract import ENV_SECRETS_FD, SECRETS_FD
from core.ports import Collected, SandboxHandle, SandboxSpec, SandboxState, WorkspaceTransfer
from sandbox import hostfs
from sandbox.account import DEFAULT_SANDBOX_USER, Account, AccountError, ensure_account
from sandbox.limits import MIB, CgroupLimiter, Limits, Prepared, cgroup_name, remove_dirs
from sandbox.seccomp import machine_arch
from sandbox.seccomp import program as seccomp_program

SANDBOX_UID = 1000
WORKSPACE = "/workspace"
CODE_ROOT = "/opt/fluidbox"
SOCKET_MOUNT = "/run/fluidbox"
PIDFILE_NAME = "sandbox.pid"
# Where a root launcher gathers the host paths a sandbox binds, in a mount namespace of its own (see _launcher).
STAGE_ROOT = "/run/fluidbox-sandbox"
# Kernel knobs no sandbox may write, whoever it maps to: bound read-only over the sandbox's own /proc.
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger")
MASKED_ROOTS = ("/etc",)
MASK_CACHE_SECS = 30.0  # how long one walk of a masked root serves new sandboxes
_unreadable_cache: dict[str, tuple[float, list[HiddenPath]]] = {}
LIMITS_MODES = ("best-effort", "required", "off")
DEFAULT_MEMORY_MB = 2048
DEFAULT_PIDS = 512

_LAUNCH_TIMEOUT_SECS = 30.0
_KILL_WAIT_SECS = 5.0
_POLL_SECS = 0.01

log = logging.getLogger(__name__)
_warned: set[str] = set()

# The launcher is a program of its own (see its docstring): run with -I -S, it imports nothing of ours.
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launcher.py")


class SandboxError(RuntimeError):
    """The sandbox could not be started."""


class _CgroupJoinError(SandboxError):
    """The launcher could not enter the sandbox's cgroups; nothing was started."""


class HiddenPath(NamedTuple):
    """A host path under a read-only bind that the sandbox must not read."""

    path: str
    is_dir: bool


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    sid: int
    state: str
    start_time: int

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")


def bwrap_available(path: str = "bwrap") -> str | None:
    """Return the resolved path of the bwrap binary, or None if it cannot be found."""
    return shutil.which(path)


def unreadable_paths(root: str, *, now: Callable[[], float] = time.monotonic) -> list[HiddenPath]:
    """:func:`scan_unreadable` of ``root``, reused for ``MASK_CACHE_SECS``: walking ``/etc`` for every
    sandbox was a fifth of a worker's CPU in a burst of runs. A file made unreadable since the last walk
    is still closed to the sandbox's uid by its mode; the mask only hides that it exists."""
    cached = _unreadable_cache.get(root)
    if cached is not None and now() - cached[0] < MASK_CACHE_SECS:
        return cached[1]
    found = scan_unreadable(root)
    _unreadable_cache[root] = (now(), found)
    return found


def scan_unreadable(root: str) -> list[HiddenPath]:
    """Files and directories under ``root`` that other users may not read (walk stops at each one).

    An explicit stack, not ``os.walk`` (which recurses: a deep enough tree would raise ``RecursionError``
    and fail every sandbox start); a path too long to stat cannot be bound by bwrap either and is skipped.
    """
    found: list[HiddenPath] = []
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            mode = _lmode(path)
            if mode is None or stat.S_ISLNK(mode):
                continue
            if stat.S_ISDIR(mode):
                if mode & 0o005 != 0o005:
                    found.append(HiddenPath(path, is_dir=True))
                else:
                    stack.append(path)
            elif stat.S_ISREG(mode) and not mode & 0o004:
                found.append(HiddenPath(path, is_dir=False))
    return sorted(found)


def _lmode(path: str) -> int | None:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return None


def _read_proc(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: fields are only unambiguous after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return _Proc(
        pid=pid,
        ppid=int(rest[1]),
        sid=int(rest[3]),
        state=rest[0].decode(),
        start_time=int(rest[19]),
    )


def _all_procs() -> dict[int, _Proc]:
    procs: dict[int, _Proc] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := _read_proc(int(entry))) is not None:
            procs[proc.pid] = proc
    return procs


def _is_alive(pid: int, start_time: int) -> bool:
    proc = _read_proc(pid) if pid > 0 else None
    return proc is not None and proc.start_time == start_time and proc.live


def _child_of(handle: SandboxHandle) -> tuple[int, int]:
    try:
        return int(handle.extra.get("child_pid", "0")), int(handle.extra.get("child_start_time", "0"))
    except ValueError:
        return 0, 0


def _pidfile(log_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(log_path)), PIDFILE_NAME)


class BubblewrapProvider:
    """``ExecutionProvider`` running each sandbox as a detached ``bwrap`` process on this host."""

    name: str = "bwrap"
    # The worker's own copy of the tree is bound in: nothing travels over the runner plane.
    workspace_transfer: WorkspaceTransfer = "bind"

    def __init__(
        self,
        bwrap_path: str = "bwrap",
        python_prefixes: list[str] | None = None,
        *,
        limits_mode: str = "best-effort",
        limits: Limits | None = None,
        limiter: CgroupLimiter | None = None,
        syscall_filter: bool = True,
        sandbox_user: str | None = DEFAULT_SANDBOX_USER,
        state_dir: str | None = None,
    ) -> None:
        """``limits_mode``: ``best-effort`` applies what the host allows (warning once about the rest),
        ``required`` refuses to start a sandbox without every limit, ``off`` applies none.
        ``syscall_filter``: install ``sandbox.seccomp``'s filter (where the architecture has one).
        ``sandbox_user``: the account a root worker starts sandboxes as (created on first use). ``None``
        starts them as this process's own user, which for root maps the sandbox onto host root: it exists
        only to measure what the account costs (``bench/sandbox.py``), never for real runs.
        ``state_dir``: where the worker keeps one directory per run holding its sandbox's log (and so its
        pidfile), ``FLUIDBOX_HOME/runs``; ``sandboxes`` lists what is recorded there (without it, nothing).

        Raises:
            ValueError: an unknown ``limits_mode``.
        """
        if limits_mode not in LIMITS_MODES:
            raise ValueError(f"unknown sandbox limits mode {limits_mode!r}; known: {', '.join(LIMITS_MODES)}")
        self._bwrap_path = bwrap_path
        if python_prefixes is None:
            python_prefixes = [sys.prefix, sys.base_prefix]
        self._python_prefixes = list(dict.fromkeys(os.path.normpath(p) for p in python_prefixes))
        self._limits_mode = limits_mode
        self._limits = limits if limits is not None else Limits(DEFAULT_MEMORY_MB * MIB, DEFAULT_PIDS)
        self._limiter = limiter if limiter is not None else CgroupLimiter()
        self._sandbox_user = sandbox_user
        self._state_dir = os.path.abspath(state_dir) if state_dir else None
        self._account: Account | None = None
        self._launcher = LAUNCH_SERVER  # one per process, whatever the number of providers
        arch = machine_arch()
        self._filter = seccomp_program(arch) if syscall_filter and arch is not None else None
        if not syscall_filter:
            self._filter_note = "off"
        elif arch is None:
            self._filter_note = f"none: no filter for the {platform.machine()} architecture"
            _warn_once(f"sandboxes run without a syscall filter: {self._filter_note}")
        else:
            self._filter_note = "on"

    def close(self) -> None:
        """Stop the process's launcher server (the next launch starts it again; the worker's exit stops it)."""
        self._launcher.close()

    @property
    def python_prefixes(self) -> list[str]:
        return list(self._python_prefixes)

    def build_argv(
        self, spec: SandboxSpec, *, masked: Sequence[HiddenPath] = (), staged: Mapping[str, str] | None = None
    ) -> list[str]:
        """The full bwrap command line for ``spec``, with each ``masked`` path hidden inside.

        Pure: it reads nothing from the host, so ``create`` passes ``masked`` (see ``unreadable_paths``)
        and ``staged``: where each host path the sandbox binds is found by bwrap when a root launcher
        gathered them first (see ``stage_plan``); a path it does not name is bound from where it is.

        Raises:
            ValueError: a relative path, an empty command, or two code dirs with the same name.
        """
        if not spec.argv:
            raise ValueError("the sandbox command is empty")
        if not spec.workspace_dir or not spec.log_path:
            raise ValueError("a bubblewrap sandbox needs a workspace_dir and a log_path on this host")
        for path in (spec.workspace_dir, spec.socket_dir, *spec.code_dirs, *self._python_prefixes):
            if not os.path.isabs(path):
                raise ValueError(f"sandbox paths must be absolute, got {path!r}")
        staged = staged or {}

        def source(path: str) -> str:
            return staged.get(path, path)

        argv = [
            self._bwrap_path,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--hostname",
            "sandbox",
            "--new-session",
            "--cap-drop",
            "ALL",
            *(("--seccomp", "5") if self._filter is not None else ()),
            # A tmpfs hides whatever was bound beneath it before, so these come ahead of every bind.
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            *(arg for path in PROC_READ_ONLY for arg in ("--ro-bind-try", path, path)),
            "--tmpfs",
            "/tmp",
            "--dir",
            "/run",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--symlink",
            "usr/sbin",
            "/sbin",
            "--ro-bind",
            "/etc",
            "/etc",
        ]
        for hidden in masked:
            if hidden.is_dir:
                argv += ["--tmpfs", hidden.path, "--remount-ro", hidden.path]
            else:
                argv += ["--ro-bind", "/dev/null", hidden.path]
        prefixes = [p for p in self._python_prefixes if not _under(p, ("/usr", "/etc"))]
        for prefix in prefixes:
            argv += ["--ro-bind", source(prefix), prefix]
        seen: dict[str, str] = {}
        for code_dir in spec.code_dirs:
            base = os.path.basename(os.path.normpath(code_dir))
            if not base:
                raise ValueError(f"code dir {code_dir!r} has no name to mount it under")
            if base in seen:
                raise ValueError(f"code dirs {seen[base]!r} and {code_dir!r} would both mount at {base!r}")
            seen[base] = code_dir
            argv += ["--ro-bind", source(code_dir), f"{CODE_ROOT}/{base}"]
        argv += [
            "--ro-bind",
            source(spec.socket_dir),
            SOCKET_MOUNT,
            "--bind",
            source(spec.workspace_dir),
            WORKSPACE,
            "--remount-ro",
            "/",
            "--chdir",
            WORKSPACE,
            "--clearenv",
        ]
        env = {
            "PATH": ":".join([*(f"{p}/bin" for p in prefixes), "/usr/bin", "/bin"]),
            "HOME": WORKSPACE,
            "PYTHONPATH": CODE_ROOT,
            "PYTHONDONTWRITEBYTECODE": "1",
            **spec.env,
            ENV_SECRETS_FD: str(SECRETS_FD),
        }
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *spec.argv]

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        return await asyncio.to_thread(self._create, spec)

    async def status(self, handle: SandboxHandle) -> SandboxState:
        return await asyncio.to_thread(_status, handle)

    async def collect(self, handle: SandboxHandle) -> Collected:
        """The tail of the sandbox's log (on this host); bubblewrap gives no reason of its own for an end."""
        return Collected(log_tail=await asyncio.to_thread(_log_tail, handle.log_path))

    async def sandboxes(self) -> list[str]:
        """Run ids of the live sandboxes recorded under ``state_dir``: a sandbox outlives a stopped stack, so
        one whose run ended meanwhile (or that its database never knew) is found here and nowhere else."""
        return sorted(await asyncio.to_thread(self._held))

    def _held(self) -> dict[str, SandboxHandle]:
        """The live sandbox of each run that has a pidfile under ``state_dir``, by run id.

        Each handle is checked against ``/proc`` (pid and start time, bwrap's or its init's), so a pidfile
        left by a sandbox that is gone, whose pid now names another process, is not taken for a sandbox.
        The run directories are the control plane's alone (0700), so no sandbox can plant a pidfile there.
        """
        if self._state_dir is None:
            return {}
        found: dict[str, SandboxHandle] = {}
        for path in sorted(glob.glob(os.path.join(glob.escape(self._state_dir), "*", PIDFILE_NAME))):
            handle = _read_pidfile(path)
            if handle is not None and handle.provider == self.name and _status(handle) == "running":
                found[handle.run_id] = handle
        return found

    def describe(self, handle: SandboxHandle) -> str:
        guards = "".join(
            f"; {key.replace('_', ' ')}: {handle.extra[key]}"
            for key in ("limits", "syscall_filter")
            if key in handle.extra
        )
        return f"{self.name}, pid {handle.pid}{guards}"

    async def find(self, run_id: str, log_path: str = "") -> SandboxHandle | None:
        if not log_path:
            return None  # the pidfile sits next to the log: without it there is nothing to look at

        def _find() -> SandboxHandle | None:
            handle = _read_pidfile(_pidfile(os.path.abspath(log_path)))
            if handle is None or handle.run_id != run_id or _status(handle) != "running":
                return None
            return handle

        return await asyncio.to_thread(_find)

    async def destroy(self, handle: SandboxHandle, grace_secs: float = 2.0) -> None:
        if handle.pid <= 0:
            # A run id alone (the orphan sweep's, from ``sandboxes``): the live sandbox recorded for that run.
            recorded = (await asyncio.to_thread(self._held)).get(handle.run_id)
            if recorded is None:
                return
            handle = recorded
        gone = True
        if handle.pid > 0 and not await _stop(handle, signal.SIGTERM, grace_secs):
            gone = await _stop(handle, signal.SIGKILL, _KILL_WAIT_SECS)
        # A cgroup still holding processes cannot go: one attempt then, not a wait for what will not come.
        await asyncio.to_thread(_remove_cgroups, handle, gone)
        if gone:
            # Nothing of the sandbox runs any more, so nothing can race the walk.
            await asyncio.to_thread(_take_back_workspace, handle)
        else:
            log.warning("sandbox of run %s did not stop; its workspace stays with the sandbox account", handle.run_id)
        await asyncio.to_thread(_remove_pidfile, handle)

    def _create(self, spec: SandboxSpec) -> SandboxHandle:
        bwrap = bwrap_available(self._bwrap_path)
        if bwrap is None:
            raise SandboxError(f"bwrap not found: {self._bwrap_path!r}")
        for path in (spec.workspace_dir, spec.socket_dir, *spec.code_dirs):
            if not os.path.isdir(path):
                raise SandboxError(f"not a directory: {path!r}")
        log_path = os.path.abspath(spec.log_path)
        run_dir = os.path.dirname(log_path)
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        os.chmod(run_dir, 0o700)  # the log, the pidfile and the workspace are the control plane's alone
        pidfile = _pidfile(log_path)
        lock_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # Concurrent creates for one run (an activity retried while the first attempt still runs)
            # must not start two sandboxes.
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            existing = _read_pidfile(pidfile)
            if existing is not None and existing.run_id == spec.run_id and _status(existing) == "running":
                return existing
            account = self._sandbox_account()
            staged = stage_plan(self._bound_paths(spec)) if account is not None else {}
            argv = self.build_argv(
                spec, masked=[p for root in MASKED_ROOTS for p in unreadable_paths(root)], staged=staged
            )
            argv[0] = bwrap
            launch = _Launch(
                run_id=spec.run_id,
                log_path=log_path,
                argv=argv,
                secrets=json.dumps(spec.secrets),
                account=account,
                staged=staged,
            )
            who = {"workspace_dir": spec.workspace_dir, "user": account.name if account else _own_user()}
            if account is not None:
                os.makedirs(STAGE_ROOT, mode=0o755, exist_ok=True)
                hostfs.give(spec.workspace_dir, account.uid, account.gid)
            prepared, extra = self._prepare_limits(spec.run_id)
            extra.update(who, syscall_filter=self._filter_note)
            try:
                handle = self._launch(launch, prepared, extra)
            except _CgroupJoinError as err:
                remove_dirs(prepared.dirs, wait_secs=0)
                if self._limits_mode == "required":
                    raise SandboxError(f"sandbox limits are required but cannot be applied: {err}") from None
                _warn_once(f"sandbox started without limits (FLUIDBOX_SANDBOX_LIMITS=best-effort): {err}")
                extra = {"limits": f"none: {err}", "syscall_filter": self._filter_note, **who}
                handle = self._launch(launch, Prepared(), extra)
            except BaseException:
                # Whatever did start is recorded in the pidfile with these cgroups; empty ones go now.
                remove_dirs(prepared.dirs, wait_secs=0)
                raise
            tmp = pidfile + ".tmp"
            with open(tmp, "w") as f:
                f.write(handle.model_dump_json())
            os.replace(tmp, pidfile)
            return handle
        finally:
            os.close(lock_fd)

    def _sandbox_account(self) -> Account | None:
        """The account to start sandboxes as: only when this process is root (never map onto root).

        Raises:
            SandboxError: the account does not exist and cannot be created.
        """
        if os.geteuid() != 0 or self._sandbox_user is None:
            return None
        if self._account is None:
            try:
                self._account = ensure_account(self._sandbox_user)
            except AccountError as err:
                raise SandboxError(str(err)) from None
        return self._account

    def _bound_paths(self, spec: SandboxSpec) -> list[str]:
        """Every host path bound into the sandbox apart from /usr and /etc (readable by anyone)."""
        prefixes = [p for p in self._python_prefixes if not _under(p, ("/usr", "/etc"))]
        return [*prefixes, *spec.code_dirs, spec.socket_dir, spec.workspace_dir]

    def _prepare_limits(self, run_id: str) -> tuple[Prepared, dict[str, str]]:
        """The sandbox's cgroups, and what goes into its handle about them.

        Raises:
            SandboxError: ``required`` mode, and a limit cannot be applied (nothing is left behind).
        """
        if self._limits_mode == "off":
            return Prepared(), {"limits": "off"}
        if not self._limits.wanted():
            return Prepared(), {"limits": "none: no limit is configured"}
        self._limiter.sweep(run_id)
        prepared = self._limiter.prepare(cgroup_name(run_id), self._limits)
        why = "; ".join(f"{controller}: {reason}" for controller, reason in prepared.missing.items())
        if why and self._limits_mode == "required":
            remove_dirs(prepared.dirs, wait_secs=0)
            raise SandboxError(f"sandbox limits are required but cannot be applied: {why}")
        if why:
            _warn_once(f"sandbox limits not applied (FLUIDBOX_SANDBOX_LIMITS=best-effort): {why}")
        if not prepared.applied:
            return prepared, {"limits": f"none: {why}"}
        summary = " ".join(prepared.applied) + (f" (not applied: {why})" if why else "")
        return prepared, {"limits": summary, "cgroups": json.dumps(list(prepared.dirs))}

    def _launch(self, launch: _Launch, prepared: Prepared, extra: dict[str, str]) -> SandboxHandle:
        argv, log_path, run_id = launch.argv, launch.log_path, launch.run_id
        split = argv.index("--")  # options go through the pipe; bwrap wants the command on its argv
        # The options travel on stdin and through a pipe into bwrap (--args), so neither the
        # launcher's nor bwrap's command line (visible in /proc) carries the environment or a token.
        account = launch.account
        request = {
            "args": argv[1:split],
            "command": argv[split + 1 :],
            "secrets": launch.secrets,
            "run_id": run_id,
            "pidfile": _pidfile(log_path),
            "extra": extra,
            "seccomp": self._filter.hex() if self._filter is not None else "",
            "account": [account.uid, account.gid] if account is not None else None,
            "stage": {"root": STAGE_ROOT, "binds": sorted(launch.staged.items())} if launch.staged else None,
        }
        out = self._launcher.order(
            {"log_path": log_path, "bwrap": argv[0], "cgroups": list(prepared.procs), "request": request}
        )
        if "error" in out and out.get("cgroup"):
            raise _CgroupJoinError(out["error"])
        if "error" in out:
            raise SandboxError(f"cannot exec bwrap: {out['error']}")
        if out["exit_status"] not in (None, 0) and not out["child_pid"] and (refusal := _bwrap_refusal(log_path)):
            # bwrap itself gave up before starting anything (no user namespaces for the account, a bad bind…).
            raise SandboxError(f"bwrap refused to start the sandbox: {refusal}")
        extra = {**extra, "child_pid": str(out["child_pid"]), "child_start_time": str(out["child_start_time"])}
        if out["exit_status"] is not None:
            # Already over (a fast command, or bwrap refused the spec): status says exited, the log says why.
            extra["exit_status"] = str(out["exit_status"])
        return SandboxHandle(
            provider=self.name,
            run_id=run_id,
            pid=out["pid"],
            start_time=out["start_time"],
            log_path=log_path,
            extra=extra,
        )


class LaunchServer:
    """The sandbox launcher kept running for this process (``_launcher.py --serve``), started on first use.

    A burst of runs otherwise starts a Python interpreter per sandbox in the worker's name. The server is a
    child in a session of its own (a signal to the worker's process group must not kill it mid-launch, after
    bwrap was forked but before the sandbox is recorded), with an empty environment, and exits when the
    worker closes the control socket (or exits). Each order gets a fresh socket pair: its end travels to the
    server (``SCM_RIGHTS``), the request and the outcome travel on it, so concurrent launches never share a
    stream. A server that died is started again; one that cannot start leaves a one-shot launcher per order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None

    def order(self, order: dict[str, Any]) -> dict[str, Any]:
        """Launch one sandbox; the launcher's outcome (``pid``… or ``error``)."""
        ours, theirs = socket.socketpair()
        with ours:
            try:
                if not self._send(theirs):
                    return _launch_once(order)
            finally:
                theirs.close()
            ours.settimeout(_LAUNCH_TIMEOUT_SECS)
            try:
                ours.sendall(json.dumps(order).encode())
                ours.shutdown(socket.SHUT_WR)
                answer = b""
                while chunk := ours.recv(65536):
                    answer += chunk
            except TimeoutError:
                raise SandboxError(f"the launcher did not answer within {_LAUNCH_TIMEOUT_SECS:g}s") from None
            except OSError as exc:
                raise SandboxError(f"the launcher failed: {exc}") from None
        try:
            out: dict[str, Any] = json.loads(answer.decode(errors="replace").strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise SandboxError(f"the launcher gave no outcome: {answer[-300:]!r}") from None
        return out

    def _send(self, theirs: socket.socket) -> bool:
        """Pass the order's socket to the server (starting it when needed); False when none can run."""
        with self._lock:
            for _ in range(2):
                if self._control is None or self._proc is None or self._proc.poll() is not None:
                    if not self._start():
                        return False
                assert self._control is not None
                try:
                    socket.send_fds(self._control, [b"L"], [theirs.fileno()])
                    return True
                except OSError:
                    self._stop()  # it died between the check and the send: once more with a new one
            return False

    def _start(self) -> bool:
        self._stop()
        control, remote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", LAUNCHER, "--serve", str(remote.fileno())],
                pass_fds=(remote.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={},
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            control.close()
            _warn_once(f"the sandbox launcher server cannot start ({exc}): one launcher process per sandbox")
            return False
        finally:
            remote.close()
        self._control = control
        return True

    def _stop(self) -> None:
        if self._control is not None:
            self._control.close()  # the server sees EOF and exits
            self._control = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=0 if self._proc.poll() is not None else 5)
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


# Orders carry everything a launch needs, so every provider of a process shares the one server.
LAUNCH_SERVER = LaunchServer()


def _launch_once(order: dict[str, Any]) -> dict[str, Any]:
    """One launch by a launcher process of its own (the request on stdin, the outcome on stdout)."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", LAUNCHER, order["log_path"], order["bwrap"], *order["cgroups"]],
        input=json.dumps(order["request"]).encode(),
        capture_output=True,
        env={},
        cwd="/",
        timeout=_LAUNCH_TIMEOUT_SECS,
        check=False,
        start_new_session=True,  # see LaunchServer
    )
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    try:
        out: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise SandboxError(f"launcher failed ({proc.returncode}): {proc.stderr.decode()!r}") from None
    return out


@dataclass(frozen=True)
class _Launch:
    """Everything one launch needs besides its cgroups (a cgroup join failure relaunches without them)."""

    run_id: str
    log_path: str
    argv: list[str]
    secrets: str
    account: Account | None
    staged: Mapping[str, str]


def stage_plan(paths: Iterable[str]) -> dict[str, str]:
    """Where a root launcher gathers each host path for bwrap: one directory under ``STAGE_ROOT`` each."""
    return {path: f"{STAGE_ROOT}/{i}" for i, path in enumerate(dict.fromkeys(paths))}


def _own_user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _log_tail(log_path: str, limit: int = 4096) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _bwrap_refusal(log_path: str) -> str | None:
    """bwrap's own last complaint in the sandbox log (its lines start with ``bwrap:``), if any."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line for line in tail.splitlines() if line.startswith("bwrap: ")]
    return lines[-1].removeprefix("bwrap: ") if lines else None


def _warn_once(message: str) -> None:
    # Once per process: every sandbox of a host that lacks a controller would say the same.
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _remove_cgroups(handle: SandboxHandle, gone: bool) -> None:
    try:
        dirs = json.loads(handle.extra.get("cgroups", "[]"))
    except ValueError:
        dirs = []
    if isinstance(dirs, list) and all(isinstance(d, str) for d in dirs):
        if gone:
            remove_dirs(dirs)
        else:
            remove_dirs(dirs, wait_secs=0)


def _take_back_workspace(handle: SandboxHandle) -> None:
    """Take the workspace back; one that cannot be (the walk itself fails) is removed, never left to the
    sandbox account, and never an error: destroy must end, or the run's finalization never would."""
    workspace = handle.extra.get("workspace_dir")
    if not workspace:
        return
    try:
        changed = hostfs.take_back(workspace)
    except OSError as err:
        log.warning("run %s: the workspace cannot be taken back (%s): removing it", handle.run_id, err)
        try:
            hostfs.remove_tree(workspace)
        except OSError as again:
            log.error("run %s: the workspace cannot be removed either: %s", handle.run_id, again)
        return
    if changed:
        log.warning("run %s: cleared setuid/setgid bits or removed entries: %s", handle.run_id, changed[:20])


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _read_pidfile(path: str) -> SandboxHandle | None:
    try:
        with open(path) as f:
            return SandboxHandle.model_validate_json(f.read())
    except (OSError, ValueError):
        return None


def _remove_pidfile(handle: SandboxHandle) -> None:
    if not handle.log_path:
        return
    path = _pidfile(handle.log_path)
    recorded = _read_pidfile(path)
    # A newer sandbox for the run may have replaced the pidfile; it is not ours to remove.
    if recorded is not None and (recorded.pid, recorded.start_time) == (handle.pid, handle.start_time):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _status(handle: SandboxHandle) -> SandboxState:
    if handle.pid <= 0:
        return "missing"
    # The init may outlive bwrap itself if someone killed bwrap: the agent is then still running.
    if _is_alive(handle.pid, handle.start_time) or _is_alive(*_child_of(handle)):
        return "running"
    return "exited"


def _members(handle: SandboxHandle) -> list[_Proc]:
    """Every live process of the sandbox: bwrap, its init, their descendants, and bwrap's session."""
    procs = _all_procs()
    outer = procs.get(handle.pid)
    outer_ours = outer is not None and outer.start_time == handle.start_time
    roots = [outer] if outer is not None and outer_ours else []
    child_pid, child_start = _child_of(handle)
    child = procs.get(child_pid)
    if child is not None and child.start_time == child_start:
        roots.append(child)
    by_parent: dict[int, list[_Proc]] = {}
    for proc in procs.values():
        by_parent.setdefault(proc.ppid, []).append(proc)
    found: dict[int, _Proc] = {}
    stack = list(roots)
    while stack:
        proc = stack.pop()
        if proc.pid not in found:
            found[proc.pid] = proc
            stack.extend(by_parent.get(proc.pid, []))
    # A session id cannot be reused while a member lives, but if process <pid> exists and is not ours
    # the number was recycled, and its session is someone else's.
    if outer_ours or outer is None:
        for proc in procs.values():
            if proc.sid == handle.pid and proc.start_time >= handle.start_time:
                found.setdefault(proc.pid, proc)
    return [p for p in found.values() if p.live]


def _signal(proc: _Proc, sig: signal.Signals) -> None:
    if _is_alive(proc.pid, proc.start_time):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


async def _stop(handle: SandboxHandle, sig: signal.Signals, within_secs: float) -> bool:
    """Send ``sig`` to the sandbox until none of it is left or time is up; True if it is gone."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_secs
    sent: set[tuple[int, int]] = set()
    while True:
        members = await asyncio.to_thread(_members, handle)
        if not members:
            return True
        # Rescanned every round: right after create the agent may not be forked yet, and only its
        # init (which ignores SIGTERM) would have been asked.
        await asyncio.to_thread(_send, members, handle, sig, sent)
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_POLL_SECS)


def _send(members: list[_Proc], handle: SandboxHandle, sig: signal.Signals, sent: set[tuple[int, int]]) -> None:
    child_pid, _ = _child_of(handle)
    # SIGKILL to a pid namespace's init kills everything in it, so the init goes first.
    inner = sorted((p for p in members if p.pid != handle.pid), key=lambda p: p.pid != child_pid)
    for proc in inner:
        if (proc.pid, proc.start_time) not in sent:
            sent.add((proc.pid, proc.start_time))
            _signal(proc, sig)
    # bwrap does not forward SIGTERM: it would exit and orphan the sandbox. It exits by itself once its
    # init has, so its group is signalled only to kill, or when nothing else of the sandbox is left.
    outer = (handle.pid, handle.start_time)
    if (sig == signal.SIGKILL or not inner) and outer not in sent and _is_alive(*outer):
        sent.add(outer)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(handle.pid, sig)
