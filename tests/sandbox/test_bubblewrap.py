"""The bwrap provider, proven from inside real sandboxes.

A probe script runs in a sandbox, looks around, and writes what it saw to /workspace/report.json; the
assertions are made on the host. Every sandbox started here is destroyed in a ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from config.settings import SandboxSettings
from core.ports import SandboxHandle, SandboxSpec
from sandbox.bubblewrap import (
    CODE_ROOT,
    MASK_CACHE_SECS,
    PIDFILE_NAME,
    PROC_READ_ONLY,
    STAGE_ROOT,
    BubblewrapProvider,
    HiddenPath,
    SandboxError,
    bwrap_available,
    stage_plan,
    unreadable_paths,
)
from sandbox.registry import make_provider
from tests.helpers import eventually

PROJECT_ROOT = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(bwrap_available() is None, reason="bwrap is not installed")

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]

PROBE = r"""
import json, os, socket

cfg = json.loads(os.environ["PROBE_CONFIG"])


def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except BaseException as exc:
        err = getattr(exc, "errno", None)
        return {"ok": False, "error": type(exc).__name__, "errno": err, "msg": str(exc)}


def tcp(host, port):
    with socket.create_connection((host, port), timeout=2):
        return "connected"


def read(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def write(path):
    with open(path, "w") as f:
        f.write("written from inside")
    return path


def tree(top, stop_at):
    seen = []
    for dirpath, dirnames, filenames in os.walk(top):
        seen += [os.path.join(dirpath, n) for n in dirnames + filenames]
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in stop_at]
    return seen


