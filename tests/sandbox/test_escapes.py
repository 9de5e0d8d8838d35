"""An attacker's probes from inside real sandboxes, one test each, run as the worker runs (root in CI).

Each test is an escape someone found or could try; it fails if the defect comes back. The surrounding
guarantees are pinned next door: network, host files, read-only root, environment and command lines in
``test_bubblewrap.py``; ptrace, new namespaces, mounts and the rest of the kernel surface in
``test_seccomp.py``; fork bombs and memory in ``test_limits.py``; the diff collector in
``test_diff_collector.py``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from activities import rundirs, workspace
from core.ports import SandboxSpec
from sandbox import hostfs
from sandbox.account import DEFAULT_SANDBOX_USER, lookup
from sandbox.bubblewrap import CODE_ROOT, STAGE_ROOT, BubblewrapProvider
from tests.helpers import eventually
from tests.sandbox.test_bubblewrap import PROJECT_ROOT, make_spec, needs_bwrap, wait_exited

pytestmark = needs_bwrap

# Written to, each of these would let a sandbox run code as host root or weaken the whole host.
SYSCTLS = [
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/randomize_va_space",
    "/proc/sys/fs/suid_dumpable",
    "/proc/sys/vm/drop_caches",
    "/proc/sys/kernel/modprobe",
    "/proc/sysrq-trigger",
]

SYSCTL_PROBE = r"""
import json, os, sys
out = {}
for path in json.loads(sys.argv[1]):
    try:
        os.close(os.open(path, os.O_WRONLY))
        out[path] = "writable"
    except OSError as exc:
        out[path] = exc.errno
with open("/workspace/report.json", "w") as f:
    json.dump(out, f)
"""

# The agent's side: look through the memory of every process it may read for a run token.
MEMORY_SCAN = r"""
import json, os, re
pattern = re.compile(rb"fbx_sess_[0-9a-f]{32}")
readable, found = [], {}
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        with open(f"/proc/{pid}/maps") as f:
            regions = f.read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        continue
    readable.append(int(pid))
    hits = set()
    with mem:
        for region in regions:
            span, perms = region.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if not perms.startswith("r") or hi - lo > 512 << 20:
                continue
            try:
                mem.seek(lo)
                hits.update(m.decode() for m in pattern.findall(mem.read(hi - lo)))
            except (OSError, ValueError, OverflowError):
                continue
    found[pid] = sorted(hits)
print(json.dumps({"readable": readable, "found": found}))
"""

# The runner's side, with the runner's own code: make itself non-dumpable, take the tokens, then let the
# "agent" look while the tokens are held.
RUNNER_THEN_AGENT = r"""
import json, os, subprocess, sys
from runner.harness import guard_memory
from runner.gateway import take_credentials
guard_memory()
creds = take_credentials(os.environ)
scan = subprocess.run([sys.executable, "/opt/fluidbox/probe/scan.py"], capture_output=True, text=True)
with open("/workspace/report.json", "w") as f:
    f.write(scan.stdout or json.dumps({"error": scan.stderr}))
assert creds.control_token
"""

# The agent's side: the socket families the kernel does not confine to the sandbox's network namespace, and
# the ones its tools need (loopback servers, a Unix socketpair, interface listing, Node's networking).
SOCKETS = r"""
import json, shutil, socket, subprocess


def attempt(fn):
    try:
        return fn()
    except OSError as exc:
        return exc.errno


def opened(family, kind, proto=0):
    socket.socket(family, kind, proto).close()
    return "opened"


def vsock_bind():
    with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as s:
        s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        return "bound"


def pair(family):
    a, b = socket.socketpair(family, socket.SOCK_STREAM)
    with a, b:
        a.sendall(b"x")
        return b.recv(1).decode()


def loopback(family, host):
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.bind((host, 0))
        server.listen()
        with socket.create_connection(server.getsockname()[:2], timeout=5) as client:
            conn, _ = server.accept()
            with conn:
                client.sendall(b"ping")
                return conn.recv(4).decode()


