"""Whose authority an approved tool call would execute under: the rule that decides who may approve it.

- a brokered call (``mcp__<slot>__<tool>``) whose frozen binding is a **personal** connection runs
  under that user's credential: only that user, on a run they invoked, may decide it;
- a brokered call bound to an **organization** connection, and a sandbox-class ``mcp__`` tool:
  organization deciders;
- any other tool (credentialless): organization deciders, or the member who invoked the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.errors import Conflict
from core.tools import split_mcp

NO_BINDING = (
    "this approval's brokered surface has no matching run resource binding — refusing to classify its authority"
)
NO_CONNECTION = "this approval's connection no longer exists — cannot classify its authority"


@dataclass(frozen=True)
class Authority:
    """Whose authority an approved call would execute under."""

    kind: str  # personal | organization | credentialless
    owner_user_id: str | None = None
    connection: str | None = None  # the personal connection's display name

    @property
    def public(self) -> str:
        """What the API shows: ``personal``, or ``organization`` for everything decided by org roles."""
        return "personal" if self.kind == "personal" else "organization"


class AuthorityFacts(Protocol):
    """The frozen facts an approval carries about its call (``db.approvals.ApprovalWithAuthority``)."""

    @property
    def tool(self) -> str: ...
    @property
    def spec_owner_type(self) -> str | None: ...
    @property
    def spec_owner_user_id(self) -> object | None: ...
    @property
    def binding_owner_type(self) -> str | None: ...
    @property
    def binding_owner_user_id(self) -> object | None: ...
    @property
    def binding_connection_id(self) -> object | None: ...
    @property
    def connection_found(self) -> bool: ...
    @property
    def connection_display_name(self) -> str | None: ...


def classify(row: AuthorityFacts) -> Authority:
    """From the frozen binding only (never from the caller). Anything inconsistent is refused (409)
    rather than guessed, so a personal call can never be classified as an organization one."""
    if not row.tool.startswith("mcp__"):
        return Authority("credentialless")
    if split_mcp(row.tool) is None or (row.spec_owner_type is None and row.binding_owner_type is None):
        # Not a brokered surface of this run (a sandbox capability server): nothing of anyone's executes.
        return Authority("organization")
    if row.binding_owner_type is None:
        raise Conflict(NO_BINDING)
    if not row.connection_found:
        raise Conflict(NO_CONNECTION)
    if "user" in (row.binding_owner_type, row.spec_owner_type):
        owner = row.binding_owner_user_id or row.spec_owner_user_id
        if owner is None:
            raise Conflict(NO_BINDING)
        name = row.connection_display_name or str(row.binding_connection_id)
        return Authority("personal", owner_user_id=str(owner), connection=name)
    return Authority("organization")
