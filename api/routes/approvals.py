"""The approvals inbox and human decisions (a CAS in PostgreSQL, then a signal to the run).

Who may decide an approval depends on whose authority its call would execute under:

- a brokered call (``mcp__<slot>__<tool>``) whose frozen binding is a **personal** connection runs
  under that user's credential: only that user, on a run they invoked, may decide it — no role, and
  not the operator, overrides that;
- a brokered call bound to an **organization** connection, and a sandbox-class ``mcp__`` tool:
  org deciders (the operator, approver, admin, owner);
- any other tool (credentialless): org deciders, or the member who invoked the run.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter

from api import responses as out
from api.deps import READ_ALL_ROLES, ContextDep, Principal, PrincipalDep
from api.errors import errors
from api.schemas import DecisionIn
from core.authority import Authority, classify
from core.errors import BadRequest, Conflict, DomainError, Forbidden, NotFound
from db.approvals import ApprovalWithAuthority

router = APIRouter(prefix="/v1/approvals", tags=["approvals"])

DECISIONS = {
    "approved_once": "approved_once",
    "approve": "approved_once",
    "allow": "approved_once",
    "approved_session": "approved_session",
    "denied": "denied",
    "deny": "denied",
}
DECIDER_ROLES = READ_ALL_ROLES  # approver, admin, owner decide organization-authority approvals
ORG_DECIDERS_ONLY = "deciding this approval requires approver, admin, or owner"


def refusal(who: Principal, row: ApprovalWithAuthority, authority: Authority) -> DomainError | None:
    """Why ``who`` may not decide this approval (404 for a run it cannot see), or None."""
    invoker = row.run_invoked_by_user_id
    if not who.sees_run_invoked_by(invoker):
        return NotFound()
    if authority.kind == "personal":
        if who.user_id is not None and who.user_id == authority.owner_user_id == (str(invoker) if invoker else None):
            return None
        return Forbidden(
            f"this approval executes under connection '{authority.connection}', a personal connection — "
            "only its owner, who invoked the run, may decide it"
        )
    if who.is_operator or who.roles & DECIDER_ROLES:
        return None
    if authority.kind == "credentialless" and invoker is not None and str(invoker) == who.user_id:
        return None
    return Forbidden(ORG_DECIDERS_ONLY)


def authorizer(who: Principal) -> Callable[[ApprovalWithAuthority], None]:
    """The check ``decide_approval`` runs on the row before the CAS (its authority facts are frozen)."""

    def authorize(row: ApprovalWithAuthority) -> None:
        refused = refusal(who, row, classify(row))
        if refused is not None:
            raise refused

    return authorize


@router.get("", summary="Pending approvals the caller may decide", response_model=out.Inbox, responses=errors(401))
async def inbox(who: PrincipalDep, ctx: ContextDep) -> out.Inbox:
    """Pending approvals, oldest first, each with its ``authority`` (``personal`` | ``organization``)
    and whether the caller may decide it (``can_decide``). A member sees only what it may decide; the
    operator sees every pending approval, personal ones included but marked ``can_decide: false``."""
    shown = []
    for row in await ctx.approvals.list_approvals(who.tenant_id):
        try:
            classified = classify(row)
            authority, can_decide = classified.public, refusal(who, row, classified) is None
        except Conflict:
            authority, can_decide = "unclassifiable", False
        if can_decide or who.is_operator:
            shown.append(out.InboxApproval.shown(row, authority, can_decide))
    return out.Inbox(approvals=shown)


@router.post(
    "/{approval_id}/decision",
    summary="Approve or deny",
    response_model=out.ApprovalOut,
    responses=errors(401, 403, 404, 409),
)
async def decide(approval_id: str, body: DecisionIn, who: PrincipalDep, ctx: ContextDep) -> out.ApprovalOut:
    """Exactly one decision wins; a late or repeated one gets 409 ``approval is not pending``. A caller
    without authority over the approval gets 403 (404 for a run it cannot see) and nothing changes."""
    decision = DECISIONS.get(body.decision)
    if decision is None:
        raise BadRequest(f"unknown decision '{body.decision}'")
    decided_by = "operator" if who.is_operator else str(who.user_id)
    row = await ctx.run_control.decide_approval(who.tenant_id, approval_id, decision, decided_by, authorizer(who))
    return out.ApprovalOut(approval=out.ApprovalPublic.of(row))
