"""The run state machine against the edge table of spec/domain.md section 2."""

from __future__ import annotations

import itertools

import pytest

from core.errors import InvalidTransition
from core.states import (
    ACCEPTS_WORK,
    TERMINAL,
    RunStatus,
    accepts_work,
    can_transition,
    check_transition,
    is_terminal,
    outcome_status,
)

S = RunStatus

ACTIVE = (
    S.CREATED,
    S.AWAITING_AUTHORIZATION,
    S.PROVISIONING,
    S.INITIALIZING,
    S.RUNNING,
    S.AWAITING_APPROVAL,
    S.WAITING_FOR_CONNECTION,
)
TERMINALS = (S.COMPLETED, S.FAILED, S.CANCELLED, S.BUDGET_EXCEEDED)

# The spec table, written out edge by edge (independently of core.states).
SPEC_EDGES: frozenset[tuple[RunStatus, RunStatus]] = frozenset(
    {
        (S.CREATED, S.PROVISIONING),
        (S.CREATED, S.AWAITING_AUTHORIZATION),
        (S.AWAITING_AUTHORIZATION, S.PROVISIONING),
        (S.PROVISIONING, S.INITIALIZING),
        (S.INITIALIZING, S.RUNNING),
        (S.RUNNING, S.AWAITING_APPROVAL),
        (S.AWAITING_APPROVAL, S.RUNNING),
        (S.CREATED, S.WAITING_FOR_CONNECTION),
        (S.RUNNING, S.WAITING_FOR_CONNECTION),
        (S.AWAITING_APPROVAL, S.WAITING_FOR_CONNECTION),
        (S.WAITING_FOR_CONNECTION, S.CREATED),
        (S.WAITING_FOR_CONNECTION, S.RUNNING),
        (S.WAITING_FOR_CONNECTION, S.AWAITING_APPROVAL),
        *((src, S.CANCELLING) for src in ACTIVE),
        *((src, S.FINALIZING) for src in ACTIVE),
        (S.CANCELLING, S.FINALIZING),
        (S.CANCELLING, S.FAILED),
        *((S.FINALIZING, dst) for dst in TERMINALS),
    }
)

ALL_PAIRS = list(itertools.product(RunStatus, RunStatus))
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in SPEC_EDGES]


def _id(pair: tuple[RunStatus, RunStatus]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


def test_the_status_vocabulary_is_the_twelve_spec_statuses_plus_waiting_for_connection() -> None:
    assert {s.value for s in RunStatus} == {
        "created",
        "awaiting_authorization",
        "provisioning",
        "initializing",
        "running",
        "awaiting_approval",
        "waiting_for_connection",
        "cancelling",
        "finalizing",
        "completed",
        "failed",
        "cancelled",
        "budget_exceeded",
    }


@pytest.mark.parametrize("edge", sorted(SPEC_EDGES), ids=_id)
def test_every_edge_of_the_spec_table_is_allowed(edge: tuple[RunStatus, RunStatus]) -> None:
    src, dst = edge
    assert can_transition(src, dst)
    check_transition(src, dst)  # does not raise
    check_transition(src.value, dst.value)  # plain strings work too


@pytest.mark.parametrize("edge", FORBIDDEN, ids=_id)
def test_every_edge_outside_the_spec_table_raises_invalid_transition(
    edge: tuple[RunStatus, RunStatus],
) -> None:
    src, dst = edge
    assert not can_transition(src, dst)
    with pytest.raises(InvalidTransition) as info:
        check_transition(src, dst)
    assert info.value.status == 409
    assert src.value in info.value.message and dst.value in info.value.message


@pytest.mark.parametrize("src", ACTIVE, ids=lambda s: s.value)
@pytest.mark.parametrize("dst", TERMINALS, ids=lambda s: s.value)
def test_no_active_status_moves_directly_to_a_terminal_status(src: RunStatus, dst: RunStatus) -> None:
    with pytest.raises(InvalidTransition):
        check_transition(src, dst)


@pytest.mark.parametrize("dst", TERMINALS, ids=lambda s: s.value)
def test_every_terminal_status_is_reachable_from_finalizing(dst: RunStatus) -> None:
    check_transition(S.FINALIZING, dst)


def test_cancelling_may_give_up_straight_to_failed_but_to_no_other_terminal() -> None:
    check_transition(S.CANCELLING, S.FAILED)
    for dst in (S.COMPLETED, S.CANCELLED, S.BUDGET_EXCEEDED):
        with pytest.raises(InvalidTransition):
            check_transition(S.CANCELLING, dst)


def test_awaiting_authorization_never_jumps_to_running() -> None:
    with pytest.raises(InvalidTransition):
        check_transition(S.AWAITING_AUTHORIZATION, S.RUNNING)


def test_a_parked_run_never_skips_provisioning_or_jumps_to_a_terminal_status() -> None:
    for dst in (S.PROVISIONING, S.INITIALIZING, *TERMINALS):
        with pytest.raises(InvalidTransition):
            check_transition(S.WAITING_FOR_CONNECTION, dst)


def test_finalizing_cannot_go_back_to_cancelling_or_running() -> None:
    for dst in (S.CANCELLING, S.RUNNING, S.CREATED):
        with pytest.raises(InvalidTransition):
            check_transition(S.FINALIZING, dst)


@pytest.mark.parametrize("src", TERMINALS, ids=lambda s: s.value)
def test_terminal_states_are_sticky_with_no_edge_out(src: RunStatus) -> None:
    for dst in RunStatus:
        assert not can_transition(src, dst)
        with pytest.raises(InvalidTransition):
            check_transition(src, dst)


@pytest.mark.parametrize("status", list(RunStatus), ids=lambda s: s.value)
def test_no_status_transitions_to_itself(status: RunStatus) -> None:
    with pytest.raises(InvalidTransition):
        check_transition(status, status)


def test_terminal_set_is_exactly_the_four_terminal_statuses() -> None:
    assert set(TERMINAL) == set(TERMINALS)
    for status in RunStatus:
        assert is_terminal(status) == (status in TERMINALS)
        assert is_terminal(status.value) == (status in TERMINALS)


def test_accepts_work_is_exactly_the_launch_and_working_statuses_and_a_parked_run() -> None:
    # A run parked mid-run keeps its runner alive (heartbeats, token renewal) while one call waits.
    expected = {S.CREATED, S.PROVISIONING, S.INITIALIZING, S.RUNNING, S.AWAITING_APPROVAL, S.WAITING_FOR_CONNECTION}
    assert set(ACCEPTS_WORK) == expected
    for status in RunStatus:
        assert accepts_work(status) == (status in expected)
        assert accepts_work(status.value) == (status in expected)


@pytest.mark.parametrize(
    "status", [S.AWAITING_AUTHORIZATION, S.CANCELLING, S.FINALIZING, *TERMINALS], ids=lambda s: s.value
)
def test_parked_winding_down_and_terminal_runs_do_not_accept_work(status: RunStatus) -> None:
    assert not accepts_work(status)


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("completed", S.COMPLETED),
        ("cancelled", S.CANCELLED),
        ("budget_exceeded", S.BUDGET_EXCEEDED),
        ("failed", S.FAILED),
        ("error", S.FAILED),
        ("", S.FAILED),
        ("COMPLETED", S.FAILED),
        ("completed ", S.FAILED),
        ("running", S.FAILED),
    ],
)
def test_outcome_maps_completed_cancelled_budget_exceeded_verbatim_and_anything_else_to_failed(
    outcome: str, expected: RunStatus
) -> None:
    assert outcome_status(outcome) is expected
    assert is_terminal(outcome_status(outcome))
