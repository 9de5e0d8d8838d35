"""Settings, read once at process start from ``FLUIDBOX_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class SandboxSettings(BaseModel):
    """The execution provider's settings as one group (what ``sandbox.registry.make_provider`` takes).

    The environment keeps its flat names (``FLUIDBOX_SANDBOX_MEMORY_MB``, ``FLUIDBOX_KUBE_NAMESPACE``…, which
    clients and deployments already set); :attr:`Settings.sandbox` gathers them here, so a provider is handed
    its group rather than a dozen copied keywords. Defaults are the settings' own."""

    model_config = ConfigDict(frozen=True)

    provider: str = "bwrap"
    bwrap_path: str = "bwrap"
    limits: Literal["best-effort", "required", "off"] = "best-effort"
    memory_mb: int = 2048
    pids: int = 512
    syscall_filter: bool = True
    user: str = "fluidbox-sandbox"
    state_dir: Path | None = None  # where bubblewrap sandboxes' run directories are (its orphan listing)
    kube_namespace: str = "fluidbox-sandboxes"
    kube_config: Path | None = None
    runner_image: str = "ghcr.io/fluidbox/runner:latest"
    kube_runtime_class: str = ""
    kube_control_namespace: str = "fluidbox"
    kube_control_port: int = 8000
    kube_allow_dns: bool = True
    cpu_millis: int = 1000
    ephemeral_mb: int = 4096


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLUIDBOX_", extra="ignore")

    home: Path = Field(default=Path(".fluidbox"))
    database_url: str | None = None
    admin_token: SecretStr | None = None

    temporal_address: str | None = None
    temporal_namespace: str = "default"
    # TLS to Temporal (a cluster or Temporal Cloud). temporal_tls alone uses the system's CA roots; the paths
    # below add a private server CA, a client certificate and key (mTLS) and the name the server's certificate
    # carries when it differs from the address's host. Any of them turns TLS on; config/temporal.py reads them.
    temporal_tls: bool = False
    temporal_tls_cert: Path | None = None
    temporal_tls_key: Path | None = None
    temporal_tls_ca: Path | None = None
    temporal_tls_server_name: str | None = None
    # Temporal Cloud API-key auth (implies TLS).
    temporal_api_key: SecretStr | None = None
    # Task queues: run workflows and their database steps on task_queue; sandbox provisioning/teardown and
    # brokered calls on queues of their own when set (unset: the runs queue, and brokered calls stay local
    # activities of the workflow's worker). A worker polls the roles in worker_queues (comma-separated).
    task_queue: str = "fluidbox-runs"
    sandbox_task_queue: str | None = None
    broker_task_queue: str | None = None
    worker_queues: str = "runs,sandbox,broker"
    temporal_port: int = 7233
    ui_port: int = 8233

    bind: str = "127.0.0.1:8787"
    gateway_socket: Path | None = None
    sandbox_provider: str = "bwrap"
    bwrap_path: str = "bwrap"
    # Per-sandbox cgroup limits (bwrap): best-effort applies what the host allows and warns about the rest,
    # required refuses to start a sandbox without them, off applies none. 0 leaves that resource unlimited.
    sandbox_limits: Literal["best-effort", "required", "off"] = "best-effort"
    sandbox_memory_mb: int = Field(default=2048, ge=0)
    sandbox_pids: int = Field(default=512, ge=0)
    # The sandbox's syscall filter (sandbox/seccomp.py): ptrace, new namespaces, mounts, io_uring, BPF… refused.
    sandbox_syscall_filter: bool = True
    # The unprivileged host account a root worker starts sandboxes as (created on first use); a worker that is
    # not root starts them as itself. Sandboxes never map onto host root.
    sandbox_user: str = Field(default="fluidbox-sandbox", min_length=1, pattern=r"^[a-z_][a-z0-9_-]*$")
    # How long a finished run's directory (its workspace copy, baseline and sandbox log) stays on the host after
    # the diff and artifacts are recorded; 0 removes it at once.
    run_dir_retention_secs: float = Field(default=0.0, ge=0)

    # The Kubernetes provider (FLUIDBOX_SANDBOX_PROVIDER=kubernetes; docs/operations.md "Running on Kubernetes").
    # One Pod per run in kube_namespace; runners reach the API's runner plane at runner_url (from inside the Pod).
    kube_namespace: str = Field(default="fluidbox-sandboxes", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    kube_config: Path | None = None  # a kubeconfig file; unset: the worker's in-cluster service account
    runner_image: str = "ghcr.io/fluidbox/runner:latest"  # the default when an agent revision names none
    runner_url: str = "http://fluidbox-api.fluidbox.svc.cluster.local:8000"
    kube_runtime_class: str = ""  # gVisor / Kata RuntimeClass for every sandbox Pod; empty: the node default
    kube_control_namespace: str = "fluidbox"  # where the API Pods run (the sandbox NetworkPolicy allows only them)
    kube_control_port: int = Field(default=8000, ge=1, le=65535)
    kube_allow_dns: bool = True  # sandbox egress to cluster DNS (to resolve runner_url); off when it is an IP
    sandbox_cpu_millis: int = Field(default=1000, ge=1)
    sandbox_ephemeral_mb: int = Field(default=4096, ge=64)
    # How often the liveness sweep looks for sandboxes whose run is over or unknown (destroyed) and for runs whose
    # workflow is gone (ended); also on each worker's first sweep.
    sandbox_orphan_sweep_secs: float = Field(default=60.0, gt=0)
    # The prepared workspace and a run's final state travel over the runner plane as gzip'd tars of at most this.
    workspace_archive_max_mb: int = Field(default=64, ge=1)

    # Worker slots (per worker process, and per task queue it polls when the queues are split). No run holds a
    # slot while it waits: liveness is a workflow timer plus a short local activity, so these bound how many
    # steps run at once, never how many runs can be live.
    worker_max_activities: int = Field(default=100, ge=1)
    worker_max_local_activities: int = Field(default=100, ge=1)
    worker_max_workflow_tasks: int = Field(default=100, ge=2)
    # Live runs whose workflow state stays in memory; past it a run's next task replays its history first.
    worker_max_cached_workflows: int = Field(default=1000, ge=0)

    # Live sandboxes this control plane runs at once (0: no limit). Past it new runs wait, status 'created'
    # with reason "waiting for sandbox capacity", and start as places free (the wait is a workflow timer).
    max_sandboxes: int = Field(default=0, ge=0)
    capacity_recheck_secs: float = Field(default=5.0, gt=0)

    # Run supervision (seconds).
    heartbeat_secs: float = 10.0
    heartbeat_stale_secs: float = 60.0
    liveness_check_secs: float = 5.0
    quiesce_secs: float = 30.0
    # A runner rides out an unreachable control plane (a restart) this long, then exits; its run fails naming it.
    gateway_staleness_secs: float = Field(default=600.0, gt=0)
    approval_recheck_secs: float = 30.0
    # A run's workflow continues as new after this many approval waits and brokered calls (Temporal: 2,000 max).
    run_move_after_updates: int = Field(default=1500, ge=1, le=1900)
    replay_delay_ms: int = 400
    token_ttl_secs: int = 3 * 3600

    max_request_body_bytes: int = 2 * 1024 * 1024
    # Bodies that may be over max_request_body_bytes (model calls, workspace archives) are received this many at
    # once per API process, each only after its token was looked up; one that finds no place within
    # large_body_wait_secs is answered 429 with Retry-After (api/guard.py).
    max_concurrent_large_bodies: int = Field(default=4, ge=1)
    large_body_wait_secs: float = Field(default=15.0, gt=0)
    # A run still 'created' this long after its insert has no workflow (its starter died in between);
    # every API process looks for such runs every stranded_check_secs and starts their workflows.
    stranded_after_secs: float = 60.0
    stranded_check_secs: float = 30.0
    # The LLM facade's own ceiling: long agent conversations are resent whole on every turn.
    llm_max_request_body_bytes: int = 32 * 1024 * 1024

    # Credential custody and outbound admission for connections.
    credential_key: SecretStr | None = None
    credential_previous_keys: list[SecretStr] = Field(default_factory=list)
    # Development and tests only: admit MCP/connector URLs on loopback (never private or metadata ranges).
    allow_loopback_connectors: bool = False
    # Development and tests only: admit result-webhook (callback) URLs on loopback; never private ranges.
    allow_loopback_callbacks: bool = False
    # The browser/client-facing base of this deployment (trigger invoke/poll URLs); default: the bind address.
    public_url: str | None = None
    # Managed app connections (/v1/mcp-oauth/catalog): the OAuth catalog entries (slugs, JSON list) this deployment
    # offers to embedding products; empty: the surface answers 503. `redirect_url`s a client may name must equal
    # one of managed_app_redirect_urls (scheme, host, port and path; a query string is kept).
    managed_apps: list[str] = Field(default_factory=list)
    managed_app_redirect_urls: list[str] = Field(default_factory=list)

    # The LLM facade: where model traffic goes, with the real key swapped in (never the sandbox's).
    llm_upstream_url: str | None = None
    llm_upstream_key: SecretStr | None = None
    anthropic_api_key: SecretStr | None = Field(default=None, validation_alias="ANTHROPIC_API_KEY")
    openai_api_key: SecretStr | None = Field(default=None, validation_alias="OPENAI_API_KEY")
    # The key a LiteLLM proxy presents on its usage callback (POST /internal/llm-usage, a stub: the facade meters).
    litellm_master_key: SecretStr | None = Field(default=None, validation_alias="LITELLM_MASTER_KEY")
    llm_max_concurrent_reservations: int = 32
    llm_reservation_ttl_secs: int = 1800
    llm_upstream_timeout_secs: float = 900.0
    llm_upstream_keepalive_secs: float = 4.0
    llm_sweep_secs: float = 10.0

    @property
    def runs_dir(self) -> Path:
        return self.home.resolve() / "runs"

    @property
    def sandbox(self) -> SandboxSettings:
        """The execution provider's group (see :class:`SandboxSettings`)."""
        return SandboxSettings(
            provider=self.sandbox_provider,
            bwrap_path=self.bwrap_path,
            limits=self.sandbox_limits,
            memory_mb=self.sandbox_memory_mb,
            pids=self.sandbox_pids,
            syscall_filter=self.sandbox_syscall_filter,
            user=self.sandbox_user,
            state_dir=self.runs_dir,
            kube_namespace=self.kube_namespace,
            kube_config=self.kube_config,
            runner_image=self.runner_image,
            kube_runtime_class=self.kube_runtime_class,
            kube_control_namespace=self.kube_control_namespace,
            kube_control_port=self.kube_control_port,
            kube_allow_dns=self.kube_allow_dns,
            cpu_millis=self.sandbox_cpu_millis,
            ephemeral_mb=self.sandbox_ephemeral_mb,
        )

    @property
    def socket_path(self) -> Path:
        return (self.gateway_socket or self.home / "gateway" / "api.sock").resolve()

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.bind.rpartition(":")
        return host or "127.0.0.1", int(port)

    @property
    def api_url(self) -> str:
        host, port = self.host_port
        return f"http://{host}:{port}"

    @property
    def temporal_target(self) -> str:
        return self.temporal_address or f"127.0.0.1:{self.temporal_port}"

    def queue_for(self, role: str) -> str:
        """The task queue a role's work goes to (``runs``, ``sandbox`` or ``broker``)."""
        if role == "sandbox" and self.sandbox_task_queue:
            return self.sandbox_task_queue
        if role == "broker" and self.broker_task_queue:
            return self.broker_task_queue
        if role not in ("runs", "sandbox", "broker"):
            raise ValueError(f"unknown task queue role {role!r} (known: runs, sandbox, broker)")
        return self.task_queue

    def credential_keys(self) -> tuple[str | None, list[str]]:
        """The current sealing key and the previous ones still accepted for opening."""
        current = self.credential_key.get_secret_value() if self.credential_key else None
        return current or None, [k.get_secret_value() for k in self.credential_previous_keys]

    def llm_key(self, dialect: str) -> str | None:
        """The real upstream key for a dialect: FLUIDBOX_LLM_UPSTREAM_KEY, else the provider's own variable."""
        for key in (self.llm_upstream_key, self.openai_api_key if dialect == "openai" else self.anthropic_api_key):
            if key is not None and key.get_secret_value():
                return key.get_secret_value()
        return None

    def llm_secrets(self) -> tuple[str, ...]:
        """Every model credential this process holds (for the redactor)."""
        keys = (self.llm_upstream_key, self.anthropic_api_key, self.openai_api_key, self.litellm_master_key)
        return tuple(k.get_secret_value() for k in keys if k is not None and k.get_secret_value())

    def require_admin_token(self) -> str:
        if self.admin_token is None or not self.admin_token.get_secret_value():
            raise RuntimeError("FLUIDBOX_ADMIN_TOKEN is not set (fluidbox up generates one into FLUIDBOX_HOME)")
        return self.admin_token.get_secret_value()


@lru_cache
def get_settings() -> Settings:
    return Settings()
