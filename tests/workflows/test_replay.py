"""Every recorded RunWorkflow history replays against the current workflow code.

A change to the order of commands the workflow issues (without ``workflow.patched``) fails here.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows import patches as p
from workflows.liveness import LivenessSweepWorkflow
from workflows.run import WORKFLOWS

HISTORIES = sorted((Path(__file__).resolve().parent / "histories").glob("*.json"))
SWEEPS = sorted((Path(__file__).resolve().parent / "histories" / "liveness").glob("*.json"))
WORKFLOW_SOURCES = sorted((Path(__file__).resolve().parents[2] / "workflows").glob("*.py"))

# Each patch in the register and a recorded history that records its marker (the new branch). The histories
# of the old branches went with them when the patches were deprecated (docs/decisions.md, "Retiring workflow
# patches"); these keep replaying until the deprecate_patch calls are removed.
EXERCISED_BY = {
    p.LIVENESS_BY_SWEEP: "run_approved_v4",
    p.SANDBOX_CAPACITY: "run_approved_v4",
    p.LOCAL_APPROVAL_STEPS: "run_expired_v4",
    p.PARKED_RUNS: "run_parked_up_front_v4",
    p.PARK_ON_BROKER_QUEUE: "run_parked_mid_run_v5",
    p.CAPACITY_IF_LIMITED: "run_brokered_v4",
    p.LOCAL_PROVISION: "run_cancelled_v4",
    p.ROLE_QUEUES: "run_brokered_v3",
}


def patches(text: str) -> set[str]:
    """The patch ids a history recorded a marker for (by ``workflow.patched`` or ``deprecate_patch``)."""
    out = set()
    for event in json.loads(text)["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker.get("markerName") == "core_patch":
            for payload in marker["details"]["patch-data"]["payloads"]:
                out.add(json.loads(base64.b64decode(payload["data"]))["id"])
    return out


def history(name: str) -> str:
    return (HISTORIES[0].parent / f"{name}.json").read_text()


def test_every_patch_the_workflows_call_is_in_the_register_at_the_stage_its_call_says() -> None:
    called: dict[str, str] = {}
    for source in WORKFLOW_SOURCES:
        for call, name in re.findall(r"workflow\.(patched|deprecate_patch)\(([A-Z_]+)\)", source.read_text()):
            called[getattr(p, name)] = "active" if call == "patched" else "deprecated"
    assert called == {patch.id: patch.stage for patch in p.PATCHES}


@pytest.mark.parametrize("patch", p.PATCHES, ids=lambda patch: patch.id)
def test_every_registered_patch_is_exercised_by_a_recorded_history(patch: p.Patch) -> None:
    assert patch.id in patches(history(EXERCISED_BY[patch.id])), EXERCISED_BY[patch.id]
    assert patch.new_branch and patch.old_branch


def test_every_history_recorded_before_the_deprecations_took_only_branches_the_code_still_has() -> None:
    """Any marker a history holds names a registered patch: a history that took a retired old branch (none
    of its markers, and the old commands) does not replay; test_recorded_history_replays_deterministically
    shows none is left."""
    for path in HISTORIES:
        assert patches(path.read_text()) <= set(p.BY_ID), path.stem


@pytest.mark.parametrize("name", ["run_parked_up_front_v4", "run_parked_mid_run_v4", "run_parked_up_front_v5",
                                  "run_parked_mid_run_v5"])  # fmt: skip
def test_parked_run_histories_wait_for_a_connection(name: str) -> None:
    """A run parked before provisioning and one parked on a brokered call (tests/workflows/record.py parked)."""
    text = history(name)
    assert p.PARKED_RUNS in patches(text) or p.PARK_ON_BROKER_QUEUE in patches(text)
    assert '"signalName": "connection_ready"' in text


@pytest.mark.parametrize("path", [h for h in HISTORIES if h.stem.endswith("_v4")], ids=lambda h: h.stem)
def test_histories_without_a_sandbox_queue_provision_in_a_local_activity(path: Path) -> None:
    if not path.stem.startswith("run_moved_last"):  # a continued run never provisions
        assert p.LOCAL_PROVISION in patches(path.read_text())
        assert "provision_run" not in scheduled_queues(path.read_text())  # recorded as a marker, no activity task
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
    assert p.ROLE_QUEUES in patches(text)
    queues = scheduled_queues(text)
    if path.stem != "run_moved_first_v3":  # a run that moves on ends in ContinuedAsNew, not in finalization
        assert queues["finalize_run"] == {"fluidbox-sandbox"}
        assert queues["begin_finalize"] == {"fluidbox-runs"}
    if path.stem != "run_moved_last_v3":  # a continued run never provisions
        assert queues["provision_run"] == {"fluidbox-sandbox"}
    if "brokered" in path.stem:
        assert queues["broker_call"] == {"fluidbox-broker"}


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
