"""The sandbox launcher: a program of its own that ``sandbox.bubblewrap`` runs to start each sandbox.

Run as ``python -I -S sandbox/_launcher.py --serve <fd>`` with an empty environment, it stays up for the
worker's life and forks one child per sandbox (``serve``): each order is a socket the worker passes over
``<fd>``, carrying the JSON request (see ``BubblewrapProvider._launch``) and receiving the outcome. A fork of
this small single-threaded process costs a fraction of a fresh interpreter, which a burst of runs pays per
sandbox otherwise. Run as ``python -I -S sandbox/_launcher.py <log_path> <bwrap> <cgroup.procs path...>``
with the request on stdin, it does one launch and exits (the fallback when no server can be used).
``-I`` keeps this file's directory off ``sys.path``, so it imports the standard library only, never the project.

* It joins the sandbox's cgroups first, so the fork that becomes bwrap starts inside them.
* Started by root, the child that becomes bwrap gives itself a private mount namespace in which the host
  paths the sandbox binds are bind-mounted under one world-traversable directory (a root-only parent
  such as /root would stop the sandbox account), then drops to the sandbox account and execs bwrap,
  which therefore maps the sandbox onto that account and never onto root. The host's mounts are
  untouched.
* bwrap's options travel through a pipe (``--args 3``) and the syscall filter through another
  (``--seccomp 5``), so no command line shows them. The run's tokens travel in a pipe left open on fd 4
  for the sandboxed command (the runner reads it and closes it): bwrap never reads them, so its
  in-sandbox pid 1, which the agent can read, never holds a copy.
* The parent learns the outcome of exec through a close-on-exec pipe, records the sandbox in its pidfile
  before anything else can go wrong, waits (bounded) for bwrap's child in a new pid namespace, prints
  one JSON line and exits, leaving bwrap reparented and in its own session. (bwrap's ``--info-fd``
  would report the child too, but that fd stays open inside the sandbox.)
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
# Where bwrap reads its options (--args), where the sandboxed command finds its tokens, where bwrap reads
# the syscall filter (--seccomp): core.contract.SECRETS_FD and BubblewrapProvider.build_argv agree.
ARGS_FD, SECRETS_FD, SECCOMP_FD = 3, 4, 5
CHILD_WAIT_SECS = 5.0


def stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def start_time(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[19]) if fields else 0


def pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def stage(plan: dict[str, Any]) -> None:
    """A private mount namespace with each ``(source, staged)`` of the plan bind-mounted under its root."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    root = str(plan["root"]).encode()
    check(libc.mount(b"tmpfs", root, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=64k"), "mount the stage")
    for source, staged in plan["binds"]:
        os.mkdir(staged, 0o755)
        check(libc.mount(str(source).encode(), str(staged).encode(), None, MS_BIND | MS_REC, None), f"bind {source}")


def drop(uid: int, gid: int) -> None:
    """Become ``uid``:``gid`` for good (no supplementary groups), or fail."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, gid, gid):
        raise OSError("the privilege drop did not take")


def join_cgroups(procs_files: list[str]) -> str | None:
    """Move this process into each cgroup; the error, if one could not be joined."""
    for procs in procs_files:
        try:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            return f"cannot join cgroup {procs}: {exc}"
    return None


def exec_bwrap(request: dict[str, Any], log_path: str, bwrap: str, pipes: list[int], err_w: int) -> None:
    """In the forked child: become bwrap in a session of its own. Never returns."""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        # Move the pipes above 10 first (one may already sit on 3, 4 or 5), then place them where they
        # are read, surviving the exec.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in pipes]
        for target, fd in zip((ARGS_FD, SECRETS_FD, SECCOMP_FD), high, strict=False):
            os.dup2(fd, target)
            os.set_inheritable(target, True)
        os.set_inheritable(err_w, False)
        if request.get("stage"):
            stage(request["stage"])
        if request.get("account"):
            drop(*request["account"])
        os.execve(bwrap, [bwrap, "--args", str(ARGS_FD), "--", *request["command"]], {})
    except BaseException as exc:
        os.write(err_w, repr(exc).encode())
    os._exit(127)


def feed(fd: int, data: bytes) -> None:
    """Write all of ``data`` into a pipe and close it (a reader that went away is not an error here)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass
    os.close(fd)


def sandbox_init(pid: int) -> tuple[int, int, int | None]:
    """Wait (bounded) for bwrap's child in a new pid namespace: its pid and start time, or bwrap's exit."""
    own_ns, child, child_start, exit_status = pid_ns(os.getpid()), 0, 0, None
    deadline = time.monotonic() + CHILD_WAIT_SECS
    while not child and exit_status is None and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        child = next((k for k in kids if pid_ns(k) not in (None, own_ns)), 0)
        if child:
            child_start = start_time(child)
        else:
            done, status = os.waitpid(pid, os.WNOHANG)
            exit_status = os.waitstatus_to_exitcode(status) if done else None
            time.sleep(0.001)
    return (child if child_start else 0), child_start, exit_status


def launch(log_path: str, bwrap: str, cgroups: list[str], request: dict[str, Any]) -> dict[str, Any]:
    """Start one sandbox from this process (which joins its cgroups): the outcome ``main`` prints."""
    if (problem := join_cgroups(cgroups)) is not None:
        return {"error": problem, "cgroup": True}
    args_r, args_w = os.pipe()
    secrets_r, secrets_w = os.pipe()
    err_r, err_w = os.pipe()
    # The syscall filter, when there is one: a few hundred bytes, so the pipe holds it whole.
    filter_fds: list[int] = []
    if request.get("seccomp"):
        seccomp_r, seccomp_w = os.pipe()
        os.write(seccomp_w, bytes.fromhex(request["seccomp"]))
        os.close(seccomp_w)
        filter_fds = [seccomp_r]
    pid = os.fork()
    if pid == 0:
        exec_bwrap(request, log_path, bwrap, [args_r, secrets_r, *filter_fds], err_w)
    for fd in (err_w, args_r, secrets_r, *filter_fds):
        os.close(fd)
    # Record the sandbox before anything else can go wrong: if the worker dies from here on, the pidfile
    # is how a retried provisioning and the stack's shutdown still find this sandbox.
    early = {
        "provider": "bwrap",
        "run_id": request["run_id"],
        "pid": pid,
        "start_time": start_time(pid),
        "log_path": log_path,
        "extra": request["extra"],
    }
    with open(request["pidfile"] + ".early", "w") as f:
        json.dump(early, f)
    os.replace(request["pidfile"] + ".early", request["pidfile"])
    # Pipes, not files: nothing remains to read once they have been consumed.
    writers = [
        threading.Thread(target=feed, args=(args_w, "\0".join(request["args"]).encode() + b"\0"), daemon=True),
        threading.Thread(target=feed, args=(secrets_w, request["secrets"].encode()), daemon=True),
    ]
    for t in writers:
        t.start()
    outer_start = start_time(pid)  # before any waitpid below can reap it
    err = b""
    while chunk := os.read(err_r, 4096):
        err += chunk
    if err:
        os.waitpid(pid, 0)
        return {"error": err.decode(errors="replace")}
    child, child_start, exit_status = sandbox_init(pid)
    for t in writers:
        t.join(timeout=5.0)
    return {
        "pid": pid,
        "start_time": outer_start,
        "child_pid": child,
        "child_start_time": child_start,
        "exit_status": exit_status,
    }


def main(argv: list[str]) -> int:
    """One launch: the request on stdin, the outcome as one JSON line on stdout."""
    out = launch(argv[1], argv[2], argv[3:], json.loads(sys.stdin.buffer.read()))
    print(json.dumps(out))
    return 1 if "error" in out else 0


def handle(conn: socket.socket) -> int:
    """In a child of ``serve``: read one launch (``{"log_path", "bwrap", "cgroups", "request"}``) to EOF,
    start it, answer with one JSON line."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    order = json.loads(data)
    try:
        out = launch(order["log_path"], order["bwrap"], list(order["cgroups"]), order["request"])
    except Exception as exc:  # the worker reports it; the server itself carries on
        out = {"error": f"launcher: {exc!r}"}
    conn.sendall(json.dumps(out).encode() + b"\n")
    return 1 if "error" in out else 0


def serve(control_fd: int) -> int:
    """Stay up and start a sandbox per order: the worker pays for one interpreter, not one per sandbox.

    Each order is a socket passed over ``control_fd`` (``SCM_RIGHTS``); a forked child of this single-threaded
    process reads it, launches exactly as ``main`` does, answers on it and exits. The server exits when the
    worker closes its end of ``control_fd``."""
    os.set_inheritable(control_fd, False)
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, reap)
    while True:
        _, fds, _, _ = socket.recv_fds(control, 16, 4)
        if not fds:
            return 0  # the worker went away
        for fd in fds:
            os.set_inheritable(fd, False)  # received descriptors are inheritable: never let bwrap keep one
        for fd in fds[1:]:
            os.close(fd)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the launch waits for bwrap itself
                control.close()
                with socket.socket(fileno=fds[0]) as conn:
                    code = handle(conn)
            finally:
                os._exit(code)
        os.close(fds[0])


def reap(signum: int, frame: object) -> None:
    """Collect every finished order (never blocking on one still launching)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve(int(sys.argv[2])))
    sys.exit(main(sys.argv))
