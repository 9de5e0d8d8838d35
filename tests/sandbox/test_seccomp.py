"""The sandbox's syscall filter, proven by installing it in a real child process.

The program is what bwrap receives through ``--seccomp``; here a fresh Python child installs it with
``prctl(PR_SET_SECCOMP)`` itself, probes the kernel and prints what it saw. The same probes without the
filter show each probe can tell the difference.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.seccomp import AARCH64, DENIED, X86_64, Arch, machine_arch, program

ROOT = Path(__file__).resolve().parents[2]
ARCH = machine_arch()
needs_filter = pytest.mark.skipif(ARCH is None, reason="no syscall filter for this machine's architecture")

PROBE = r"""
import ctypes, json, os, socket, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from sandbox.seccomp import machine_arch, program

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
arch = machine_arch()
if sys.argv[2] == "filtered":
    code = program(arch)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(code, len(code))
    prog = Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER


def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(arch.numbers[name]), *[ctypes.c_long(a) for a in args])
    if r == 0 and name == "clone":
        os._exit(0)  # the child of a fork-like clone (no CLONE_VM): leave at once
    if r > 0 and name == "clone":
        os.waitpid(r, 0)
    return 0 if r >= 0 else ctypes.get_errno()


def raw(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()


seen = {
    "pidfd_getfd": call("pidfd_getfd", -1, 0, 0),
    "x32_getpid": raw(0x40000000 | 39, 0) if arch.name == "x86_64" else None,
    "newer_than_the_tables": raw(458, 0, 0, 0, 0),  # listmount (6.8+), any kernel: ENOSYS under the filter
    "ptrace": call("ptrace", 2, os.getppid(), 0, 0),  # PTRACE_PEEKDATA on a process we do not trace
    "process_vm_readv": call("process_vm_readv", os.getppid(), 0, 0, 0, 0, 0),
    "unshare": call("unshare", 0x10000000),  # CLONE_NEWUSER
    "clone_newuser": call("clone", 0x10000000 | 17, 0, 0, 0, 0),  # CLONE_NEWUSER | SIGCHLD
    "clone3": call("clone3", 0, 0),
    "keyctl": call("keyctl", 0, 0),  # KEYCTL_GET_KEYRING_ID
    "io_uring_setup": call("io_uring_setup", 1, 0),
    "bpf": call("bpf", 0, 0, 0),
}


def sock(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return 0
    except OSError as exc:
        return exc.errno


def pair(family, kind):
    try:
        for end in socket.socketpair(family, kind):
            end.close()
        return 0
    except OSError as exc:
        return exc.errno


seen["sockets"] = {
    "vsock": sock(40, socket.SOCK_STREAM),
    "vsock_pair": pair(40, socket.SOCK_STREAM),
    "packet": sock(17, socket.SOCK_RAW),
    "alg": sock(38, socket.SOCK_SEQPACKET),
    "netlink_sock_diag": sock(16, socket.SOCK_RAW, 4),
    # The kernel reads the family as an int: a high half must neither smuggle vsock past nor refuse unix.
    "vsock_high_bits": raw(arch.numbers["socket"], (1 << 32) | 40, socket.SOCK_STREAM, 0),
    "unix_high_bits": raw(arch.numbers["socket"], (1 << 32) | 1, socket.SOCK_STREAM, 0),
    "unix": sock(socket.AF_UNIX, socket.SOCK_STREAM),
    "inet": sock(socket.AF_INET, socket.SOCK_STREAM),
    "inet6": sock(socket.AF_INET6, socket.SOCK_DGRAM),
    "netlink_route": sock(16, socket.SOCK_RAW, 0),
    "unix_pair": pair(socket.AF_UNIX, socket.SOCK_DGRAM),
}
pid = os.fork()
if pid == 0:
    os._exit(3)
seen["fork_exit"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
box = []
t = threading.Thread(target=lambda: box.append(1))
t.start()
t.join()
seen["thread"] = box == [1]
seen["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True).stdout.strip().decode()
a, b = socket.socketpair()
a.sendall(b"x")
seen["socketpair"] = b.recv(1).decode()
print(json.dumps(seen))
"""


def probe(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT), mode], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@needs_filter
def test_the_filter_refuses_what_reaches_across_processes_or_into_the_kernel_and_nothing_else() -> None:
    seen = probe("filtered")
    eperm = {
        "ptrace",
        "process_vm_readv",
        "pidfd_getfd",
        "unshare",
        "clone_newuser",
        "keyctl",
        "io_uring_setup",
        "bpf",
    }
    assert {k: seen[k] for k in eperm} == dict.fromkeys(eperm, errno.EPERM)
    assert seen["clone3"] == errno.ENOSYS  # libc falls back to clone, which the filter can inspect
    assert seen["newer_than_the_tables"] == errno.ENOSYS  # as on an older kernel: never open by omission
    if ARCH is not None and ARCH.name == "x86_64":
        assert seen["x32_getpid"] == errno.EPERM  # another ABI's numbers mean other calls: refused
    # Ordinary work is untouched: processes (clone without CLONE_NEWUSER), threads, exec, sockets.
    assert seen["fork_exit"] == 3 and seen["thread"] is True
    assert seen["subprocess"] == "42" and seen["socketpair"] == "x"


REFUSED_FAMILIES = ("vsock", "vsock_pair", "packet", "alg", "vsock_high_bits")
ALLOWED_FAMILIES = ("unix", "inet", "inet6", "netlink_route", "unix_pair", "unix_high_bits")


@needs_filter
def test_the_filter_allows_only_the_socket_families_a_sandbox_uses() -> None:
    sockets = probe("filtered")["sockets"]
    assert isinstance(sockets, dict)
    # vsock is not network-namespaced: refused, as on a kernel built without it (and the rest with it).
    assert {k: sockets[k] for k in REFUSED_FAMILIES} == dict.fromkeys(REFUSED_FAMILIES, errno.EAFNOSUPPORT)
    assert sockets["netlink_sock_diag"] == errno.EPROTONOSUPPORT  # netlink for routing (getifaddrs) only
    assert {k: sockets[k] for k in ALLOWED_FAMILIES} == dict.fromkeys(ALLOWED_FAMILIES, 0)


@needs_filter
def test_without_the_filter_the_same_probes_get_other_answers() -> None:
    # Proof that the probes can tell: unfiltered, none of them is refused with EPERM by a filter.
    seen = probe("unfiltered")
    assert seen["ptrace"] == errno.ESRCH  # the kernel looked: that process is not traced by us
    assert seen["clone3"] != errno.ENOSYS  # the kernel has clone3 (EFAULT/EINVAL for these arguments)
    assert seen["keyctl"] != errno.EPERM and seen["io_uring_setup"] != errno.EPERM
    assert seen["pidfd_getfd"] == errno.EBADF  # the kernel looked at the (invalid) pidfd
    sockets = seen["sockets"]
    assert isinstance(sockets, dict)
    assert sockets["netlink_sock_diag"] == 0
    if os.path.exists("/dev/vsock"):  # a VM whose kernel has vsock: the kernel answers for itself
        assert sockets["vsock"] == sockets["vsock_high_bits"] == 0
        assert sockets["vsock_pair"] == errno.EOPNOTSUPP  # vsock has no socketpair


def _header_numbers(path: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for match in re.finditer(r"^#define __NR(?:3264)?_(\w+)\s+(\d+)\s*$", path.read_text(), re.M):
        found.setdefault(match.group(1), int(match.group(2)))
    return found


HEADERS = [
    (X86_64, Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")),
    (AARCH64, Path("/usr/include/asm-generic/unistd.h")),  # aarch64 uses the generic table
]


@pytest.mark.parametrize(("arch", "header"), HEADERS, ids=[a.name for a, _ in HEADERS])
def test_the_syscall_numbers_match_the_kernel_headers(arch: Arch, header: Path) -> None:
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    table = _header_numbers(header)
    assert {name: table.get(name) for name in arch.numbers} == arch.numbers
    # Every denied name that exists on this architecture is in its table, so none is silently skipped.
    assert sorted(n for n in DENIED if n in table and n not in arch.numbers) == []


def test_jumps_land_inside_the_program_and_it_ends_in_returns() -> None:
    for arch in (X86_64, AARCH64):
        code = program(arch)
        assert len(code) % 8 == 0
        count = len(code) // 8
        assert count < 4096  # BPF_MAXINSNS
        ops = [struct.unpack("=HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
        for index, (op, jt, jf, _) in enumerate(ops):
            if op & 0x07 == 0x05:  # BPF_JMP
                assert index + 1 + max(jt, jf) < count
        assert ops[-1][0] == 0x06 and ops[-2][0] == 0x06  # the last two are returns (EPERM, ENOSYS)


INSIDE = r"""
import ctypes, json, os, subprocess, sys, threading

numbers = json.loads(os.environ["NUMBERS"])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(numbers[name]), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()


status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
box = []
t = threading.Thread(target=lambda: box.append(1))
t.start()
t.join()
report = {
    "seccomp_mode": status["Seccomp"].strip(),
    "ptrace": call("ptrace", 2, 1, 0, 0),  # PTRACE_PEEKDATA on the sandbox's init
    "unshare": call("unshare", 0x10000000),
    "keyctl": call("keyctl", 0, 0),
    "io_uring_setup": call("io_uring_setup", 1, 0),
    "thread": box == [1],
    "subprocess": subprocess.run(["/bin/sh", "-c", "echo $((6 * 7))"], capture_output=True).stdout.decode().strip(),
}
with open("/workspace/report.json", "w") as f:
    json.dump(report, f)
"""


async def run_inside(tmp_path: Path, *, syscall_filter: bool) -> dict[str, object]:
    from sandbox.bubblewrap import BubblewrapProvider
    from tests.sandbox.test_bubblewrap import make_spec, wait_exited

    assert ARCH is not None
    provider = BubblewrapProvider(limits_mode="off", syscall_filter=syscall_filter)
    spec = make_spec(tmp_path, [sys.executable, "-c", INSIDE], env={"NUMBERS": json.dumps(ARCH.numbers)})
    handle = await provider.create(spec)
    try:
        await wait_exited(provider, handle)
        assert handle.extra["syscall_filter"] == ("on" if syscall_filter else "off")
        report = tmp_path / "ws" / "report.json"
        assert report.exists(), Path(spec.log_path).read_text()
        return dict(json.loads(report.read_text()))
    finally:
        await provider.destroy(handle)


@needs_filter
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
async def test_a_real_sandbox_runs_under_the_filter(tmp_path: Path) -> None:
    seen = await run_inside(tmp_path / "on", syscall_filter=True)
    assert seen["seccomp_mode"] == "2"  # SECCOMP_MODE_FILTER, installed by bwrap over everything inside
    assert {k: seen[k] for k in ("ptrace", "unshare", "keyctl", "io_uring_setup")} == dict.fromkeys(
        ("ptrace", "unshare", "keyctl", "io_uring_setup"), errno.EPERM
    )
    assert seen["thread"] is True and seen["subprocess"] == "42"
    # The same sandbox without the filter: the kernel answers those calls itself.
    bare = await run_inside(tmp_path / "off", syscall_filter=False)
    assert bare["seccomp_mode"] == "0"
    assert bare["ptrace"] == errno.ESRCH and bare["keyctl"] != errno.EPERM and bare["io_uring_setup"] != errno.EPERM