NODE = (
    "const os = require('os'), net = require('net');"
    "const names = Object.keys(os.networkInterfaces());"
    "const server = net.createServer(c => c.end('pong')).listen(0, '127.0.0.1', () => {"
    "  net.connect(server.address().port, '127.0.0.1').on('data', d => {"
    "    console.log(JSON.stringify({names, reply: d.toString()})); process.exit(0); }); });"
)
node = shutil.which("node")
report = {
    "vsock": attempt(lambda: opened(socket.AF_VSOCK, socket.SOCK_STREAM)),
    "vsock_bind": attempt(vsock_bind),
    "vsock_pair": attempt(lambda: pair(socket.AF_VSOCK)),
    "packet": attempt(lambda: opened(socket.AF_PACKET, socket.SOCK_RAW)),
    "netlink_sock_diag": attempt(lambda: opened(socket.AF_NETLINK, socket.SOCK_RAW, 4)),
    "tcp4": attempt(lambda: loopback(socket.AF_INET, "127.0.0.1")),
    "tcp6": attempt(lambda: loopback(socket.AF_INET6, "::1")),
    "unix_pair": attempt(lambda: pair(socket.AF_UNIX)),
    "interfaces": attempt(lambda: [name for _, name in socket.if_nameindex()]),
    "localhost": attempt(lambda: sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, proto=6)})),
    "node": json.loads(subprocess.run([node, "-e", NODE], capture_output=True, text=True, timeout=60).stdout)
    if node
    else None,
}
with open("/workspace/report.json", "w") as f:
    json.dump(report, f)
