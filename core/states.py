"""The run (session) state machine: statuses, allowed edges, and who accepts work.

Every status write goes through ``check_transition``; the server is the only writer.
"""

from __future__ import annotations

from enum import StrEnum

from core.errors import InvalidTransition


class RunStatus(StrEnum):
    CREATED = "created"
    AWAITING_AUTHORIZATION = "awaiting_authorization"
    PROVISIONING = "provisioning"
    INITIALIZING = "initializing"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    # A connection the run needs is not usable: before provisioning (nothing started, nothing spent) or on
    # one brokered call mid-run (the sandbox stays, the wall clock is paused). See ``pending_action``.
    WAITING_FOR_CONNECTION = "waiting_for_connection"
    CANCELLING = "cancelling"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"


S = RunStatus

TERMINAL: frozenset[RunStatus] = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.BUDGET_EXCEEDED})

_ACTIVE: frozenset[RunStatus] = frozenset(
    {
        S.CREATED,
        S.AWAITING_AUTHORIZATION,
        S.PROVISIONING,
        S.INITIALIZING,
        S.RUNNING,
        S.AWAITING_APPROVAL,
        S.WAITING_FOR_CONNECTION,
    }
)

_EDGES: dict[RunStatus, frozenset[RunStatus]] = {
    S.CREATED: frozenset({S.PROVISIONING, S.AWAITING_AUTHORIZATION, S.WAITING_FOR_CONNECTION}),
    S.AWAITING_AUTHORIZATION: frozenset({S.PROVISIONING}),
    S.PROVISIONING: frozenset({S.INITIALIZING}),
    S.INITIALIZING: frozenset({S.RUNNING}),
    S.RUNNING: frozenset({S.AWAITING_APPROVAL, S.WAITING_FOR_CONNECTION}),
    S.AWAITING_APPROVAL: frozenset({S.RUNNING, S.WAITING_FOR_CONNECTION}),
    # Parked up front it goes back to ``created`` (then provisions as any run); parked mid-run, back to work.
    S.WAITING_FOR_CONNECTION: frozenset({S.CREATED, S.RUNNING, S.AWAITING_APPROVAL}),
    S.CANCELLING: frozenset({S.FINALIZING, S.FAILED}),
    S.FINALIZING: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.BUDGET_EXCEEDED}),
}
for _s in _ACTIVE:
    _EDGES[_s] = _EDGES.get(_s, frozenset()) | {S.CANCELLING, S.FINALIZING}

# Statuses in which the gate, the facade and token renewal still serve the run.
# A run parked mid-run keeps its runner (heartbeats, token renewal); one parked up front has no runner yet.
ACCEPTS_WORK: frozenset[RunStatus] = frozenset(
    {S.CREATED, S.PROVISIONING, S.INITIALIZING, S.RUNNING, S.AWAITING_APPROVAL, S.WAITING_FOR_CONNECTION}
)


def can_transition(src: RunStatus | str, dst: RunStatus | str) -> bool:
    return RunStatus(dst) in _EDGES.get(RunStatus(src), frozenset())


def check_transition(src: RunStatus | str, dst: RunStatus | str) -> None:
    if not can_transition(src, dst):
        raise InvalidTransition(f"run cannot move from {src} to {dst}")


def is_terminal(status: RunStatus | str) -> bool:
    return RunStatus(status) in TERMINAL


def accepts_work(status: RunStatus | str) -> bool:
    return RunStatus(status) in ACCEPTS_WORK


def outcome_status(outcome: str) -> RunStatus:
    """Map a runner-reported outcome string to the terminal status it ends in."""
    return {
        "completed": S.COMPLETED,
        "cancelled": S.CANCELLED,
        "budget_exceeded": S.BUDGET_EXCEEDED,
    }.get(outcome, S.FAILED)
