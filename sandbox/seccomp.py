"""The sandbox's syscall filter: a classic BPF program for bwrap's ``--seccomp FD``.

bwrap installs a filter it is given as compiled BPF (an array of ``struct sock_filter``) after it has
set up the namespaces, so the filter binds the runner and everything the agent starts, and nothing can
remove it. The sandbox already has no capabilities and no network; the filter takes away the kernel
interfaces an agent's tools have no business with and that widen the attack surface or reach across
processes:

* **Reading or steering other processes** — ``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``,
  ``process_madvise``, ``kcmp``. The runner holds the run's tokens in its memory and is non-dumpable,
  which is what keeps ``/proc/<runner>/mem`` and its fds closed to the agent's tools; the filter takes
  these calls away from every process in the sandbox besides.
* **New namespaces** — ``unshare``, ``setns``, and ``clone`` with ``CLONE_NEWUSER``: a nested user
  namespace hands its creator a full capability set inside it, the start of many kernel exploits.
  ``clone3`` answers ``ENOSYS`` (its flags live in memory a filter cannot read), so libc falls back to
  ``clone``, which is checked.
* **Mounts, modules, keys, kexec, clocks, swap, quotas, reboot, BPF, perf, io_uring,
  userfaultfd, handle-based opens, the kernel log** — the rest of Docker's default deny list, for the
  same reasons.
* **Socket families but a few** — ``socket`` and ``socketpair`` are allowed for ``AF_UNIX`` (the gateway
  socket, multiprocessing, git), ``AF_INET``/``AF_INET6`` (loopback in the sandbox's own network
  namespace: test servers an agent starts) and ``AF_NETLINK`` with ``NETLINK_ROUTE`` only (glibc's
  ``getifaddrs``/``if_nameindex``/``AI_ADDRCONFIG``, which Node's ``os.networkInterfaces`` and ``ip``
  use; it shows the sandbox its own loopback). Every other family answers ``EAFNOSUPPORT``, as on a
  kernel built without it, and every other netlink protocol ``EPROTONOSUPPORT``. Some families are not
  network-namespaced at all: ``AF_VSOCK`` would let a sandbox take ports from every other sandbox and
  the host, and talk to the hypervisor; the rest (``AF_PACKET``, ``AF_ALG``, ``AF_XDP``, ``AF_KEY``,
  ``AF_TIPC``, ``AF_RDS``, ``AF_CAN``, Bluetooth…) are kernel surface no tool needs.

Syscalls newer than the tables (number 451 and up, ``map_shadow_stack`` excepted) answer ``ENOSYS``,
as on an older kernel, so a new kernel interface is never open by omission.

Everything denied fails with ``EPERM`` (``ENOSYS`` for ``clone3``, ``EAFNOSUPPORT`` for a socket
family, ``EPROTONOSUPPORT`` for a netlink protocol), never a kill, so a tool that probes for a feature
gets an error it can handle. A syscall made through another ABI than the native one (i386 or x32 on
x86_64) is refused: its numbers mean different calls, and that is also what closes i386's
``socketcall``, whose family the filter could not read.
Supported: x86_64 and aarch64.

Pure: builds bytes, touches nothing.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

# Denied outright, by name (numbers per architecture below; absent names do not exist there).
DENIED = (
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pidfd_getfd",
    "pivot_root",
    "process_madvise",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "syslog",
    "sysfs",
    "_sysctl",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
)

CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000
# Syscalls newer than these tables (the same numbers on every architecture since 5.x) answer ENOSYS, as if
# the kernel were older, so libc falls back; except map_shadow_stack, which glibc's CET support needs.
FIRST_UNKNOWN = 451
ALLOWED_NEW = (453,)  # map_shadow_stack
# The socket families a sandbox may open (linux/socket.h); netlink only for its routing protocol.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
NETLINK_ROUTE = 0
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)


@dataclass(frozen=True)
class Arch:
    name: str
    audit: int  # AUDIT_ARCH_* as the kernel reports it in seccomp_data.arch
    numbers: dict[str, int]
    x32_bit: bool = False  # numbers at or above X32_SYSCALL_BIT are another ABI


# From the kernel's uapi tables (asm/unistd_64.h for x86_64, asm-generic/unistd.h for aarch64); tests
# cross-check them against the headers when the machine has them.
X86_64 = Arch(
    name="x86_64",
    audit=0xC000003E,
    x32_bit=True,
    numbers={
        "acct": 163,
        "add_key": 248,
        "bpf": 321,
        "clock_adjtime": 305,
        "clock_settime": 227,
        "clone": 56,
        "clone3": 435,
        "create_module": 174,
        "delete_module": 176,
        "finit_module": 313,
        "fsconfig": 431,
        "fsmount": 432,
        "fsopen": 430,
        "fspick": 433,
        "get_kernel_syms": 177,
        "init_module": 175,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "io_uring_setup": 425,
        "ioperm": 173,
        "iopl": 172,
        "kcmp": 312,
        "kexec_file_load": 320,
        "kexec_load": 246,
        "keyctl": 250,
        "lookup_dcookie": 212,
        "mount": 165,
        "mount_setattr": 442,
        "move_mount": 429,
        "name_to_handle_at": 303,
        "nfsservctl": 180,
        "open_by_handle_at": 304,
        "open_tree": 428,
        "perf_event_open": 298,
        "pidfd_getfd": 438,
        "pivot_root": 155,
        "process_madvise": 440,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "ptrace": 101,
        "query_module": 178,
        "quotactl": 179,
        "quotactl_fd": 443,
        "reboot": 169,
        "request_key": 249,
        "setns": 308,
        "settimeofday": 164,
        "socket": 41,
        "socketpair": 53,
        "swapoff": 168,
        "swapon": 167,
        "syslog": 103,
        "sysfs": 139,
        "_sysctl": 156,
        "umount2": 166,
        "unshare": 272,
        "uselib": 134,
        "userfaultfd": 323,
        "ustat": 136,
    },
)
AARCH64 = Arch(
    name="aarch64",
    audit=0xC00000B7,
    numbers={
        "acct": 89,
        "add_key": 217,
        "bpf": 280,
        "clock_adjtime": 266,
        "clock_settime": 112,
        "clone": 220,
        "clone3": 435,
        "delete_module": 106,
        "finit_module": 273,
        "fsconfig": 431,
        "fsmount": 432,
        "fsopen": 430,
        "fspick": 433,
        "init_module": 105,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "io_uring_setup": 425,
        "kcmp": 272,
        "kexec_file_load": 294,
        "kexec_load": 104,
        "keyctl": 219,
        "lookup_dcookie": 18,
        "mount": 40,
        "mount_setattr": 442,
        "move_mount": 429,
        "name_to_handle_at": 264,
        "nfsservctl": 42,
        "open_by_handle_at": 265,
        "open_tree": 428,
        "perf_event_open": 241,
        "pidfd_getfd": 438,
        "pivot_root": 41,
        "process_madvise": 440,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "ptrace": 117,
        "quotactl": 60,
        "quotactl_fd": 443,
        "reboot": 142,
        "request_key": 218,
        "setns": 268,
        "settimeofday": 170,
        "socket": 198,
        "socketpair": 199,
        "swapoff": 225,
        "swapon": 224,
        "syslog": 116,
        "umount2": 39,
        "unshare": 97,
        "userfaultfd": 282,
    },
)
ARCHES = {a.name: a for a in (X86_64, AARCH64)}

# Classic BPF encodings (linux/bpf_common.h, linux/filter.h) and seccomp return actions.
LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
# args[n]'s low half (the filter runs on little-endian arches only); socket's family and protocol are C ints,
# so the kernel reads only that half too, and whatever is in the high half changes nothing.
OFF_NR, OFF_ARCH, OFF_ARG0_LOW, OFF_ARG2_LOW = 0, 4, 16, 32


def machine_arch() -> Arch | None:
    """The running machine's architecture, when a filter exists for it."""
    return ARCHES.get(platform.machine())


