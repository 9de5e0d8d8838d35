"""What a sandbox is handed: its environment (run facts only) and its secrets (the run's tokens).

Pure: the settings it reads are named by :class:`RunnerEnvSettings` (``config.settings.Settings`` has them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from core import contract as wire
from core import dynamic_connections
from core.access import is_classified
from core.runspec import RunSpec


class RunnerEnvSettings(Protocol):
    """The deployment settings the runner's environment carries."""

    @property
    def socket_path(self) -> Path: ...

    @property
    def heartbeat_secs(self) -> float: ...

    @property
    def token_ttl_secs(self) -> int: ...

    @property
    def gateway_staleness_secs(self) -> float: ...

    @property
    def replay_delay_ms(self) -> int: ...


def runner_secrets(tokens: dict[str, str]) -> dict[str, str]:
    """The run-scoped tokens, handed over on a pipe only the runner reads (never a file, argv or env).

    The llm-audience token is the model harness's API key for the LLM facade (the replay harness ignores it).
    """
    secrets = {wire.ENV_SESSION_TOKEN: tokens["control"], wire.ENV_TOOL_TOKEN: tokens["tool"]}
    if tokens.get("llm"):
        secrets[wire.ENV_LLM_TOKEN] = tokens["llm"]
    return secrets


def runner_env(spec: RunSpec, settings: RunnerEnvSettings) -> dict[str, str]:
    """The sandbox's environment: run facts only; no token, never an upstream secret."""
    env = {
        wire.ENV_CONTROL_URL: "http://fluidbox",
        wire.ENV_CONTROL_SOCKET: f"{wire.SANDBOX_SOCKET_DIR}/{settings.socket_path.name}",
        wire.ENV_SESSION_ID: spec.run_id,
        wire.ENV_TASK: spec.task,
        wire.ENV_AUTONOMY: spec.autonomy,
        wire.ENV_MODEL: spec.model,
        wire.ENV_HARNESS: spec.harness,
        wire.ENV_WORKSPACE: wire.SANDBOX_WORKSPACE,
        wire.ENV_HEARTBEAT_SECS: str(settings.heartbeat_secs),
        wire.ENV_TOKEN_TTL_SECS: str(settings.token_ttl_secs),
        wire.ENV_GATEWAY_STALENESS_SECS: str(settings.gateway_staleness_secs),
        wire.ENV_REPLAY_DELAY_MS: str(spec.harness_config.get("delay_ms", settings.replay_delay_ms)),
    }
    if spec.system_prompt:
        env[wire.ENV_SYSTEM_PROMPT] = spec.system_prompt
    servers = []
    deferred = bool(spec.brokered) and spec.tool_discovery == "deferred"
    if deferred:
        # The agent finds its brokered tools through tool_search / tool_describe, answered by the control
        # plane from the frozen RunSpec: the sandbox never holds the full tool set.
        env[wire.ENV_TOOL_DISCOVERY] = "deferred"
    for b in spec.brokered:
        # What the agent may call: names and schemas, never URLs or credentials. A sandbox CLI surface also
        # carries each tool's reviewed command line (it runs in here, with no credential). An unclassified
        # tool (no read or write class) is not listed: the gate would deny it anyway.
        kind = "sandbox_cli" if b.get("transport") == "sandbox_cli" else "brokered"
        if deferred and kind == "brokered":
            continue
        keys = (
            "name",
            "description",
            "input_schema",
            *(("command", "args", "timeout_s") if kind != "brokered" else ()),
        )
        tools = [{k: t.get(k) for k in keys} for t in b["tools"] if is_classified(t)]
        servers.append({"class": kind, "name": b["slot"], "tools": tools})
    for bundle in spec.capabilities:
        for server in bundle.get("servers", []):
            if server.get("class") == "sandbox":
                # Launched inside the sandbox by the harness: no network, no token in its environment.
                servers.append({
                    "class": "sandbox", "name": server["name"], "command": server["command"],
                    "args": server.get("args", []),
                    "tools": [{k: t.get(k) for k in ("name", "description", "input_schema")} for t in server["tools"]],
                })  # fmt: skip
    if dynamic_connections.enabled(spec.harness_config):
        # The proposal tool (the control plane checks, gates and saves every proposal; nothing secret here).
        servers.append({"class": "dynamic_connections", "name": dynamic_connections.PROPOSAL_SERVER,
                        "tools": [dynamic_connections.PROPOSAL_TOOL]})  # fmt: skip
    if servers:
        env[wire.ENV_CAPABILITIES] = json.dumps({"servers": servers})
    if spec.harness == "replay" and spec.harness_config.get("script") is not None:
        env[wire.ENV_REPLAY_SCRIPT] = json.dumps(spec.harness_config["script"])
    return env
