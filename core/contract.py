"""Runner ↔ control-plane wire models (``/internal/sessions/{id}/...``), server side.

The names both sides share (environment, exit codes, replay step rules) live in :mod:`core.wire`,
which the runner imports instead of this module; they are re-exported here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.wire import (
    ENV_AUTONOMY as ENV_AUTONOMY,
)
from core.wire import (
    ENV_BOOTSTRAP_FILE as ENV_BOOTSTRAP_FILE,
)
from core.wire import (
    ENV_CAPABILITIES as ENV_CAPABILITIES,
)
from core.wire import (
    ENV_CONTROL_SOCKET as ENV_CONTROL_SOCKET,
)
from core.wire import (  # re-exported: the server imports them from here
    ENV_CONTROL_URL as ENV_CONTROL_URL,
)
from core.wire import (
    ENV_GATEWAY_STALENESS_SECS as ENV_GATEWAY_STALENESS_SECS,
)
from core.wire import (
    ENV_HARNESS as ENV_HARNESS,
)
from core.wire import (
    ENV_HEARTBEAT_SECS as ENV_HEARTBEAT_SECS,
)
from core.wire import (
    ENV_LLM_TOKEN as ENV_LLM_TOKEN,
)
from core.wire import (
    ENV_MAX_TURNS as ENV_MAX_TURNS,
)
from core.wire import (
    ENV_MODEL as ENV_MODEL,
)
from core.wire import (
    ENV_REPLAY_DELAY_MS as ENV_REPLAY_DELAY_MS,
)
from core.wire import (
    ENV_REPLAY_SCRIPT as ENV_REPLAY_SCRIPT,
)
from core.wire import (
    ENV_SECRETS_FD as ENV_SECRETS_FD,
)
from core.wire import (
    ENV_SESSION_ID as ENV_SESSION_ID,
)
from core.wire import (
    ENV_SESSION_TOKEN as ENV_SESSION_TOKEN,
)
from core.wire import (
    ENV_SYSTEM_PROMPT as ENV_SYSTEM_PROMPT,
)
from core.wire import (
    ENV_TASK as ENV_TASK,
)
from core.wire import (
    ENV_TOKEN_TTL_SECS as ENV_TOKEN_TTL_SECS,
)
from core.wire import (
    ENV_TOOL_DISCOVERY as ENV_TOOL_DISCOVERY,
)
from core.wire import (
    ENV_TOOL_TOKEN as ENV_TOOL_TOKEN,
)
from core.wire import (
    ENV_WORKSPACE as ENV_WORKSPACE,
)
from core.wire import (
    ENV_WORKSPACE_REF as ENV_WORKSPACE_REF,
)
from core.wire import (
    ENV_WORKSPACE_SHA256 as ENV_WORKSPACE_SHA256,
)
from core.wire import (
    EXIT_AGENT_ERROR as EXIT_AGENT_ERROR,
)
from core.wire import (
    EXIT_AUDIENCE_MISMATCH as EXIT_AUDIENCE_MISMATCH,
)
from core.wire import (
    EXIT_GATEWAY_GONE as EXIT_GATEWAY_GONE,
)
from core.wire import (
    EXIT_MISSING_ENV as EXIT_MISSING_ENV,
)
from core.wire import (
    EXIT_OK as EXIT_OK,
)
from core.wire import (
    EXIT_UNGOVERNED_TOOL as EXIT_UNGOVERNED_TOOL,
)
from core.wire import (
    GATEWAY_GONE as GATEWAY_GONE,
)
from core.wire import REPLAY_KINDS, REPLAY_TOOL_PATTERN, SLEEP_MS_MAX, TIMEOUT_MS_MAX
from core.wire import (
    SANDBOX_SOCKET as SANDBOX_SOCKET,
)
from core.wire import (
    SANDBOX_SOCKET_DIR as SANDBOX_SOCKET_DIR,
)
from core.wire import (
    SANDBOX_WORKSPACE as SANDBOX_WORKSPACE,
)
from core.wire import (
    SECRETS_FD as SECRETS_FD,
)
from core.wire import (
    TOKEN_ENV_VARS as TOKEN_ENV_VARS,
)
from core.wire import (
    WORKSPACE_DIGEST_HEADER as WORKSPACE_DIGEST_HEADER,
)
from core.wire import (
    WRONG_AUDIENCE as WRONG_AUDIENCE,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PermissionRequest(_Strict):
    tool_call_id: str = Field(min_length=1, max_length=200)
    tool: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] = Field(default_factory=dict)
    # "tool_call": the agent reached ``tool`` through deferred discovery's tool_call. A label for the ledger
    # only: the gate judges ``tool`` exactly as a direct call either way.
    via: Literal["tool_call"] | None = None


class ToolSearchRequest(_Strict):
    query: str = Field(min_length=1, max_length=500)
    limit: int = Field(default=10, ge=1, le=50)


class ToolDescribeRequest(_Strict):
    name: str = Field(min_length=1, max_length=200)


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


class BootstrapTokens(BaseModel):
    """What a runner gets for its one-time bootstrap credential: its run tokens, to hold in memory."""

    control: str
    tool: str
    llm: str | None = None
    workspace: str


class WorkspaceStored(BaseModel):
    """An uploaded workspace archive, as the control plane verified and stored it."""

    sha256: str
    size: int


class ReplayStep(_Strict):
    """One step of a replay script: exactly one of ``say``, ``tool`` or ``sleep_ms``."""

    say: str | None = None
    tool: str | None = Field(default=None, pattern=REPLAY_TOOL_PATTERN)
    input: dict[str, Any] | None = None
    on_deny_say: str | None = None
    timeout_ms: int | None = Field(default=None, ge=1, le=TIMEOUT_MS_MAX)
    sleep_ms: int | None = Field(default=None, ge=0, le=SLEEP_MS_MAX)

    def kind(self) -> str:
        set_fields = [k for k in REPLAY_KINDS if getattr(self, k) is not None]
        if len(set_fields) != 1:
            raise ValueError("a replay step has exactly one of say, tool, sleep_ms")
        return set_fields[0]
