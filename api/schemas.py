"""Request bodies of the public API (the response shapes are in ``api.responses``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from core.contract import ReplayStep
from core.dynamic_connections import check_allowed_hosts
from core.policy import Budgets
from core.wire import DISCOVERY_INPUT_FIELDS


class _Body(BaseModel):
    """Every request body's base: a field the API does not know is a 400 naming it, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


class WorkspaceIn(_Body):
    kind: Literal["scratch", "none", "local_copy", "local_path", "git_repository"]
    path: str | None = None
    url: str | None = Field(default=None, max_length=2000)  # git_repository
    ref: str | None = Field(default=None, max_length=200)  # git_repository: branch or tag
    credential: str | None = Field(
        default=None,
        max_length=64,
        description="git_repository: the id of a `git` connection whose sealed credential the control plane "
        "clones with (the sandbox never sees it).",
    )


TOOL_INPUTS: dict[str, tuple[str, ...]] = {
    "Bash": ("command",),
    "Write": ("file_path", "content"),
    "Edit": ("file_path", "old_string", "new_string"),
    "Read": ("file_path",),
    **DISCOVERY_INPUT_FIELDS,
}


class DynamicConnections(_Body):
    """Off by default: when on, the agent may propose URL-backed connections to hosts in ``allowedHosts``;
    saving one waits for a human approval unless ``require_approval`` is false."""

    enabled: bool = False
    allowedHosts: list[str] = Field(default_factory=list, max_length=64)
    require_approval: bool = True

    @field_validator("allowedHosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        return check_allowed_hosts(hosts)


class HarnessConfig(_Body):
    """Harness-specific settings. ``replay`` takes a ``script`` of steps, a pacing ``delay_ms`` and the
    ``model_api`` the LLM facade speaks for the run (replay runs stand in for either model client)."""

    script: list[ReplayStep] | None = Field(default=None, max_length=500)
    delay_ms: int | None = Field(default=None, ge=0, le=60_000)
    model_api: Literal["anthropic-messages", "openai-responses"] | None = None
    dynamic_connections: DynamicConnections | None = None

    # The Kubernetes provider's Pod for this agent's runs (the deployment's defaults when unset).
    runner_image: str | None = Field(
        default=None, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$", description="runner image"
    )
    runtime_class: str | None = Field(
        default=None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="RuntimeClass"
    )

    @field_validator("script")
    @classmethod
    def _steps(cls, steps: list[ReplayStep] | None) -> list[ReplayStep] | None:
        for index, step in enumerate(steps or []):
            try:
                step.kind()
            except ValueError as exc:
                raise ValueError(f"step {index}: {exc}") from None
            if step.tool is None:
                if step.input is not None or step.on_deny_say is not None or step.timeout_ms is not None:
                    raise ValueError(f"step {index}: input, on_deny_say and timeout_ms belong to tool steps")
                continue
            needed = TOOL_INPUTS.get(step.tool, ())  # brokered tools are checked by their frozen schema
            given = step.input or {}
            missing = [k for k in needed if not isinstance(given.get(k), str)]
            if missing:
                raise ValueError(f"step {index}: {step.tool} needs string input field(s) {', '.join(missing)}")
        return steps


class ConnectorRef(_Body):
    url: str = Field(min_length=1, max_length=2048, pattern=r"^(https?|stdio|sandbox-cli)://")
    slug: str | None = Field(default=None, max_length=64)


class ConnectionRequirement(_Body):
    """What a revision needs from a connection (never whose): bound per run at creation."""

    slot: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    connector: ConnectorRef
    required_tools: list[str] = Field(min_length=1, max_length=1024)  # deferred discovery serves big servers
    binding_mode: Literal["invoking_user", "organization"] = "organization"
    when_unavailable: Literal["park", "fail"] | None = Field(
        default=None,
        description="When no usable connection can be bound (missing, revoked, not yet authorized): `park` the run "
        "until one is (`waiting_for_connection`), or `fail`. Unset: park for runs started through the API, the "
        "subscription's choice (default fail) for trigger and schedule runs.",
    )


def _unique_slots(reqs: list[ConnectionRequirement] | None) -> list[ConnectionRequirement] | None:
    slots = [r.slot for r in reqs or []]
    dupes = sorted({s for s in slots if slots.count(s) > 1})
    if dupes:
        raise ValueError(f"requirement slot(s) declared more than once: {', '.join(dupes)}")
    return reqs


class RevisionCreate(_Body):
    """An agent revision's settings; one left out keeps the previous revision's."""

    harness: str | None = None
    model: str | None = None
    system_prompt: str | None = Field(default=None, max_length=65536)
    policy: str | None = None
    runner_image: str | None = None
    budgets: Budgets | None = None
    default_workspace: WorkspaceIn | None = None
    harness_config: HarnessConfig | None = None
    capability_bundles: list[str] | None = Field(default=None, max_length=64)
    connection_requirements: list[ConnectionRequirement] | None = Field(default=None, max_length=64)
    tool_discovery: Literal["eager", "deferred", "auto"] | None = Field(
        default=None,
        description="How runs see brokered tools: every schema (eager, the default), tool_search/tool_describe/"
        "tool_call (deferred), or deferred above core.runspec.AUTO_DEFERRED_ABOVE frozen tools (auto).",
    )

    _slots = field_validator("connection_requirements")(classmethod(lambda cls, v: _unique_slots(v)))


class AgentCreate(RevisionCreate):
    """A new agent: its name and description, and its first revision (the harness and policy defaulted)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str | None = Field(default=None, max_length=4096)
    harness: str = "claude-agent-sdk"
    policy: str = "default"


class SessionCreate(_Body):
    agent: str = Field(min_length=1, max_length=200)
    task: str = Field(min_length=1, max_length=65536)
    workspace: WorkspaceIn | None = None
    repo: WorkspaceIn | None = None
    autonomous: bool = False
    budgets: Budgets | None = None
    bindings: dict[str, str] | None = None
    capabilities: list[str] | None = Field(default=None, max_length=64)


class DecisionIn(_Body):
    decision: str