def program(arch: Arch) -> bytes:
    """The compiled filter for ``arch``: a ``struct sock_filter`` array, native byte order."""
    # Instructions as (code, true target, false target, k); targets are labels or None (next).
    ops: list[tuple[int, str | None, str | None, int] | str] = [
        (LD_ABS_W, None, None, OFF_ARCH),
        (JEQ_K, None, "eperm", arch.audit),
        (LD_ABS_W, None, None, OFF_NR),
    ]
    if arch.x32_bit:
        ops.append((JGE_K, "eperm", None, X32_SYSCALL_BIT))
    ops += [(JEQ_K, "allow", None, nr) for nr in ALLOWED_NEW]
    ops.append((JGE_K, "enosys", None, FIRST_UNKNOWN))
    for name in DENIED:
        if name in arch.numbers:
            ops.append((JEQ_K, "eperm", None, arch.numbers[name]))
    ops += [
        (JEQ_K, "enosys", None, arch.numbers["clone3"]),
        (JEQ_K, "clone", None, arch.numbers["clone"]),
        (JEQ_K, "socket", None, arch.numbers["socket"]),
        (JEQ_K, "socket", None, arch.numbers["socketpair"]),
        "allow",
        (RET_K, None, None, RET_ALLOW),
        "clone",
        (LD_ABS_W, None, None, OFF_ARG0_LOW),
        (JSET_K, "eperm", None, CLONE_NEWUSER),
        (RET_K, None, None, RET_ALLOW),
        # socket(family, type, protocol) and socketpair(family, type, protocol, sv) alike.
        "socket",
        (LD_ABS_W, None, None, OFF_ARG0_LOW),
        *((JEQ_K, "socket_allow", None, family) for family in SOCKET_FAMILIES),
        (JEQ_K, None, "eafnosupport", AF_NETLINK),
        (LD_ABS_W, None, None, OFF_ARG2_LOW),
        (JEQ_K, None, "eprotonosupport", NETLINK_ROUTE),
        "socket_allow",
        (RET_K, None, None, RET_ALLOW),
        "eafnosupport",
        (RET_K, None, None, RET_ERRNO | errno.EAFNOSUPPORT),
        "eprotonosupport",
        (RET_K, None, None, RET_ERRNO | errno.EPROTONOSUPPORT),
        "eperm",
        (RET_K, None, None, RET_ERRNO | errno.EPERM),
        "enosys",
        (RET_K, None, None, RET_ERRNO | errno.ENOSYS),
    ]
    return _assemble(ops)


def _assemble(ops: list[tuple[int, str | None, str | None, int] | str]) -> bytes:
    labels: dict[str, int] = {}
    code: list[tuple[int, str | None, str | None, int]] = []
    for item in ops:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)
    out = bytearray()
    for index, (op, true, false, k) in enumerate(code):
        jt = _offset(labels, index, true)
        jf = _offset(labels, index, false)
        out += struct.pack("=HBBI", op, jt, jf, k)
    return bytes(out)


def _offset(labels: dict[str, int], index: int, label: str | None) -> int:
    """A forward jump from instruction ``index`` (0 = the next instruction); BPF cannot jump back."""
    if label is None:
        return 0
    offset = labels[label] - index - 1
    if not 0 <= offset <= 255:
        raise ValueError(f"jump to {label!r} from instruction {index} is out of range ({offset})")
    return offset
