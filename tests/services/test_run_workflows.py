"""The RunWorkflows seam keeps one contract, whichever side of it runs: InMemoryRunWorkflows (the in-process API
tier's) and TemporalRunWorkflows over a real Temporal server (the time-skipping test server, as
tests/test_registration.py uses; no worker is needed, since every case is about a run's workflow existing or not).

- a second start of one run raises WorkflowExists, and the first stays as it was;
- a signal to a run with no workflow is not an error (the intent is in PostgreSQL already);
- an approval wait for a run with no workflow answers None (the run accepts no more work);
- a brokered call for a run with no workflow raises BadRequest.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from config.settings import Settings
from contracts import temporal as c
from core.errors import BadRequest
from core.policy import Budgets
from core.runspec import RunSpec, WorkspaceSpec
from services.run_control import InMemoryRunWorkflows, RunWorkflows, TemporalRunWorkflows, WorkflowExists

TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"
SETTINGS = Settings(task_queue=f"contract-{uuid.uuid4().hex[:8]}")  # no worker polls it: nothing runs


def spec(task: str = "t") -> RunSpec:
    return RunSpec(
        run_id=str(uuid.uuid4()), tenant_id="t", agent_id="a", agent_revision_id="r", agent_name="agent",
        harness="replay", model="replay", task=task, workspace=WorkspaceSpec(), autonomy="supervised",
        budgets=Budgets(), policy_id="p", policy_name="p", policy_version=1, policy_snapshot={"name": "p"},
    )  # fmt: skip


@pytest.fixture(scope="module")
async def temporal() -> AsyncIterator[Client]:
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter
    ) as env:
        # A start sets RunStatus and AgentName; the deployed namespace defines them (cli/stack.py), this one must too.
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=env.client.namespace,
                search_attributes={name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in c.SEARCH_ATTRIBUTES},
            )
        )
        yield env.client


@pytest.fixture(params=["in_memory", "temporal"])
def workflows(request: pytest.FixtureRequest) -> RunWorkflows:
    if request.param == "in_memory":
        return InMemoryRunWorkflows()
    client: Client = request.getfixturevalue("temporal")  # the server starts only for this side

    async def connected() -> Client:
        return client

    return TemporalRunWorkflows(connected)


async def test_a_second_start_of_one_run_raises_workflow_exists(workflows: RunWorkflows) -> None:
    first = spec("first")
    await workflows.start(first, SETTINGS)
    with pytest.raises(WorkflowExists):
        await workflows.start(first.model_copy(update={"task": "second"}), SETTINGS)
    # Another run starts as usual.
    await workflows.start(spec(), SETTINGS)


async def test_a_signal_to_a_run_with_no_workflow_is_not_an_error(workflows: RunWorkflows) -> None:
    nobody = str(uuid.uuid4())
    await workflows.cancel(nobody)
    await workflows.runner_finished(nobody)
    await workflows.approval_decided(nobody, "tc-1", "approved_once")
    await workflows.connection_ready([nobody, str(uuid.uuid4())])


async def test_an_approval_wait_for_a_run_with_no_workflow_answers_none(workflows: RunWorkflows) -> None:
    assert await workflows.await_approval(str(uuid.uuid4()), "tc-1") is None


async def test_a_brokered_call_for_a_run_with_no_workflow_is_a_bad_request(workflows: RunWorkflows) -> None:
    with pytest.raises(BadRequest, match="session is not active"):
        await workflows.broker(str(uuid.uuid4()), "tc-1", "sha256:0", 1)
