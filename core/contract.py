"""Runner ↔ control-plane wire models (``/internal/sessions/{id}/...``).

Shared by the API (server side) and ``runner/`` (client side); pydantic only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Environment variable names the sandbox receives.
ENV_CONTROL_URL = "FLUIDBOX_CONTROL_URL"
ENV_CONTROL_SOCKET = "FLUIDBOX_CONTROL_SOCKET"
ENV_SESSION_ID = "FLUIDBOX_SESSION_ID"
ENV_SESSION_TOKEN = "FLUIDBOX_SESSION_TOKEN"
ENV_TOOL_TOKEN = "FLUIDBOX_TOOL_TOKEN"
ENV_LLM_TOKEN = "FLUIDBOX_LLM_TOKEN"
ENV_TASK = "FLUIDBOX_TASK"
ENV_AUTONOMY = "FLUIDBOX_AUTONOMY"
ENV_MODEL = "FLUIDBOX_MODEL"
ENV_WORKSPACE = "FLUIDBOX_WORKSPACE"
ENV_HARNESS = "FLUIDBOX_HARNESS"
ENV_SYSTEM_PROMPT = "FLUIDBOX_SYSTEM_PROMPT"
ENV_REPLAY_SCRIPT = "FLUIDBOX_REPLAY_SCRIPT"
ENV_REPLAY_DELAY_MS = "FLUIDBOX_REPLAY_DELAY_MS"
ENV_HEARTBEAT_SECS = "FLUIDBOX_HEARTBEAT_SECS"
ENV_TOKEN_TTL_SECS = "FLUIDBOX_TOKEN_TTL_SECS"  # the run tokens' lifetime; the runner renews them in time
ENV_CAPABILITIES = "FLUIDBOX_CAPABILITIES"
ENV_MAX_TURNS = "FLUIDBOX_MAX_TURNS"
# How long the runner rides out an unreachable control plane (an API restart) before it gives up.
ENV_GATEWAY_STALENESS_SECS = "FLUIDBOX_GATEWAY_STALENESS_SECS"
# The runner's last words when it gives up; the worker looks for them to name the cause of the death.
GATEWAY_GONE = "control plane unreachable"

# The run's tokens arrive as one JSON object on an inherited pipe (never a file, argv or the environment);
# FLUIDBOX_SECRETS_FD names the descriptor, which the runner reads to its end and closes.
ENV_SECRETS_FD = "FLUIDBOX_SECRETS_FD"
SECRETS_FD = 4

TOKEN_ENV_VARS = (ENV_SESSION_TOKEN, ENV_TOOL_TOKEN, ENV_LLM_TOKEN, "ANTHROPIC_API_KEY")

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_SOCKET_DIR = "/run/fluidbox"
SANDBOX_SOCKET = SANDBOX_SOCKET_DIR + "/api.sock"

WRONG_AUDIENCE = {"error": "wrong_audience"}

# Runner exit codes.
EXIT_OK = 0
EXIT_AGENT_ERROR = 1
EXIT_MISSING_ENV = 2
EXIT_AUDIENCE_MISMATCH = 3
EXIT_UNGOVERNED_TOOL = 5
EXIT_GATEWAY_GONE = 6


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PermissionRequest(_Strict):
    tool_call_id: str = Field(min_length=1, max_length=200)
    tool: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict)


class PermissionResponse(BaseModel):
    decision: Literal["allow", "deny"]
    message: str | None = None
    updated_input: dict[str, Any] | None = None


class EventBody(BaseModel):
    type: str = Field(min_length=1, max_length=100)
    data: dict[str, Any] = Field(default_factory=dict)


class EventPost(_Strict):
    actor: str = "agent"
    body: EventBody


class HeartbeatResponse(BaseModel):
    ok: bool = True
    action: Literal["quiesce"] | None = None


class ResultPost(_Strict):
    outcome: str = Field(min_length=1, max_length=40)
    summary: str | None = Field(default=None, max_length=4000)


class ReplayStep(_Strict):
    """One step of a replay script: exactly one of ``say``, ``tool`` or ``sleep_ms``."""

    say: str | None = None
    tool: str | None = Field(default=None, pattern=r"^(Bash|Write|Edit|Read|mcp__[a-z0-9-]+__.+)$")
    input: dict[str, Any] | None = None
    on_deny_say: str | None = None
    timeout_ms: int | None = Field(default=None, ge=1, le=600_000)
    sleep_ms: int | None = Field(default=None, ge=0, le=3_600_000)

    def kind(self) -> str:
        set_fields = [k for k in ("say", "tool", "sleep_ms") if getattr(self, k) is not None]
        if len(set_fields) != 1:
            raise ValueError("a replay step has exactly one of say, tool, sleep_ms")
        return set_fields[0]
