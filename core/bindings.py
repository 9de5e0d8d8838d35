"""Binding a connection requirement to a connection, and what a run shows while it cannot (pure).

Used at run creation (``services.runs``) and when a run parked for a connection tries again
(``db.parks``), so both bind by exactly the same rule: the newest active connection to the requirement's
URL (of the right owner) whose latest snapshot covers every required tool with a definition an admin
approved (a new or changed tool is quarantined, ``core.access``); the effective surface is exactly the
required tools, each stamped with its access class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from core.access import definition, with_access
from core.digests import document_digest
from core.wire import MAX_PARK_SECS

WhenUnavailable = Literal["park", "fail"]
MCP_CONNECT = "mcp_connect"
DEFAULT_PARK_SECS = 1800


def url_key(url: str) -> str:
    """The URL as requirements and connections are compared: scheme and host case-folded, no trailing slash."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


def same_url(a: str, b: str) -> bool:
    return url_key(a) == url_key(b)


def park_secs(max_park_secs: int | None) -> int:
    """The TTL of a park: the agent's ``budgets.max_park_secs`` (default 30 min), never above one day."""
    return min(max_park_secs or DEFAULT_PARK_SECS, MAX_PARK_SECS)


class Candidate(Protocol):
    """A connection a requirement may bind, with its latest snapshot (``db.connections.BindingCandidate``)."""

    @property
    def id(self) -> object: ...
    @property
    def base_url(self) -> str: ...
    @property
    def authorization_generation(self) -> int: ...
    @property
    def owner_type(self) -> str: ...
    @property
    def owner_user_id(self) -> object | None: ...
    @property
    def access(self) -> dict[str, Any] | None: ...
    @property
    def transport(self) -> str | None: ...
    @property
    def snapshot_version(self) -> int: ...
    @property
    def protocol_version(self) -> str: ...
    @property
    def tools_json(self) -> Sequence[dict[str, Any]]: ...
    @property
    def approved(self) -> Mapping[str, Any] | None:
        """Tool name → the definition an admin approved; None: a row read without them (none held back)."""


C = TypeVar("C", bound=Candidate)


def bindable_tools(candidate: Candidate) -> list[dict[str, Any]]:
    """The candidate's latest-snapshot tools whose definition an admin approved: a new tool, or one whose
    description or input schema changed since its approval, is quarantined (not bound into new runs)."""
    approved = candidate.approved
    if approved is None:  # a row read without its approvals (not from ``Connections.candidates``): none held
        return list(candidate.tools_json)
    return [t for t in candidate.tools_json if approved.get(t["name"]) == definition(t)]


def covering(candidates: Sequence[C], url: str, needed: Sequence[str]) -> C | None:
    """The first candidate (newest first) to ``url`` whose approved tools include every tool in ``needed``."""
    for cand in candidates:
        if same_url(cand.base_url, url) and set(needed) <= {t["name"] for t in bindable_tools(cand)}:
            return cand
    return None


def quarantined(candidates: Sequence[Candidate], needed: Sequence[str]) -> list[str]:
    """For each candidate that lists every needed tool but holds some back for review: which, and where."""
    out = []
    for cand in candidates:
        if set(needed) <= {t["name"] for t in cand.tools_json}:
            held = sorted(set(needed) - {t["name"] for t in bindable_tools(cand)})
            if held:
                out.append(f"{', '.join(held)} on connection {cand.id}")
    return out


def freeze_binding(
    req: Mapping[str, Any], chosen: Candidate, binding_id: str, when_unavailable: str = "fail"
) -> dict[str, Any]:
    """The frozen surface of ``req`` bound to ``chosen`` (a candidate with its latest snapshot).
    ``when_unavailable`` is the run's default for a requirement that does not say (a mid-run park needs it)."""
    needed = list(req["required_tools"])
    tools = sorted(
        (with_access(chosen.access, t) for t in bindable_tools(chosen) if t["name"] in needed),
        key=lambda t: t["name"],
    )
    surface = {
        "slot": req["slot"],
        "url": req["connector"]["url"],
        "binding_id": binding_id,
        "connection_id": str(chosen.id),
        "authorization_generation": chosen.authorization_generation,
        "owner_type": chosen.owner_type,
        "owner_user_id": str(chosen.owner_user_id) if chosen.owner_user_id else None,
        "binding_mode": req.get("binding_mode", "organization"),
        "snapshot_version": chosen.snapshot_version,
        "protocol_version": chosen.protocol_version,
        "transport": chosen.transport or "mcp_http",
        "tools": tools,
        "tools_digest": document_digest(tools),
    }
    surface["when_unavailable"] = req.get("when_unavailable") or when_unavailable
    return surface


def pending_action(
    *,
    slot: str,
    url: str,
    reason: str,
    expires_at: str,
    connection_id: str | None,
    tool_call_id: str | None = None,
) -> dict[str, Any]:
    """What a person must do for a run ``waiting_for_connection``: the ``pending_action`` of the run."""
    if connection_id is not None:
        how = (
            f"GET /v1/connections/authorize?connection={connection_id} (OAuth: open the url it returns), or give a "
            f"static connection a new credential with PUT /v1/connections/{connection_id}/credential"
        )
        authorize = f"/v1/connections/authorize?connection={connection_id}"
    else:
        how = f"connect {url} (POST /v1/connections, or a catalog entry's connect)"
        authorize = None
    return {
        "type": MCP_CONNECT,
        "slot": slot,
        "connection_id": connection_id,
        "url": url,
        "reason": reason,
        "authorization_url": authorize,
        "how": how,
        "tool_call_id": tool_call_id,
        "expires_at": expires_at,
    }


__all__ = [
    "DEFAULT_PARK_SECS",
    "MAX_PARK_SECS",
    "MCP_CONNECT",
    "Candidate",
    "WhenUnavailable",
    "bindable_tools",
    "covering",
    "freeze_binding",
    "park_secs",
    "pending_action",
    "quarantined",
    "same_url",
    "url_key",
]