"""

PLANT = """
cp /usr/bin/id /workspace/suid_id && chmod 4755 /workspace/suid_id
mkdir /workspace/sgid_dir && chmod 2775 /workspace/sgid_dir
cp /usr/bin/id /workspace/sgid_dir/sgid_id && chmod 2755 /workspace/sgid_dir/sgid_id
mkfifo /workspace/fifo
python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("/workspace/sock")'
echo done > /workspace/planted
exec sleep 300
"""


async def run_probe(
    tmp_path: Path, script: str, *args: str, provider: BubblewrapProvider | None = None, **spec_kw: Any
) -> dict[str, Any]:
    provider = provider or BubblewrapProvider()
    code = tmp_path / "code" / "probe"
    code.mkdir(parents=True)
    (code / "probe.py").write_text(script)
    (code / "scan.py").write_text(MEMORY_SCAN)
    code_dirs = [str(code), *spec_kw.pop("code_dirs", [])]
    spec = make_spec(tmp_path, [sys.executable, f"{CODE_ROOT}/probe/probe.py", *args], code_dirs=code_dirs, **spec_kw)
    handle = await provider.create(spec)
    try:
        await wait_exited(provider, handle, within=60)
    finally:
        await provider.destroy(handle)
    report = Path(spec.workspace_dir) / "report.json"
    if not report.exists():
        pytest.fail(f"the probe wrote no report; sandbox log: {Path(spec.log_path).read_text()}")
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def host_uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


async def test_global_sysctls_are_not_writable_from_inside(tmp_path: Path) -> None:
    # Finding 1: mapped onto host root, a sandbox could open core_pattern for writing (one crash later: root).
    report = await run_probe(tmp_path, SYSCTL_PROBE, json.dumps(SYSCTLS))

    for path in SYSCTLS:
        assert report[path] != "writable", f"{path} is writable from inside the sandbox"
        assert report[path] in (errno.EACCES, errno.EROFS, errno.EPERM, errno.ENOENT), (path, report[path])
    assert report["/proc/sys/kernel/core_pattern"] in (errno.EACCES, errno.EROFS)


async def test_no_process_the_agent_can_read_holds_a_run_token(tmp_path: Path) -> None:
    # Finding 2: the tokens went through bwrap's --file, so bwrap's pid 1 (dumpable, the agent's uid) held a copy.
    token = f"fbx_sess_{uuid.uuid4().hex}"
    report = await run_probe(
        tmp_path,
        RUNNER_THEN_AGENT,
        code_dirs=[str(PROJECT_ROOT / "runner"), str(PROJECT_ROOT / "core")],
        env={"FLUIDBOX_SESSION_ID": "run-escape"},
        secrets={"FLUIDBOX_SESSION_TOKEN": token},
    )

    assert "error" not in report, report
    # The probe really could read some memory: the sandbox's pid 1 is the agent's uid and dumpable.
    assert 1 in report["readable"], report
    # The runner (pid 2) holds the token and is non-dumpable: not readable.
    assert 2 not in report["readable"], report
    leaks = {pid: hits for pid, hits in report["found"].items() if hits}
    assert not leaks, f"run tokens found in the memory of processes the agent can read: {leaks}"
    assert token not in json.dumps(report)


async def test_an_agent_cannot_leave_a_setuid_root_binary_or_special_files_on_the_host(tmp_path: Path) -> None:
    # Finding 3: files written in /workspace belonged to host root, and a setuid bit on them was honoured.
    provider = BubblewrapProvider()
    spec = make_spec(tmp_path, ["/bin/sh", "-c", PLANT])
    workspace = Path(spec.workspace_dir)
    handle = await provider.create(spec)
    try:

        async def planted() -> bool:
            return (workspace / "planted").exists()

        await eventually(planted, timeout=30, interval=0.01)
        suid = os.lstat(workspace / "suid_id")
        # While the sandbox runs, what it writes is the sandbox account's, never root's.
        assert suid.st_uid != 0, "a file the agent wrote is owned by host root"
        child = int(handle.extra["child_pid"])
        assert host_uid_of(child) != 0, "the sandbox's processes run as host root"
        if os.geteuid() == 0:
            account = lookup(DEFAULT_SANDBOX_USER)
            assert account is not None
            assert (suid.st_uid, host_uid_of(child)) == (account.uid, account.uid)
    finally:
        await provider.destroy(handle)

    # Taken back: the control plane's again, no privilege bits, no fifo, no socket.
    for name in ("suid_id", "sgid_dir", "sgid_dir/sgid_id", "planted"):
        info = os.lstat(workspace / name)
        assert info.st_uid == os.geteuid(), name
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), f"{name} kept a setuid/setgid bit"
    assert not (workspace / "fifo").exists()
    assert not (workspace / "sock").exists()
    assert stat.S_IMODE(os.stat(Path(spec.log_path).parent).st_mode) == 0o700


async def test_every_sandbox_process_runs_as_the_sandbox_account_and_no_mount_is_left_behind(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "sleep 300 & echo started > /workspace/started; wait"])
    handle = await provider.create(spec)
    try:

        async def started() -> bool:
            return (Path(spec.workspace_dir) / "started").exists()

        await eventually(started, timeout=30, interval=0.01)
        # The host's view: bwrap outside, its init inside and everything below them.
        members = [handle.pid, int(handle.extra["child_pid"])]
        members += [int(p) for p in Path(f"/proc/{members[1]}/task/{members[1]}/children").read_text().split()]
        assert len(members) >= 3
        uids = {host_uid_of(pid) for pid in members}
        assert 0 not in uids, "a sandbox process runs as host root"
        if os.geteuid() == 0:
            account = lookup(DEFAULT_SANDBOX_USER)
            assert account is not None and uids == {account.uid}
            assert handle.extra["user"] == DEFAULT_SANDBOX_USER
        # The staging mounts live only in the launcher's own mount namespace.
        assert STAGE_ROOT not in await asyncio.to_thread(Path("/proc/self/mountinfo").read_text)
    finally:
        await provider.destroy(handle)


@pytest.mark.parametrize("user", [DEFAULT_SANDBOX_USER, None], ids=["sandbox-account", "worker-user"])
async def test_a_sandbox_opens_no_socket_family_beyond_its_own_namespace(tmp_path: Path, user: str | None) -> None:
    # Finding 6: vsock is not network-namespaced; a sandbox could bind ports every other sandbox and the host
    # then could not, and reach the hypervisor. ``None``: the worker's own user (host root in CI).
    report = await run_probe(tmp_path, SOCKETS, provider=BubblewrapProvider(sandbox_user=user))

    refused = {k: report[k] for k in ("vsock", "vsock_bind", "vsock_pair", "packet")}
    assert refused == dict.fromkeys(refused, errno.EAFNOSUPPORT), report
    assert report["netlink_sock_diag"] == errno.EPROTONOSUPPORT, report
    # What tools use still works: loopback servers on both families, Unix socket pairs, interface listing.
    assert (report["tcp4"], report["tcp6"], report["unix_pair"]) == ("ping", "ping", "x"), report
    assert report["interfaces"] == ["lo"], report
    assert "127.0.0.1" in report["localhost"], report
    if report["node"] is not None:
        assert report["node"] == {"names": ["lo"], "reply": "pong"}, report


# ---- issue 24: what an agent leaves behind cannot wedge a run's finalization ----------------------------

NEST = r"""
import os, sys

def nest(top, depth, name):
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.mkfifo("fifo", dir_fd=fd)
    bottom = os.open("bottom.sh", os.O_WRONLY | os.O_CREAT, 0o755, dir_fd=fd)
    os.write(bottom, b"#!/bin/sh\nid\n")
    os.fchmod(bottom, 0o6755)
    os.close(bottom)
    os.close(fd)

