"""Every recorded RunWorkflow history replays against the current workflow code.

A change to the order of commands the workflow issues (without ``workflow.patched``) fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.run import WORKFLOWS

HISTORIES = sorted((Path(__file__).resolve().parent / "histories").glob("*.json"))


def test_histories_were_recorded() -> None:
    assert {p.stem for p in HISTORIES} >= {
        "run_approved",
        "run_expired",
        "run_cancelled",
        "run_brokered",
        "run_moved_first",  # ends in ContinuedAsNew
        "run_moved_last",  # a resumed run: no provisioning
    }


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
