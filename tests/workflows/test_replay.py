"""Every recorded RunWorkflow history replays against the current workflow code.

A change to the order of commands the workflow issues (without ``workflow.patched``) fails here.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from contracts.temporal import ROLE_QUEUES
from workflows.liveness import LivenessSweepWorkflow
from workflows.run import (
    CAPACITY_IF_LIMITED,
    LIVENESS_BY_SWEEP,
    LOCAL_APPROVAL_STEPS,
    LOCAL_PROVISION,
    PARKED_RUNS,
    SANDBOX_CAPACITY,
    WORKFLOWS,
)

HISTORIES = sorted((Path(__file__).resolve().parent / "histories").glob("*.json"))
SWEEPS = sorted((Path(__file__).resolve().parent / "histories" / "liveness").glob("*.json"))


def test_histories_were_recorded() -> None:
    assert {p.stem for p in HISTORIES} >= {
        "run_approved",
        "run_expired",
        "run_cancelled",
        "run_brokered",
        "run_moved_first",  # ends in ContinuedAsNew
        "run_moved_last",  # a resumed run: no provisioning
    }
    # The same runs recorded after liveness moved to the sweep (the patched branches); the ones above
    # keep the branch that runs already in flight on a deployed system take.
    assert {p.stem for p in HISTORIES} >= {f"run_{n}_v2" for n in ("approved", "expired", "cancelled", "brokered")}
    assert {p.stem for p in HISTORIES} >= {"run_moved_first_v2", "run_moved_last_v2"}
    # And with sandbox work and brokered calls on task queues of their own (the role-task-queues patch).
    v3 = ("approved", "expired", "cancelled", "brokered", "moved_first", "moved_last")
    assert {p.stem for p in HISTORIES} >= {f"run_{n}_v3" for n in v3}


def patches(text: str) -> set[str]:
    """The workflow.patched ids a history recorded."""
    out = set()
    for event in json.loads(text)["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker.get("markerName") == "core_patch":
            for payload in marker["details"]["patch-data"]["payloads"]:
                out.add(json.loads(base64.b64decode(payload["data"]))["id"])
    return out


@pytest.mark.parametrize(
    "name", ["run_parked_up_front", "run_parked_mid_run", "run_parked_up_front_v4", "run_parked_mid_run_v4"]
)
def test_parked_run_histories_take_the_parked_runs_branch(name: str) -> None:
    """A run parked before provisioning and one parked on a brokered call (tests/workflows/record.py parked)."""
    text = (HISTORIES[0].parent / f"{name}.json").read_text()
    assert PARKED_RUNS in patches(text)
    assert '"signalName": "connection_ready"' in text


@pytest.mark.parametrize("path", [p for p in HISTORIES if p.stem.endswith(("_v2", "_v3", "_v4"))], ids=lambda p: p.stem)
def test_histories_of_the_current_code_take_the_patched_branches(path: Path) -> None:
    resumed = path.stem.startswith("run_moved_last")  # a continued run never provisions, so never claims a place
    want = {LIVENESS_BY_SWEEP} if resumed else {LIVENESS_BY_SWEEP, SANDBOX_CAPACITY}
    if path.stem.endswith("_v3"):
        want.add(ROLE_QUEUES)
    if path.stem.endswith("_v4") and not resumed:
        # Provisioning as a local activity, and no sandbox-place step without a sandbox limit.
        want |= {LOCAL_PROVISION, CAPACITY_IF_LIMITED}
        assert "provision_run" not in scheduled_queues(path.read_text())  # recorded as a marker, no activity task
    if not any(k in path.stem for k in ("cancelled", "brokered")):  # these two never wait on an approval
        want.add(LOCAL_APPROVAL_STEPS)
    if "parked" in path.stem:
        want.add(PARKED_RUNS)
    assert patches(path.read_text()) == want
    assert "supervise_run" not in path.read_text()


def scheduled_queues(text: str) -> dict[str, set[str]]:
    """Activity name → the task queues a history scheduled it on."""
    out: dict[str, set[str]] = {}
    for event in json.loads(text)["events"]:
        attrs = event.get("activityTaskScheduledEventAttributes")
        if attrs:
            out.setdefault(attrs["activityType"]["name"], set()).add(attrs["taskQueue"]["name"])
    return out


@pytest.mark.parametrize("path", [p for p in HISTORIES if p.stem.endswith("_v3")], ids=lambda p: p.stem)
def test_histories_with_split_task_queues_schedule_sandbox_and_broker_work_there(path: Path) -> None:
    text = path.read_text()
    assert ROLE_QUEUES in patches(text)
    queues = scheduled_queues(text)
    if path.stem != "run_moved_first_v3":  # a run that moves on ends in ContinuedAsNew, not in finalization
        assert queues["finalize_run"] == {"fluidbox-sandbox"}
        assert queues["begin_finalize"] == {"fluidbox-runs"}
    if path.stem != "run_moved_last_v3":  # a continued run never provisions
        assert queues["provision_run"] == {"fluidbox-sandbox"}
    if "brokered" in path.stem:
        assert queues["broker_call"] == {"fluidbox-broker"}
    # Histories recorded before the split schedule every activity on the workflow's own queue.
    older = (path.parent / path.name.replace("_v3", "_v2")).read_text()
    assert ROLE_QUEUES not in patches(older)
    assert set().union(*scheduled_queues(older).values()) == {"fluidbox-runs"}


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_recorded_history_replays_deterministically(path: Path) -> None:
    text = path.read_text()
    workflow_id = json.loads(text)["events"][0]["workflowExecutionStartedEventAttributes"].get("workflowId", "run")
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(WorkflowHistory.from_json(workflow_id, text))
    assert result.replay_failure is None


async def test_a_reordered_workflow_fails_replay(tmp_path: Path) -> None:
    """Guard the guard: a history whose first activity was something else must not replay."""
    text = HISTORIES[0].read_text().replace('"provision_run"', '"finalize_run"', 1)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(WorkflowHistory.from_json("run-x", text), raise_on_replay_failure=False)
    assert result.replay_failure is not None


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
async def test_the_liveness_sweep_history_replays_deterministically(path: Path) -> None:
    text = path.read_text()
    replayer = Replayer(workflows=[LivenessSweepWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(WorkflowHistory.from_json("fluidbox-liveness-sweep", text))
    assert result.replay_failure is None
    assert len(json.loads(text)["events"]) > 10, "a history with a few sweeps in it"
    want = "fluidbox-sandbox" if path.stem.endswith("_v3") else "fluidbox-runs"
    assert scheduled_queues(text) == {"sweep_liveness": {want}}