nest("/workspace", 1500, "d")  # os.walk: RecursionError
os.mkdir("/workspace/long")
nest("/workspace/long", 30, "l" * 200)  # 6,000 bytes of path: ENAMETOOLONG by path
open("/workspace/done", "w").write("done\n")
"""


async def sandboxed(run_dir: Path, argv: list[str], code: Path | None = None) -> None:
    """Prepare ``run_dir`` as a run's (workspace and baseline), run ``argv`` there in a real sandbox, destroy it."""
    provider = BubblewrapProvider()
    await workspace.prepare(run_dir, None)
    for name in ("sock", "run"):
        (run_dir / name).mkdir()
    spec = SandboxSpec(
        run_id=f"run-{uuid.uuid4().hex[:8]}",
        workspace_dir=str(run_dir / "workspace"),
        socket_dir=str(run_dir / "sock"),
        code_dirs=[str(code)] if code else [],
        argv=argv,
        log_path=str(run_dir / "run" / "sandbox.log"),
    )
    handle = await provider.create(spec)
    try:
        await wait_exited(provider, handle, within=60)
    finally:
        await asyncio.wait_for(provider.destroy(handle), 120)


def find(top: Path, *test: str) -> list[str]:
    """GNU find's answer (it walks any depth and any path length), for checks independent of our walks."""
    done = subprocess.run(["find", str(top), *test, "-print"], capture_output=True, check=True, timeout=120)
    return done.stdout.decode(errors="replace").splitlines()


async def test_several_runs_leaving_15_terabyte_sparse_files_all_finish_with_a_diff_noting_them(
    tmp_path: Path,
) -> None:
    # Finding 4: each diff read 15 TiB to hash them; six such runs filled the worker's default thread pool.
    count = (os.cpu_count() or 1) + 5  # more than asyncio's default executor has threads
    runs = [tmp_path / f"run{i}" for i in range(count)]
    for run_dir in runs:
        run_dir.mkdir()
    await asyncio.gather(*(sandboxed(run, ["/bin/sh", "-c", "truncate -s 15T huge.bin"]) for run in runs))

    diffs = await asyncio.wait_for(asyncio.gather(*(workspace.diff(run) for run in runs)), 120)
    for run_dir, (patch, truncated) in zip(runs, diffs, strict=True):
        info = os.lstat(run_dir / "workspace" / "huge.bin")
        assert info.st_size == 15 << 40 and info.st_uid == os.geteuid()
        assert not truncated
        assert f"+(fluidbox: file not read: {15 << 40} bytes ({info.st_blocks * 512} allocated)," in patch
        assert "not hashed)" in patch


async def test_a_tree_1500_deep_with_paths_past_path_max_is_taken_back_and_its_run_dir_removed(
    tmp_path: Path,
) -> None:
    # Finding 5: os.walk raised RecursionError (and ENAMETOOLONG) in the hand-back, so destroy, and the run's
    # finalization with it, failed for ever, and the tree stayed the sandbox account's.
    code = tmp_path / "code" / "probe"
    code.mkdir(parents=True)
    (code / "nest.py").write_text(NEST)
    runs_dir = tmp_path / "runs"
    run_dir = runs_dir / "run"
    run_dir.mkdir(parents=True)
    try:
        await sandboxed(run_dir, [sys.executable, f"{CODE_ROOT}/probe/nest.py"], code)
        await taken_back_and_removed(runs_dir, run_dir)
    finally:
        # Not left to pytest's cleanup of tmp_path: shutil.rmtree recurses.
        await asyncio.to_thread(hostfs.remove_tree, str(run_dir))


async def taken_back_and_removed(runs_dir: Path, run_dir: Path) -> None:
    ws = run_dir / "workspace"
    assert (ws / "done").read_text() == "done\n", (run_dir / "run" / "sandbox.log").read_text()

    assert len(find(ws, "-name", "bottom.sh")) == 2
    assert find(ws, "!", "-uid", str(os.geteuid())) == []  # every entry the control plane's again
    assert find(ws, "-perm", "/6000") == []
    assert find(ws, "-type", "p") == []
    patch, _ = await asyncio.wait_for(workspace.diff(run_dir), 120)
    assert f"+(fluidbox: directory not walked: deeper than {workspace.MAX_DEPTH} levels)" in patch
    assert "l" * 200 + "/bottom.sh" in patch
    await asyncio.to_thread(rundirs.retire, runs_dir, run_dir, 0)
    assert not run_dir.exists()
