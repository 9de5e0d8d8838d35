"""What the runner and the control plane agree on, without pydantic: names, exit codes, replay steps.

The runner imports only this module from ``core`` (with :mod:`core.tools`): a sandbox starts one Python
interpreter per run, and pydantic and httpx alone cost it about 0.3 s of CPU at every start. The
server-side pydantic models live in :mod:`core.contract`, which re-exports these names. For the same
reason :class:`Step` is a ``NamedTuple``, not a dataclass (``dataclasses`` loads ``inspect``: a few ms of
every runner's start; issue 12).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

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
# "deferred" when the run's brokered tools are discovered on demand (then FLUIDBOX_CAPABILITIES holds no schema).
ENV_TOOL_DISCOVERY = "FLUIDBOX_TOOL_DISCOVERY"
# How long the runner rides out an unreachable control plane (an API restart) before it gives up.
ENV_GATEWAY_STALENESS_SECS = "FLUIDBOX_GATEWAY_STALENESS_SECS"
# The runner's last words when it gives up; the worker looks for them to name the cause of the death.
# The longest a brokered call can be parked (``budgets.max_park_secs`` is capped here): the runner keeps
# re-attaching to a held call at least this long, so the park's TTL, not the runner, ends the wait.
MAX_PARK_SECS = 24 * 3600
GATEWAY_GONE = "control plane unreachable"

# The run's tokens arrive as one JSON object on an inherited pipe (never a file, argv or the environment);
# FLUIDBOX_SECRETS_FD names the descriptor, which the runner reads to its end and closes.
ENV_SECRETS_FD = "FLUIDBOX_SECRETS_FD"
SECRETS_FD = 4

# Sandboxes that do not share the worker's disk (Kubernetes): the runner trades a one-time bootstrap
# credential, read from this file (a Secret mount), for its run tokens; the exchange burns it.
ENV_BOOTSTRAP_FILE = "FLUIDBOX_BOOTSTRAP_FILE"
# ...and fetches its workspace from the runner plane, refusing it unless its sha256 matches, then uploads
# the final state before its result.
ENV_WORKSPACE_REF = "FLUIDBOX_WORKSPACE_REF"
ENV_WORKSPACE_SHA256 = "FLUIDBOX_WORKSPACE_SHA256"
WORKSPACE_DIGEST_HEADER = "X-Fluidbox-Sha256"

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

# The ledger event types a runner posts (core.events holds the whole vocabulary).
AGENT_MESSAGE = "agent.message"
RUN_ERROR = "run.error"

# ---- deferred tool discovery ---------------------------------------------------------------------

# What a deferred run's agent sees instead of every brokered schema. ``tool_search`` and ``tool_describe`` are
# answered by the control plane from the frozen RunSpec; ``tool_call`` is a brokered call on its target.
TOOL_SEARCH = "tool_search"
TOOL_DESCRIBE = "tool_describe"
TOOL_CALL = "tool_call"
DISCOVERY_TOOLS = (TOOL_SEARCH, TOOL_DESCRIBE, TOOL_CALL)
# Required string fields of each discovery tool's input (``tool_call`` also takes an ``arguments`` object).
DISCOVERY_INPUT_FIELDS: dict[str, tuple[str, ...]] = {TOOL_SEARCH: ("query",), TOOL_DESCRIBE: ("name",),
                                                      TOOL_CALL: ("name",)}  # fmt: skip

# ---- replay scripts ------------------------------------------------------------------------------

REPLAY_TOOL_PATTERN = (
    r"^(Bash|Write|Edit|Read|ProposeConnection|tool_search|tool_describe|tool_call|mcp__[a-z0-9-]+__.+)$"
)
REPLAY_STEP_FIELDS = ("say", "tool", "input", "on_deny_say", "timeout_ms", "sleep_ms")
REPLAY_KINDS = ("say", "tool", "sleep_ms")
TIMEOUT_MS_MAX = 600_000
SLEEP_MS_MAX = 3_600_000
_TOOL = re.compile(REPLAY_TOOL_PATTERN)


class Step(NamedTuple):
    """One step of a replay script: exactly one of ``say``, ``tool`` or ``sleep_ms``. Immutable, equal by
    value."""

    say: str | None = None
    tool: str | None = None
    input: dict[str, Any] | None = None
    on_deny_say: str | None = None
    timeout_ms: int | None = None
    sleep_ms: int | None = None

    def kind(self) -> str:
        set_fields = [k for k in REPLAY_KINDS if getattr(self, k) is not None]
        if len(set_fields) != 1:
            raise ValueError("a replay step has exactly one of say, tool, sleep_ms")
        return set_fields[0]


def step_problems(item: object) -> list[str]:
    """Why ``item`` cannot be a replay step's fields (types and ranges; :meth:`Step.kind` is apart)."""
    if not isinstance(item, dict):
        return ["step: must be a JSON object"]
    problems = [f"{name}: extra field not permitted" for name in item if name not in REPLAY_STEP_FIELDS]
    for name in ("say", "tool", "on_deny_say"):
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            problems.append(f"{name}: must be a string")
    tool = item.get("tool")
    if isinstance(tool, str) and not _TOOL.match(tool):
        problems.append(f"tool: must match {REPLAY_TOOL_PATTERN}")
    value = item.get("input")
    if value is not None and not isinstance(value, dict):
        problems.append("input: must be an object")
    for name, low, high in (("timeout_ms", 1, TIMEOUT_MS_MAX), ("sleep_ms", 0, SLEEP_MS_MAX)):
        value = item.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{name}: must be an integer")
        elif not low <= value <= high:
            problems.append(f"{name}: must be between {low} and {high}")
    return problems


def to_step(item: dict[str, Any]) -> Step:
    """A :class:`Step` from fields in which :func:`step_problems` found nothing wrong."""
    return Step(**{name: item.get(name) for name in REPLAY_STEP_FIELDS})
