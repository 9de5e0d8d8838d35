"""Ledger event vocabulary. Names are a public contract: add, never rename.

A ledger payload is always ``{"type": <name>, "data": {...}}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from core.wire import AGENT_MESSAGE as AGENT_MESSAGE  # the runner posts these two
from core.wire import RUN_ERROR as RUN_ERROR

SESSION_CREATED = "session.created"
STATUS_CHANGED = "session.status_changed"
WORKSPACE_INITIALIZED = "workspace.initialized"
TOOL_REQUESTED = "tool.requested"
TOOL_DECISION = "tool.decision"
APPROVAL_REQUESTED = "approval.requested"
APPROVAL_DECIDED = "approval.decided"
BUDGET_EXCEEDED = "budget.exceeded"
RUN_RESULT = "run.result"
ARTIFACT_COLLECTED = "artifact.collected"
ARTIFACT_MISSING = "artifact.missing"
QUIESCE_REQUESTED = "run.quiesce_requested"
# Parked runs: a requirement not bindable at creation, a brokered call meeting an unusable connection,
# the wait ending (bound / resumed / expired / ended).
CONNECTION_REQUIRED = "connection.required"
AUTHORIZATION_REQUIRED = "authorization.required"
CONNECTION_RESUMED = "connection.resumed"
CONNECTION_WAIT_ENDED = "connection.wait_ended"

ACTORS = frozenset({"agent", "system", "human", "harness"})


class NewEvent(BaseModel):
    """An event about to be appended: the ledger assigns ``seq``."""

    type: str
    actor: str = "system"
    data: dict[str, Any] = Field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return {"type": self.type, "data": self.data}


def status_changed(src: str, dst: str, reason: str | None = None) -> NewEvent:
    data: dict[str, Any] = {"from": src, "to": dst}
    if reason:
        data["reason"] = reason
    return NewEvent(type=STATUS_CHANGED, data=data)


def binding_denied(tool_call_id: str, tool: str, reason: str, *access: str | None) -> NewEvent:
    """The ``tool.decision`` of a brokered call its binding no longer allows (refused before anything was sent).
    The broker, which has the run's spec at hand, adds the tool's ``access`` class (``None`` for none); a parked
    call's refusal has no spec read and gives none, so the key is absent."""
    data: dict[str, Any] = {"tool_call_id": tool_call_id, "tool": tool, "verdict": "deny", "source": "binding"}
    data["reason"] = reason
    if access:
        data["access"] = access[0]
    return NewEvent(type=TOOL_DECISION, data=data)


def system_message(text: str) -> NewEvent:
    return NewEvent(type=AGENT_MESSAGE, data={"role": "system", "text": text})


def capability_frozen(bundles: list[dict[str, Any]]) -> NewEvent:
    """Which bundle versions a run froze, and how many sandbox-class tools that gives it."""
    return NewEvent(
        type="capability.frozen",
        data={
            "bundles": [f"{b['name']}@{b['version']}" for b in bundles],
            "tools": sum(len(s.get("tools", [])) for b in bundles for s in b["servers"]),
        },
    )


def normalize_actor(actor: str | None) -> str:
    return actor if actor in ACTORS else "system"


def summarize(tool: str, tool_input: Any, limit: int = 200) -> str:
    """A short human-readable line for a tool call (never the full input)."""
    if isinstance(tool_input, dict):
        for key in ("command", "file_path", "path", "pattern", "url"):
            if isinstance(tool_input.get(key), str):
                text = f"{tool}: {tool_input[key]}"
                break
        else:
            text = tool
    else:
        text = tool
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"
