"""An agent cannot hide its edits from review: end to end on the real stack (issue 11, finding 4)."""

from __future__ import annotations

import shutil

import httpx
import pytest

from cli.stack import Stack
from tests.integration.helpers import events, make_agent, make_policy, run_row, start_run, wait_pending, wait_status

pytestmark = pytest.mark.stack

BACKDOOR = 'if name == "mallory": return "root"  # BACKDOOR'
PLANT_BACKDOOR = {
    "tool": "Edit",
    "input": {
        "file_path": "/workspace/app.py",
        "old_string": "def greet(name):\n",
        "new_string": f"def greet(name):\n    {BACKDOOR}\n",
    },
}


async def test_a_nested_commitless_repository_does_not_hide_the_backdoor(api: httpx.AsyncClient) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}})
    script = [
        PLANT_BACKDOOR,
        # The finding: a repository git cannot add, made with plain writes (and the empty dirs it needs).
        {"tool": "Write", "input": {"file_path": "/workspace/zz/.git/HEAD", "content": "ref: refs/heads/main\n"}},
        {"tool": "Bash", "input": {"command": "mkdir -p zz/.git/objects zz/.git/refs/heads"}},
    ]
    run_id = await start_run(api, await make_agent(api, script, policy=policy))
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert (row["status"], row["status_reason"]) == ("completed", None)
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert f"+    {BACKDOOR}" in out["diff"]
    assert "diff --git a/zz/.git/HEAD b/zz/.git/HEAD\nnew file mode 100644" in out["diff"]
    assert "artifact.missing" not in [e["type"] for e in await events(api, run_id)]


async def test_an_agent_written_gitignore_hides_no_new_file(api: httpx.AsyncClient) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}})
    script = [
        {"tool": "Write", "input": {"file_path": "/workspace/.gitignore", "content": "*\n"}},
        {"tool": "Write", "input": {"file_path": "/workspace/tools/evil.py", "content": "EVIL = 1\n"}},
    ]
    run_id = await start_run(api, await make_agent(api, script, policy=policy))
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert (row["status"], row["status_reason"]) == ("completed", None)
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert "diff --git a/.gitignore b/.gitignore" in out["diff"] and "+*" in out["diff"]
    assert "diff --git a/tools/evil.py b/tools/evil.py" in out["diff"] and "+EVIL = 1" in out["diff"]


async def test_a_run_whose_diff_cannot_be_produced_says_so_and_lists_what_changed(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}, "tools": [
        {"match": ["Edit"], "action": "allow"},
    ]})  # fmt: skip
    script = [PLANT_BACKDOOR, {"tool": "Bash", "input": {"command": "./deploy.sh"}}]
    run_id = await start_run(api, await make_agent(api, script, policy=policy))
    pending = await wait_pending(api, run_id)
    # The backdoor is in place and the run is parked: lose the baseline the way a disk fault would.
    shutil.rmtree(stack.home.resolve() / "runs" / run_id / "baseline.git")
    r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
    assert r.status_code == 200, r.text
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["status"] == "completed"  # the agent's reported outcome stands …
    assert row["status_reason"] == "diff unavailable: workspace is gone"  # … but never plainly
    assert (await run_row(api, run_id))["status_reason"] == row["status_reason"]
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    first, _, listing = out["diff"].partition("\n\n")
    assert first == "(diff unavailable: workspace is gone)"
    changed = [line.split() for line in listing.splitlines() if not line.startswith("#")]
    assert [(parts[0], parts[-1]) for parts in changed] == [("modified", "app.py")]
    evs = await events(api, run_id)
    missing = [e["payload"]["data"] for e in evs if e["type"] == "artifact.missing"]
    assert [(m["kind"], m["reason"], m["fallback"]) for m in missing] == [("diff", "workspace is gone", "file listing")]
    final = [e["payload"]["data"] for e in evs if e["type"] == "session.status_changed"][-1]
    assert (final["to"], final["reason"]) == ("completed", "diff unavailable: workspace is gone")