def http_over_unix(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def open_fds():
    fds = []
    for fd in range(256):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            pass
    return fds


fds_at_start = open_fds()


def take_secrets():
    fd = int(os.environ["FLUIDBOX_SECRETS_FD"])
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data.decode()


status = dict(line.split(":\t", 1) for line in read("/proc/self/status").splitlines() if ":\t" in line)
raw_env = read("/proc/self/environ")
report = {
    "uid": [os.getuid(), os.geteuid(), os.getgid(), os.getegid()],
    "pid": os.getpid(),
    "proc_pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "hostname": socket.gethostname(),
    "caps": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")},
    "proc_environ": dict(kv.split("=", 1) for kv in raw_env.split("\0") if kv),
    "os_environ": dict(os.environ),
    "all_environs": {
        p: attempt(lambda p=p: read(f"/proc/{p}/environ")) for p in os.listdir("/proc") if p.isdigit()
    },
    "fds": fds_at_start,
    "interfaces": [name for _, name in socket.if_nameindex()],
    "tcp": {ip: attempt(lambda ip=ip: tcp(ip, cfg["tcp_port"])) for ip in cfg["tcp_hosts"]},
    "dns": attempt(lambda: socket.getaddrinfo(cfg["dns_name"], 443)),
    "reads": {p: attempt(lambda p=p: read(p)) for p in cfg["read_paths"]},
    "exists": {p: os.path.exists(p) for p in cfg["exists_paths"]},
    "listings": {p: attempt(lambda p=p: sorted(os.listdir(p))) for p in cfg["list_paths"]},
    "root_tree": tree("/root", set(cfg["python_prefixes"])),
    "writes": {p: attempt(lambda p=p: write(p)) for p in cfg["write_paths"]},
    "gateway": attempt(lambda: http_over_unix("/run/fluidbox/api.sock")),
    "secrets": attempt(take_secrets),
    "fds_after_secrets": open_fds(),
    "all_cmdlines": {
        p: attempt(lambda p=p: read(f"/proc/{p}/cmdline")) for p in os.listdir("/proc") if p.isdigit()
    },
}
with open("/workspace/report.json.tmp", "w") as f:
    json.dump(report, f)
os.rename("/workspace/report.json.tmp", "/workspace/report.json")
"""


def make_spec(
    base: Path,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    code_dirs: list[str] | None = None,
    run_id: str | None = None,
    secrets: dict[str, str] | None = None,
) -> SandboxSpec:
    for name in ("ws", "sock", "run"):
        (base / name).mkdir(parents=True, exist_ok=True)
    return SandboxSpec(
        run_id=run_id or f"run-{uuid.uuid4().hex[:8]}",
        workspace_dir=str(base / "ws"),
        socket_dir=str(base / "sock"),
        code_dirs=code_dirs or [],
        env=env or {},
        secrets=secrets or {},
        argv=argv,
        log_path=str(base / "run" / "sandbox.log"),
    )


async def wait_exited(provider: BubblewrapProvider, handle: SandboxHandle, within: float = 15.0) -> None:
    async def exited() -> bool:
        return await provider.status(handle) == "exited"

    await eventually(exited, timeout=within, interval=0.01)


def process_alive(pid: int, start_time: str) -> bool:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    rest = data[data.rindex(b")") + 2 :].split()
    return rest[19].decode() == start_time and rest[0] not in (b"Z", b"X")


SIOCGIFADDR = 0x8915


def host_ipv4s() -> list[str]:
    ips = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            ips.append(socket.inet_ntoa(packed[20:24]))
    return sorted(set(ips) | {"127.0.0.1"})


def option_args(argv: list[str]) -> list[tuple[str, ...]]:
    """Split a bwrap argv (up to ``--``) into (option, *arguments) tuples."""
    arity = {
        "--ro-bind": 2,
        "--ro-bind-try": 2,
        "--bind": 2,
        "--symlink": 2,
        "--setenv": 2,
        "--tmpfs": 1,
        "--dev": 1,
        "--proc": 1,
        "--dir": 1,
        "--remount-ro": 1,
        "--chdir": 1,
        "--uid": 1,
        "--gid": 1,
        "--hostname": 1,
        "--cap-drop": 1,
    }
    out: list[tuple[str, ...]] = []
    i = 1
    while argv[i] != "--":
        n = arity.get(argv[i], 0)
        out.append(tuple(argv[i : i + 1 + n]))
        i += 1 + n
    return out


# ---------------------------------------------------------------- pure argv building


def test_build_argv_mounts_tmpfs_before_python_prefixes_and_never_dies_with_parent(tmp_path: Path) -> None:
    provider = BubblewrapProvider(python_prefixes=["/opt/py/venv", "/opt/py/base"])
    argv = provider.build_argv(make_spec(tmp_path, ["true"]))
    opts = option_args(argv)

    assert "--die-with-parent" not in argv
    for mount in [("--tmpfs", "/tmp"), ("--dev", "/dev"), ("--proc", "/proc"), ("--dir", "/run")]:
        for prefix in ("/opt/py/venv", "/opt/py/base"):
            assert opts.index(mount) < opts.index(("--ro-bind", prefix, prefix))
    for flag in ["--unshare-all", "--unshare-user", "--new-session", "--clearenv"]:
        assert (flag,) in opts
    assert ("--uid", "1000") in opts
    assert ("--cap-drop", "ALL") in opts
    assert argv[argv.index("--") + 1 :] == ["true"]


def test_build_argv_binds_only_declared_host_paths_and_only_the_workspace_writable(tmp_path: Path) -> None:
    code = tmp_path / "code" / "mypkg"
    code.mkdir(parents=True)
    provider = BubblewrapProvider(python_prefixes=["/opt/py/venv", "/opt/py/base", "/opt/py/venv"])
    spec = make_spec(tmp_path, ["true"], code_dirs=[str(code)])
    opts = option_args(provider.build_argv(spec))

    assert [o for o in opts if o[0] == "--bind"] == [("--bind", spec.workspace_dir, "/workspace")]
    assert {o for o in opts if o[0] == "--ro-bind"} == {
        ("--ro-bind", "/usr", "/usr"),
        ("--ro-bind", "/etc", "/etc"),
        ("--ro-bind", "/opt/py/venv", "/opt/py/venv"),
        ("--ro-bind", "/opt/py/base", "/opt/py/base"),
        ("--ro-bind", str(code), f"{CODE_ROOT}/mypkg"),
        ("--ro-bind", spec.socket_dir, "/run/fluidbox"),
    }
    # The only optional binds are the kernel knobs laid read-only over the sandbox's own /proc.
    assert [o for o in opts if o[0] == "--ro-bind-try"] == [("--ro-bind-try", p, p) for p in PROC_READ_ONLY]
    assert opts.index(("--proc", "/proc")) < opts.index(("--ro-bind-try", "/proc/sys", "/proc/sys"))
    assert not any(o[0] in ("--dev-bind", "--bind-try", "--file") for o in opts)
    assert opts.index(("--remount-ro", "/")) > opts.index(("--bind", spec.workspace_dir, "/workspace"))


def test_build_argv_binds_staged_sources_at_their_usual_places(tmp_path: Path) -> None:
    code = tmp_path / "code" / "mypkg"
    code.mkdir(parents=True)
    provider = BubblewrapProvider(python_prefixes=["/opt/py/venv"])
    spec = make_spec(tmp_path, ["true"], code_dirs=[str(code)])
    staged = stage_plan(["/opt/py/venv", str(code), spec.socket_dir, spec.workspace_dir])
    opts = option_args(provider.build_argv(spec, staged=staged))

    assert sorted(staged.values()) == [f"{STAGE_ROOT}/{i}" for i in range(4)]
    assert ("--bind", staged[spec.workspace_dir], "/workspace") in opts
    assert ("--ro-bind", staged["/opt/py/venv"], "/opt/py/venv") in opts
    assert ("--ro-bind", staged[str(code)], f"{CODE_ROOT}/mypkg") in opts
    assert ("--ro-bind", staged[spec.socket_dir], "/run/fluidbox") in opts
    assert ("--ro-bind", "/usr", "/usr") in opts


def test_build_argv_environment_defaults_yield_to_the_spec_env(tmp_path: Path) -> None:
    provider = BubblewrapProvider(python_prefixes=["/opt/py/venv", "/opt/py/base"])

    def setenvs(env: dict[str, str]) -> dict[str, str]:
        argv = provider.build_argv(make_spec(tmp_path, ["true"], env=env))
        return {o[1]: o[2] for o in option_args(argv) if o[0] == "--setenv"}

    defaults = setenvs({})
    overridden = setenvs({"PATH": "/x", "FOO": "bar"})

    assert defaults == {
        "PATH": "/opt/py/venv/bin:/opt/py/base/bin:/usr/bin:/bin",
        "HOME": "/workspace",
        "PYTHONPATH": "/opt/fluidbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "FLUIDBOX_SECRETS_FD": "4",
    }
    assert overridden == {**defaults, "PATH": "/x", "FOO": "bar"}


def test_build_argv_masks_hidden_paths_after_binding_etc(tmp_path: Path) -> None:
    secret_dir = tmp_path / "private"
    secret_dir.mkdir()
    provider = BubblewrapProvider(python_prefixes=["/opt/py/venv"])
    spec = make_spec(tmp_path, ["true"])
    masked = [HiddenPath("/etc/shadow", is_dir=False), HiddenPath(str(secret_dir), is_dir=True)]
    opts = option_args(provider.build_argv(spec, masked=masked))

    etc = opts.index(("--ro-bind", "/etc", "/etc"))
    assert opts.index(("--ro-bind", "/dev/null", "/etc/shadow")) > etc
    assert etc < opts.index(("--tmpfs", str(secret_dir))) < opts.index(("--remount-ro", str(secret_dir)))


def test_build_argv_skips_python_prefixes_already_under_usr(tmp_path: Path) -> None:
    provider = BubblewrapProvider(python_prefixes=["/opt/py/venv", "/usr"])
    opts = option_args(provider.build_argv(make_spec(tmp_path, ["true"])))

    assert opts.count(("--ro-bind", "/usr", "/usr")) == 1
    assert ("--setenv", "PATH", "/opt/py/venv/bin:/usr/bin:/bin") in opts


def test_build_argv_rejects_code_dirs_that_would_share_a_mount_point(tmp_path: Path) -> None:
    (tmp_path / "a" / "pkg").mkdir(parents=True)
    (tmp_path / "b" / "pkg").mkdir(parents=True)
    spec = make_spec(tmp_path, ["true"], code_dirs=[str(tmp_path / "a" / "pkg"), str(tmp_path / "b" / "pkg")])

    with pytest.raises(ValueError, match="pkg"):
        BubblewrapProvider().build_argv(spec)


def test_build_argv_rejects_relative_paths(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, ["true"]).model_copy(update={"workspace_dir": "ws"})

    with pytest.raises(ValueError, match="absolute"):
        BubblewrapProvider().build_argv(spec)


def test_build_argv_rejects_an_empty_command_and_an_unnamed_code_dir(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        BubblewrapProvider().build_argv(make_spec(tmp_path, []))
    with pytest.raises(ValueError, match="no name"):
        BubblewrapProvider().build_argv(make_spec(tmp_path, ["true"], code_dirs=["/"]))


def test_unreadable_paths_lists_what_other_users_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "public.txt").write_text("ok")
    (tmp_path / "secret.txt").write_text("no")
    (tmp_path / "secret.txt").chmod(0o600)
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "inside.txt").write_text("no")
    (tmp_path / "locked").chmod(0o700)
    (tmp_path / "link").symlink_to(tmp_path / "secret.txt")

    assert unreadable_paths(str(tmp_path)) == [
        HiddenPath(str(tmp_path / "locked"), is_dir=True),
        HiddenPath(str(tmp_path / "secret.txt"), is_dir=False),
    ]


def test_one_walk_of_a_masked_root_serves_sandboxes_for_a_short_while(tmp_path: Path) -> None:
    clock = [1000.0]
    (tmp_path / "a.txt").write_text("ok")
    assert unreadable_paths(str(tmp_path), now=lambda: clock[0]) == []
    (tmp_path / "a.txt").chmod(0o600)
    clock[0] += MASK_CACHE_SECS / 2
    assert unreadable_paths(str(tmp_path), now=lambda: clock[0]) == []  # the walk is reused
    clock[0] += MASK_CACHE_SECS
    assert unreadable_paths(str(tmp_path), now=lambda: clock[0]) == [HiddenPath(str(tmp_path / "a.txt"), False)]


def test_make_provider_builds_bwrap_and_names_known_providers_on_unknown() -> None:
    assert isinstance(make_provider(), BubblewrapProvider)
    with pytest.raises(ValueError, match="known: bwrap, kubernetes"):
        make_provider(SandboxSettings(provider="firecracker"))


# ---------------------------------------------------------------- isolation, proven from inside


@pytest_asyncio.fixture(scope="module")
async def probe(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """Run the probe once in a real sandbox and hand its report plus the host-side facts to the tests."""
    base = tmp_path_factory.mktemp("probe")
    code = base / "code" / "probe"
    code.mkdir(parents=True)
    (code / "probe.py").write_text(PROBE)
    canary_secret = f"canary-{uuid.uuid4().hex}"
    canary_file = base / "host-secret.txt"
    canary_file.write_text(canary_secret)
    host_tmp_name = f"/tmp/fluidbox-probe-{uuid.uuid4().hex[:8]}"

    requests: list[bytes] = []

    async def gateway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nfrom-gateway!")
        await writer.drain()
        writer.close()

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    # The negative result inside only means something if the port answers on the host.
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass

    provider = BubblewrapProvider()
    config = {
        "tcp_port": port,
        "tcp_hosts": host_ipv4s(),
        "dns_name": "example.com",
        "python_prefixes": provider.python_prefixes,
        "read_paths": [str(canary_file), "/etc/shadow"],
        "exists_paths": [str(canary_file), str(PROJECT_ROOT / "pyproject.toml"), host_tmp_name],
        "list_paths": [str(PROJECT_ROOT), "/root", "/tmp"],
        "write_paths": [
            "/workspace/hello.txt",
            f"{host_tmp_name}",
            "/etc/fluidbox-probe",
            "/usr/fluidbox-probe",
            f"{CODE_ROOT}/fluidbox-probe",
            f"{CODE_ROOT}/probe/fluidbox-probe",
            "/fluidbox-probe",
            "/run/fluidbox/fluidbox-probe",
            f"{sys.base_prefix}/fluidbox-probe",
        ],
    }
    spec_env = {"PROBE_CONFIG": json.dumps(config), "FLUIDBOX_RUN_ID": "probe-run"}
    argv = [sys.executable, f"{CODE_ROOT}/probe/probe.py"]
    secret_token = f"fbx_sess_{uuid.uuid4().hex}"
    spec = make_spec(base, argv, env=spec_env, code_dirs=[str(code)], secrets={"FLUIDBOX_SESSION_TOKEN": secret_token})
    server = await asyncio.start_unix_server(gateway, path=str(Path(spec.socket_dir) / "api.sock"))
    os.chmod(Path(spec.socket_dir) / "api.sock", 0o666)  # as api/serve.py does: sandboxes run as another account
    old_token = os.environ.get("FLUIDBOX_ADMIN_TOKEN")
    os.environ["FLUIDBOX_ADMIN_TOKEN"] = canary_secret
    handle = None
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        handle = await provider.create(spec)
        await wait_exited(provider, handle)
        elapsed = loop.time() - started
        report_path = Path(spec.workspace_dir) / "report.json"
        if not await asyncio.to_thread(report_path.exists):
            pytest.fail(f"probe wrote no report; log: {await asyncio.to_thread(Path(spec.log_path).read_text)}")
        yield {
            "report": json.loads(await asyncio.to_thread(report_path.read_text)),
            "host_tmp_exists": await asyncio.to_thread(os.path.exists, host_tmp_name),
            "spec": spec,
            "handle": handle,
            "requests": requests,
            "canary_secret": canary_secret,
            "secret_token": secret_token,
            "canary_file": str(canary_file),
            "host_tmp_name": host_tmp_name,
            "port": port,
            "provider": provider,
            "elapsed": elapsed,
        }
    finally:
        if handle is not None:
            await provider.destroy(handle)
        if old_token is None:
            os.environ.pop("FLUIDBOX_ADMIN_TOKEN", None)
        else:
            os.environ["FLUIDBOX_ADMIN_TOKEN"] = old_token
        server.close()
        await server.wait_closed()
        listener.close()
        await asyncio.to_thread(Path(host_tmp_name).unlink, missing_ok=True)


@needs_bwrap
async def test_sandbox_cannot_reach_a_port_the_host_listens_on(probe: dict[str, Any]) -> None:
    report = probe["report"]

    assert report["interfaces"] == ["lo"]
    assert report["tcp"], "no host address was probed"
    for ip, outcome in report["tcp"].items():
        assert not outcome["ok"], f"connected to host {ip}:{probe['port']} from inside"
        assert outcome["errno"] in (errno.ECONNREFUSED, errno.ENETUNREACH), outcome


@needs_bwrap
async def test_sandbox_cannot_resolve_names(probe: dict[str, Any]) -> None:
    dns = probe["report"]["dns"]

    assert not dns["ok"]
    assert dns["error"] == "gaierror"


@needs_bwrap
async def test_host_files_outside_the_binds_are_invisible(probe: dict[str, Any]) -> None:
    report = probe["report"]
    prefixes = probe["provider"].python_prefixes

    assert report["reads"][probe["canary_file"]]["error"] == "FileNotFoundError"
    assert report["exists"] == {
        probe["canary_file"]: False,
        str(PROJECT_ROOT / "pyproject.toml"): False,
        probe["host_tmp_name"]: False,
    }
    # The venv lives inside the project: only it shows, never the project's source.
    assert report["listings"][str(PROJECT_ROOT)]["value"] == [".venv"]
    # Private tmpfs: nothing of the host (but the path down to a bound Python install, when the venv
    # lives under /tmp as in a CI clone).
    bound = {Path(p).relative_to("/tmp").parts[0] for p in (sys.prefix, sys.base_prefix) if p.startswith("/tmp/")}
    assert sorted(report["listings"]["/tmp"]["value"]) == sorted(bound)
    assert not probe["host_tmp_exists"], "/tmp inside must be private"
    # /root holds nothing but the path down to a bound Python install (pyenv lives under /root here).
    for path in report["root_tree"]:
        assert any(p == path or p.startswith(path + "/") for p in prefixes), path
    assert probe["canary_secret"] not in json.dumps(report)


@needs_bwrap
async def test_root_only_host_files_are_masked(probe: dict[str, Any]) -> None:
    if not await asyncio.to_thread(os.path.exists, "/etc/shadow"):
        pytest.skip("no /etc/shadow on this host")
    shadow = probe["report"]["reads"]["/etc/shadow"]

    # The sandbox account could not read it anyway; the mask also covers a worker that is that file's owner.
    assert not shadow["ok"] or shadow["value"] == ""


@needs_bwrap
async def test_everything_but_workspace_and_private_tmp_is_read_only(probe: dict[str, Any]) -> None:
    writes = dict(probe["report"]["writes"])

    assert writes.pop("/workspace/hello.txt")["ok"]
    assert writes.pop(probe["host_tmp_name"])["ok"]
    for path, outcome in writes.items():
        assert not outcome["ok"], f"wrote {path} from inside"
        assert outcome["errno"] in (errno.EROFS, errno.EACCES, errno.EPERM), (path, outcome)


@needs_bwrap
async def test_workspace_writes_are_visible_on_the_host(probe: dict[str, Any]) -> None:
    assert (Path(probe["spec"].workspace_dir) / "hello.txt").read_text() == "written from inside"


@needs_bwrap
async def test_environment_is_exactly_the_spec_env_plus_defaults(probe: dict[str, Any]) -> None:
    report = probe["report"]
    spec = probe["spec"]
    venv_bin = f"{sys.prefix}/bin"
    expected = {
        **spec.env,
        "PATH": report["proc_environ"]["PATH"],
        "HOME": "/workspace",
        "PYTHONPATH": "/opt/fluidbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "FLUIDBOX_SECRETS_FD": "4",
        "PWD": "/workspace",  # bwrap sets it on --chdir
    }

    assert report["proc_environ"] == expected
    assert report["proc_environ"]["PATH"].startswith(venv_bin + ":")
    assert report["proc_environ"]["PATH"].endswith(":/usr/bin:/bin")
    # Python's C-locale coercion (PEP 538) adds LC_CTYPE to os.environ itself; nothing else may appear.
    assert {k: v for k, v in report["os_environ"].items() if k != "LC_CTYPE"} == expected
    assert "FLUIDBOX_ADMIN_TOKEN" not in report["os_environ"]
    for pid, outcome in report["all_environs"].items():
        leak = probe["canary_secret"] in outcome.get("value", "")
        assert not leak, f"/proc/{pid}/environ inside shows the worker's environment"


@needs_bwrap
async def test_secrets_reach_only_the_command_on_a_pipe_and_no_command_line_or_environment(
    probe: dict[str, Any],
) -> None:
    report = probe["report"]
    token = probe["secret_token"]
    assert report["secrets"]["ok"], report["secrets"]
    assert json.loads(report["secrets"]["value"]) == {"FLUIDBOX_SESSION_TOKEN": token}
    for pid, outcome in report["all_cmdlines"].items():
        assert token not in outcome.get("value", ""), f"/proc/{pid}/cmdline inside shows a secret"
    for pid, outcome in report["all_environs"].items():
        assert token not in outcome.get("value", ""), f"/proc/{pid}/environ inside shows a secret"
    assert report["all_cmdlines"]["1"]["value"].split("\0")[1:3] == ["--args", "3"]


@needs_bwrap
async def test_sandbox_runs_unprivileged_in_its_own_namespaces(probe: dict[str, Any]) -> None:
    report = probe["report"]

    assert report["uid"] == [1000, 1000, 1000, 1000]
    assert report["caps"]["CapEff"] == "0000000000000000"
    assert report["caps"]["CapPrm"] == "0000000000000000"
    assert report["caps"]["CapBnd"] == "0000000000000000"
    assert report["caps"]["NoNewPrivs"] == "1"
    assert report["pid"] <= 3
    assert max(report["proc_pids"]) <= 3
    assert report["hostname"] == "sandbox"
    # Only the secrets pipe (4) joins the standard three, and it is gone once read.
    assert report["fds"] == [0, 1, 2, 4], "no host descriptor may leak into the sandbox"
    assert report["fds_after_secrets"] == [0, 1, 2]


@needs_bwrap
async def test_gateway_socket_directory_is_reachable(probe: dict[str, Any]) -> None:
    gateway = probe["report"]["gateway"]

    assert gateway["ok"], gateway
    assert gateway["value"].startswith("HTTP/1.1 200 OK")
    assert gateway["value"].endswith("from-gateway!")
    assert probe["requests"][0].startswith(b"GET /ping HTTP/1.1\r\n")


# ---------------------------------------------------------------- lifecycle


@needs_bwrap
async def test_create_is_idempotent_while_the_sandbox_runs(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    spec = make_spec(tmp_path, SLEEPER)
    first = await provider.create(spec)
    try:
        second = await provider.create(spec)

        assert second.pid == first.pid
        assert second.start_time == first.start_time
        assert await provider.status(second) == "running"
        assert json.loads((tmp_path / "run" / PIDFILE_NAME).read_text())["pid"] == first.pid
    finally:
        await provider.destroy(first)


def launch_servers() -> list[int]:
    """This test process's running launcher servers (``_launcher.py --serve``)."""
    found = []
    for kid in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in kid.read_text().split():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"--serve" in cmd and any(part.endswith(b"_launcher.py") for part in cmd):
                    found.append(int(pid))
    return found


def sockets_held(pid: int) -> list[str]:
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:"):
                held.append(target)
    return held


@needs_bwrap
async def test_one_launcher_serves_many_sandboxes_and_a_killed_one_is_replaced(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    handles: list[SandboxHandle] = []
    try:
        for n in range(2):
            handles.append(await provider.create(make_spec(tmp_path / str(n), SLEEPER)))
        [server] = launch_servers()  # both sandboxes from one launcher process
        for handle in handles:
            assert await provider.status(handle) == "running"
            # Neither bwrap nor the sandbox keeps a socket of the launcher's (or the worker's).
            assert sockets_held(handle.pid) == [] and sockets_held(int(handle.extra["child_pid"])) == []

        os.kill(server, signal.SIGKILL)

        async def replaced_next_time() -> bool:
            return server not in launch_servers()

        await eventually(replaced_next_time)
        handles.append(await provider.create(make_spec(tmp_path / "2", SLEEPER)))

        assert await provider.status(handles[-1]) == "running"
        assert launch_servers() not in ([], [server])
    finally:
        for handle in handles:
            await provider.destroy(handle)
        provider.close()
    assert launch_servers() == []  # closing the provider ends its launcher


@needs_bwrap
async def test_create_after_exit_starts_a_fresh_sandbox(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    spec = make_spec(tmp_path, [sys.executable, "-c", "pass"])
    first = await provider.create(spec)
    second = None
    try:
        await wait_exited(provider, first)
        second = await provider.create(spec)

        assert (second.pid, second.start_time) != (first.pid, first.start_time)
    finally:
        await provider.destroy(first)
        if second is not None:
            await provider.destroy(second)


@needs_bwrap
async def test_status_moves_from_running_to_exited_when_the_command_ends(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    waiter = "import os, time\nwhile not os.path.exists('/workspace/go'):\n    time.sleep(0.01)\n"
    spec = make_spec(tmp_path, [sys.executable, "-c", waiter])
    handle = await provider.create(spec)
    try:
        assert await provider.status(handle) == "running"

        (Path(spec.workspace_dir) / "go").touch()

        await wait_exited(provider, handle)
        assert not process_alive(int(handle.extra["child_pid"]), handle.extra["child_start_time"])
    finally:
        await provider.destroy(handle)


@needs_bwrap
async def test_destroy_kills_a_long_running_sandbox_and_may_be_repeated(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    handle = await provider.create(make_spec(tmp_path, SLEEPER))
    try:
        assert await provider.status(handle) == "running"
        loop = asyncio.get_running_loop()
        started = loop.time()

        await provider.destroy(handle, grace_secs=10.0)

        # Well inside the grace period: SIGTERM reached the agent itself, no SIGKILL was needed.
        assert loop.time() - started < 5.0
        assert await provider.status(handle) == "exited"
        assert not process_alive(int(handle.extra["child_pid"]), handle.extra["child_start_time"])
        assert not (tmp_path / "run" / PIDFILE_NAME).exists()
        await provider.destroy(handle)
    finally:
        await provider.destroy(handle)


@needs_bwrap
async def test_destroy_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    stubborn = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open('/workspace/ready', 'w').close()\ntime.sleep(300)\n"
    )
    spec = make_spec(tmp_path, [sys.executable, "-c", stubborn])
    handle = await provider.create(spec)
    try:

        async def ready() -> bool:
            return (Path(spec.workspace_dir) / "ready").exists()

        await eventually(ready, timeout=15, interval=0.01)
        loop = asyncio.get_running_loop()
        started = loop.time()

        await provider.destroy(handle, grace_secs=0.2)

        assert await provider.status(handle) == "exited"
        assert loop.time() - started < 5.0
    finally:
        await provider.destroy(handle)


@needs_bwrap
async def test_destroy_reaches_the_sandbox_even_after_bwrap_itself_was_killed(tmp_path: Path) -> None:
    provider = BubblewrapProvider()
    handle = await provider.create(make_spec(tmp_path, SLEEPER))
    try:
        os.kill(handle.pid, signal.SIGKILL)
        # bwrap gone, its orphaned init and the agent keep running: that is still a live sandbox.
        assert await provider.status(handle) == "running"

        await provider.destroy(handle)

        assert await provider.status(handle) == "exited"
        assert not process_alive(int(handle.extra["child_pid"]), handle.extra["child_start_time"])
    finally:
        await provider.destroy(handle)


@needs_bwrap
async def test_sandbox_survives_the_exit_of_the_process_that_launched_it(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, SLEEPER)
    script = (
        "import asyncio, sys\n"
        f"sys.path.insert(0, {str(PROJECT_ROOT)!r})\n"
        "from core.ports import SandboxSpec\n"
        "from sandbox.bubblewrap import BubblewrapProvider\n"
        "spec = SandboxSpec.model_validate_json(sys.argv[1])\n"
        "print(asyncio.run(BubblewrapProvider().create(spec)).model_dump_json())\n"
    )
    launcher = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, spec.model_dump_json(), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(launcher.communicate(), 30)
    assert launcher.returncode == 0
    handle = SandboxHandle.model_validate_json(out.decode().strip().splitlines()[-1])
    provider = BubblewrapProvider()
    try:
        assert await provider.status(handle) == "running"
        # A restarted worker reattaches through the pidfile instead of starting a second sandbox.
        assert (await provider.create(spec)).pid == handle.pid
    finally:
        await provider.destroy(handle)
    assert await provider.status(handle) == "exited"


@needs_bwrap
async def test_a_recycled_pid_is_neither_running_nor_killed(tmp_path: Path) -> None:
    bystander = await asyncio.create_subprocess_exec(*SLEEPER)
    try:
        stranger = SandboxHandle(
            provider="bwrap", run_id="r", pid=bystander.pid, start_time=1, log_path=str(tmp_path / "sandbox.log")
        )
        provider = BubblewrapProvider()

        assert await provider.status(stranger) == "exited"
        await provider.destroy(stranger, grace_secs=0.05)
        assert bystander.returncode is None
        assert await asyncio.to_thread(os.path.exists, f"/proc/{bystander.pid}")
    finally:
        bystander.kill()
        await bystander.wait()


async def test_create_fails_clearly_without_bwrap_or_with_a_missing_workspace(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, ["true"])

    with pytest.raises(SandboxError, match="bwrap not found"):
        await BubblewrapProvider(bwrap_path=str(tmp_path / "no-bwrap")).create(spec)
    with pytest.raises(SandboxError, match="not a directory"):
        await BubblewrapProvider().create(spec.model_copy(update={"workspace_dir": str(tmp_path / "gone")}))


async def test_a_handle_without_a_pid_is_missing_and_destroy_is_a_no_op() -> None:
    provider = BubblewrapProvider()
    empty = SandboxHandle(provider="bwrap", run_id="r")

    assert await provider.status(empty) == "missing"
    await provider.destroy(empty)


def run_spec(runs: Path, name: str, argv: list[str]) -> SandboxSpec:
    """A spec laid out as the worker lays runs out: its log (and so its pidfile) in ``runs/<run id>/``."""
    spec = make_spec(runs.parent / name, argv)
    return spec.model_copy(update={"log_path": str(runs / spec.run_id / "sandbox.log")})


@needs_bwrap
async def test_the_provider_lists_the_live_sandboxes_recorded_under_its_state_dir(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    provider = BubblewrapProvider(state_dir=str(runs))
    live = await provider.create(run_spec(runs, "live", SLEEPER))
    done = await provider.create(run_spec(runs, "done", ["true"]))
    # A pidfile whose pid now names another process (recycled: another start time) is no sandbox.
    bystander = await asyncio.create_subprocess_exec(*SLEEPER)
    (runs / "recycled").mkdir()
    recycled = SandboxHandle(provider="bwrap", run_id="recycled", pid=bystander.pid, start_time=1)
    (runs / "recycled" / PIDFILE_NAME).write_text(recycled.model_dump_json())
    try:
        await wait_exited(provider, done)

        assert await provider.sandboxes() == [live.run_id]
        assert await BubblewrapProvider().sandboxes() == []  # no state dir: nothing recorded to look at

        # The orphan sweep names a run only: that is enough to end its sandbox.
        await provider.destroy(SandboxHandle(provider="bwrap", run_id=live.run_id), grace_secs=0)
        assert await provider.status(live) == "exited"
        assert await provider.sandboxes() == []
        await provider.destroy(SandboxHandle(provider="bwrap", run_id="recycled"), grace_secs=0)
        assert bystander.returncode is None and process_alive(bystander.pid, _start_time(bystander.pid))
    finally:
        bystander.kill()
        await bystander.wait()
        await provider.destroy(live)
        await provider.destroy(done)


def _start_time(pid: int) -> str:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return data[data.rindex(b")") + 2 :].split()[19].decode()
