"""The RunSpec: everything that governs a run, frozen once at creation and never changed.

Editing an agent or a policy afterwards affects only future runs.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from core.errors import BadRequest
from core.policy import Budgets, Policy

Harness = Literal["replay", "claude-agent-sdk", "codex"]
HARNESSES: tuple[str, ...] = ("replay", "claude-agent-sdk", "codex")
DEFAULT_MODELS: dict[str, str] = {
    "replay": "replay",
    "claude-agent-sdk": "claude-haiku-4-5",
    "codex": "gpt-5.4-mini",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkspaceSpec(_Frozen):
    kind: Literal["scratch", "local_copy", "git_repository"] = "scratch"
    path: str | None = None
    url: str | None = None  # git_repository: https://… (or file:///… for the operator), cloned control-plane side
    ref: str | None = None  # git_repository: a branch or tag (default: the remote's HEAD)
    # git_repository: the id of a ``git`` connection whose sealed credential the control plane clones with
    # (an id, never the secret: the RunSpec, the ledger and responses only ever name it).
    credential: str | None = None


class WorkspaceInput(Protocol):
    """A workspace as a request gives it (the API's ``WorkspaceIn``)."""

    @property
    def kind(self) -> str: ...

    @property
    def path(self) -> str | None: ...


GIT_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


def workspace_doc(ws: WorkspaceInput | None) -> dict[str, Any] | None:
    """Normalize a workspace input; scratch is stored as null."""
    if ws is None or ws.kind in ("scratch", "none"):
        return None
    if ws.kind == "git_repository":
        return _git_doc(getattr(ws, "url", None), getattr(ws, "ref", None), getattr(ws, "credential", None))
    if not ws.path or not ws.path.startswith("/"):
        raise BadRequest("a local_copy workspace needs an absolute `path`")
    return {"kind": "local_copy", "path": ws.path}


def host_path_refusal(workspace: WorkspaceSpec | dict[str, Any] | None) -> str | None:
    """Why ``workspace`` may only come from the operator (it names a path on the control plane's host), or None.

    The host belongs to the operator token alone: no organization role, trigger or default may copy a host
    directory into a sandbox or clone a host repository on someone else's behalf."""
    doc = workspace.model_dump() if isinstance(workspace, WorkspaceSpec) else (workspace or {})
    if doc.get("kind") == "local_copy":
        return "a local_copy workspace names a control-plane host path and is restricted to the operator (admin token)"
    if doc.get("kind") == "git_repository" and str(doc.get("url") or "").startswith("file:"):
        return "a file:// git_repository names a control-plane host path and is restricted to the operator"
    return None


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def _git_doc(url: str | None, ref: str | None, credential: str | None = None) -> dict[str, Any]:
    if not url:
        raise BadRequest("a git_repository workspace needs a `url`")
    scheme, sep, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    plain_loopback = scheme == "http" and is_loopback_authority(authority)  # a test server; see services.runs
    known = scheme in ("https", "file") or plain_loopback
    if not sep or not known or (scheme == "file" and not rest.startswith("/")):
        raise BadRequest("a git_repository `url` is https://… (or file:///absolute/path)")
    if scheme != "file" and "@" in authority:
        raise BadRequest(
            "a git_repository `url` must not carry credentials: store them as a `git` connection and name it "
            "in `credential`"
        )
    if ref is not None and (not GIT_REF.match(ref) or ".." in ref):
        raise BadRequest("a git_repository `ref` is a branch or tag name (letters, digits, . _ / -)")
    doc: dict[str, Any] = {"kind": "git_repository", "url": url, "ref": ref}
    if credential is not None:
        if scheme == "file":
            raise BadRequest("a file:// git_repository takes no `credential`")
        if not CREDENTIAL_ID.match(credential):
            raise BadRequest("a git_repository `credential` is the id of a `git` connection")
        doc["credential"] = credential
    return doc


CREDENTIAL_ID = re.compile(r"^[0-9a-fA-F-]{32,36}$")


def is_loopback_authority(authority: str) -> bool:
    """``127.0.0.1``, ``localhost`` or ``[::1]`` (any port): where plain http may reach a test git server."""
    host = authority.rsplit("@", 1)[-1]
    host = host[: host.find("]") + 1] if host.startswith("[") else host.split(":", 1)[0]
    return host.lower() in LOOPBACK_HOSTS


def repository_in_scope(base_url: str, url: str) -> bool:
    """Whether a credential stored for ``base_url`` may be sent to ``url``: the same scheme and host (and port),
    and a path at or under the base path (``https://git.example.com/team`` covers ``…/team/app.git``, never
    ``…/team-other/app.git``)."""
    b_scheme, _, b_rest = base_url.partition("://")
    u_scheme, _, u_rest = url.partition("://")
    b_auth, _, b_path = b_rest.partition("/")
    u_auth, _, u_path = u_rest.partition("/")
    if b_scheme.lower() != u_scheme.lower() or b_auth.lower() != u_auth.lower():
        return False
    base = b_path.strip("/")
    path = u_path.split("?", 1)[0].split("#", 1)[0].strip("/")
    return not base or path == base or path.startswith(base + "/")


class InvocationContext(_Frozen):
    kind: Literal["manual", "api", "schedule", "event"] = "manual"
    actor: str = "operator"
    attributes: dict[str, Any] = Field(default_factory=dict)
    subscription_id: str | None = None  # the trigger subscription that fired the run, if any


class RunSpec(_Frozen):
    run_id: str
    tenant_id: str
    agent_id: str
    agent_revision_id: str
    agent_name: str
    harness: str
    model: str
    system_prompt: str | None = None
    harness_config: dict[str, Any] = Field(default_factory=dict)
    task: str
    workspace: WorkspaceSpec
    autonomy: Literal["supervised", "autonomous"]
    trust_tier: Literal["trusted", "read_only"] = "trusted"
    budgets: Budgets
    policy_id: str
    policy_name: str
    policy_version: int
    policy_snapshot: dict[str, Any]
    invocation: InvocationContext = Field(default_factory=InvocationContext)
    result_destinations: list[dict[str, Any]] = Field(default_factory=list)
    capabilities: list[dict[str, Any]] = Field(default_factory=list)
    brokered: list[dict[str, Any]] = Field(default_factory=list)
    # Requirements not bindable at creation (the run parked up front): bound, then moved into ``brokered``,
    # when the run leaves ``waiting_for_connection``; nothing runs before that, so nothing saw them unbound.
    pending_requirements: list[dict[str, Any]] = Field(default_factory=list)
    # How the agent sees its brokered tools: every schema (eager) or tool_search/describe/call (deferred).
    tool_discovery: Literal["eager", "deferred"] = "eager"

    @property
    def autonomous(self) -> bool:
        return self.autonomy == "autonomous"

    def policy(self) -> Policy:
        """The frozen policy, parsed once per RunSpec instance (the gate asks on every call)."""
        return self._policy

    @cached_property
    def _policy(self) -> Policy:
        return Policy.model_validate(self.policy_snapshot)


def intersect_budgets(*layers: Budgets | None) -> Budgets:
    """Tighten only: the smallest cap of every layer wins; a cap on one side only is kept."""
    out: dict[str, Any] = {}
    for field in Budgets.model_fields:
        caps = [getattr(b, field) for b in layers if b is not None and getattr(b, field) is not None]
        out[field] = min(caps) if caps else None
    return Budgets(**out)


class FrozenAgent(Protocol):
    """What a run freezes of its agent (``db.models.Agent`` is one)."""

    @property
    def id(self) -> object: ...
    @property
    def name(self) -> str: ...


class FrozenRevision(Protocol):
    """What a run freezes of the agent's revision (``db.models.AgentRevision`` is one)."""

    @property
    def id(self) -> object: ...
    @property
    def harness(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def system_prompt(self) -> str | None: ...
    @property
    def budgets(self) -> dict[str, Any] | None: ...
    @property
    def harness_config(self) -> dict[str, Any]: ...
    @property
    def default_workspace(self) -> dict[str, Any] | None: ...
    @property
    def tool_discovery(self) -> str: ...


class PolicyHead(Protocol):
    """What a run freezes of its policy: the head version (``db.policies.PolicyHead`` is one)."""

    @property
    def policy_id(self) -> object: ...
    @property
    def version(self) -> int: ...
    @property
    def content(self) -> dict[str, Any]: ...


def freeze(
    *,
    run_id: str,
    tenant_id: str,
    agent: FrozenAgent,
    revision: FrozenRevision,
    policy_row: PolicyHead,
    task: str,
    workspace: WorkspaceSpec | None,
    autonomous: bool,
    budget_override: Budgets | None,
    invocation: InvocationContext,
    brokered: list[dict[str, Any]] | None = None,
    capabilities: list[dict[str, Any]] | None = None,
) -> RunSpec:
    """Build the immutable RunSpec for a new run from the agent revision and policy version."""
    policy = Policy.model_validate(policy_row.content)
    if autonomous and not policy.autonomy.permitted:
        raise BadRequest("policy does not permit autonomous runs")
    revision_budgets = Budgets.model_validate(revision.budgets) if revision.budgets else None
    default_ws = revision.default_workspace
    surfaces = brokered or []
    tool_count = sum(len(surface.get("tools", [])) for surface in surfaces)
    return RunSpec(
        run_id=run_id,
        tenant_id=tenant_id,
        agent_id=str(agent.id),
        agent_revision_id=str(revision.id),
        agent_name=agent.name,
        harness=revision.harness,
        model=revision.model,
        system_prompt=revision.system_prompt,
        harness_config=revision.harness_config or {},
        task=task,
        workspace=workspace or (WorkspaceSpec.model_validate(default_ws) if default_ws else WorkspaceSpec()),
        autonomy="autonomous" if autonomous else "supervised",
        budgets=intersect_budgets(revision_budgets, policy.budgets, budget_override),
        policy_id=str(policy_row.policy_id),
        policy_name=policy.name,
        policy_version=policy_row.version,
        policy_snapshot=policy_row.content,
        invocation=invocation,
        brokered=surfaces,
        capabilities=capabilities or [],
        tool_discovery=resolve_tool_discovery(revision.tool_discovery, tool_count),
    )


# ``auto`` defers when a run's brokered surfaces freeze more tools than this: around 40 schemas is where the
# prompt cost of eager tools starts to dominate a turn and models pick worse among look-alike tools.
AUTO_DEFERRED_ABOVE = 40


def resolve_tool_discovery(setting: str | None, tool_count: int) -> Literal["eager", "deferred"]:
    """The mode a run freezes: ``auto`` is deferred above :data:`AUTO_DEFERRED_ABOVE` brokered tools."""
    if setting == "deferred" or (setting == "auto" and tool_count > AUTO_DEFERRED_ABOVE):
        return "deferred"
    return "eager"
