"""Every ``workflow.patched`` id the workflows use, with what its old branch did and where it stands (pure).

A change to the commands a workflow issues needs a patch: runs recorded before it must replay the old branch.
A patch moves through three stages (docs/decisions.md, "Retiring workflow patches"):

1. ``active``: ``workflow.patched(id)`` chooses between the branches; the histories in ``tests/workflows/
   histories`` hold runs of both.
2. ``deprecated``: no run that started before the patch can still be open, so the old branch is gone and the
   call is ``workflow.deprecate_patch(id)`` (histories that recorded the marker still replay; histories that
   took the old branch were deleted with it).
3. removed: no run that started before the deprecation can still be open; the call goes, and so does the entry.

``tests/workflows/test_replay.py`` holds the code to this register: every id the workflow modules name is
here with the stage its call says, and every entry names recorded histories that exercise it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from contracts.temporal import ROLE_QUEUES  # the liveness sweep and the run share it

LIVENESS_BY_SWEEP = "liveness-by-sweep"
SANDBOX_CAPACITY = "sandbox-capacity"
LOCAL_APPROVAL_STEPS = "local-approval-steps"
PARKED_RUNS = "parked-runs"
PARK_ON_BROKER_QUEUE = "park-on-broker-queue"
CAPACITY_IF_LIMITED = "capacity-if-limited"
LOCAL_PROVISION = "local-provision"


@dataclass(frozen=True)
class Patch:
    id: str
    added: str  # the day it shipped
    stage: Literal["active", "deprecated"]
    new_branch: str
    old_branch: str  # what runs recorded before the patch do (for a deprecated patch: did, until it was retired)


PATCHES = (
    Patch(
        LIVENESS_BY_SWEEP, "2026-11-30", "deprecated",
        "a run waits on signals and timers; one LivenessSweepWorkflow watches every live run",
        "one supervise_run activity per run, holding a worker slot for the run's whole life",
    ),
    Patch(
        SANDBOX_CAPACITY, "2026-11-30", "deprecated",
        "a run takes a sandbox place under FLUIDBOX_MAX_SANDBOXES before provisioning, waiting on timers",
        "provisioning at once, whatever the number of live sandboxes",
    ),
    Patch(
        LOCAL_APPROVAL_STEPS, "2026-11-30", "deprecated",
        "an approval's open, re-read and resume steps are local activities",
        "each step an activity on the task queue",
    ),
    Patch(
        PARKED_RUNS, "2026-12-02", "deprecated",
        "a run waits for a connection (up front, or on one brokered call)",
        "a run whose connection is unusable fails",
    ),
    Patch(
        PARK_ON_BROKER_QUEUE, "2026-12-02", "deprecated",
        "a call brokered on the broker task queue parks as a local one does",
        "a parked answer from the broker queue came back to the runner unparked",
    ),
    Patch(
        CAPACITY_IF_LIMITED, "2026-12-03", "deprecated",
        "a run started with no sandbox maximum takes no place",
        "every run took a place (a local activity) even with no maximum",
    ),
    Patch(
        LOCAL_PROVISION, "2026-12-03", "deprecated",
        "with no sandbox task queue, provisioning is a local activity",
        "provisioning an activity on the runs queue",
    ),
    Patch(
        ROLE_QUEUES, "2026-12-01", "deprecated",
        "sandbox work and brokered calls go to their own task queues when configured",
        "every activity on the workflow's own task queue",
    ),
)  # fmt: skip

BY_ID = {patch.id: patch for patch in PATCHES}

__all__ = [
    "BY_ID",
    "CAPACITY_IF_LIMITED",
    "LIVENESS_BY_SWEEP",
    "LOCAL_APPROVAL_STEPS",
    "LOCAL_PROVISION",
    "PARKED_RUNS",
    "PARK_ON_BROKER_QUEUE",
    "PATCHES",
    "ROLE_QUEUES",
    "SANDBOX_CAPACITY",
    "Patch",
]
