"""Governed runs end to end on the real stack: approve, deny, expiry, autonomy, cancel."""

from __future__ import annotations

import asyncio
import os
import stat

import httpx
import pytest

from activities import rundirs
from cli.stack import Stack
from tests.integration.helpers import (
    DEMO_REPO,
    events,
    make_agent,
    make_policy,
    run_row,
    start_run,
    types,
    wait_pending,
    wait_status,
)

pytestmark = pytest.mark.stack

DEPLOY = [{"tool": "Bash", "input": {"command": "./deploy.sh"}}]


async def test_approved_run_fixes_the_bug_deploys_and_records_the_approval_in_order(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api))
    pending = await wait_pending(api, run_id)
    assert pending["tool"] == "Bash" and "deploy" in pending["summary"]
    r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
    assert r.status_code == 200 and r.json()["approval"]["status"] == "approved_once"
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["status"] == "completed"
    assert row["result_summary"] == "Replay complete: 4 executed, 1 denied."
    evs = await events(api, run_id)
    ordered = [
        (e["type"], e["payload"]["data"].get("to"))
        for e in evs
        if e["payload"]["data"].get("tool_call_id") == "rp_005" or e["type"] == "session.status_changed"
    ]
    start = ordered.index(("tool.requested", None))
    assert ordered[start : start + 6] == [
        ("tool.requested", None),
        ("approval.requested", None),
        ("session.status_changed", "awaiting_approval"),
        ("approval.decided", None),
        ("tool.decision", None),
        ("session.status_changed", "running"),
    ]
    statuses = [e["payload"]["data"]["to"] for e in evs if e["type"] == "session.status_changed"]
    assert statuses == [
        "provisioning",
        "initializing",
        "running",
        "awaiting_approval",
        "running",
        "finalizing",
        "completed",
    ]
    decision = next(e for e in evs if e["type"] == "tool.decision" and e["payload"]["data"]["tool_call_id"] == "rp_005")
    assert decision["payload"]["data"] == {
        "tool_call_id": "rp_005",
        "tool": "Bash",
        "verdict": "allow",
        "source": "human",
        "reason": "human:operator",
    }
    denied = next(e for e in evs if e["type"] == "tool.decision" and e["payload"]["data"]["tool_call_id"] == "rp_004")
    assert denied["payload"]["data"]["verdict"] == "deny"
    assert denied["payload"]["data"]["reason"] == 'shell command matches deny pattern "\\bcurl\\b"'
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    assert types(evs)[-1] == "run.result"
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert '+    return f"Hello, {name}!"' in out["diff"] and "deploy.log" in out["diff"]
    assert out["gate_consulted"] is True
    # The operator's directory was copied, never touched.
    assert "Hello, name!" in (DEMO_REPO / "app.py").read_text()
    assert not (DEMO_REPO / "deploy.log").exists()
    arts = (await api.get(f"/v1/sessions/{run_id}/artifacts")).json()["artifacts"]
    assert {a["name"] for a in arts} == {"changes.patch", "summary.md"}


async def test_denied_approval_withholds_the_deploy_and_the_run_still_completes(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api))
    pending = await wait_pending(api, run_id)
    r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
    assert r.status_code == 200 and r.json()["approval"]["status"] == "denied"
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["status"] == "completed"
    assert row["result_summary"] == "Replay complete: 3 executed, 2 denied. Deploy withheld — nothing was released."
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert "app.py" in out["diff"] and "deploy.log" not in out["diff"]


async def test_an_unanswered_approval_expires_into_a_deny(api: httpx.AsyncClient) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}, "approvals": {"default_ttl_secs": 2}})
    run_id = await start_run(api, await make_agent(api, DEPLOY, policy=policy))
    pending = await wait_pending(api, run_id)
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["result_summary"].endswith("Deploy withheld — nothing was released.")
    approvals = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
    assert [(a["id"], a["status"], a["decided_by"]) for a in approvals] == [(pending["id"], "expired", "timeout")]
    evs = await events(api, run_id)
    decided = next(e for e in evs if e["type"] == "approval.decided")["payload"]["data"]
    assert decided["decision"] == "expired" and decided["decided_by"] == "timeout"
    decision = next(e for e in evs if e["type"] == "tool.decision")["payload"]["data"]
    assert (decision["verdict"], decision["source"], decision["reason"]) == ("deny", "human", "human:timeout")
    late = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
    assert late.status_code == 409
    assert late.json() == {
        "error": "approval is not pending",
        "code": "conflict",
        "approval_status": "expired",
        "session_status": "completed",
    }
    assert "deploy.log" not in (await api.get(f"/v1/sessions/{run_id}/outputs")).json()["diff"]


async def test_an_autonomous_run_never_waits_and_the_policy_fallback_denies(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api), autonomous=True)
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["autonomy"] == "autonomous"
    assert row["result_summary"] == "Replay complete: 3 executed, 2 denied. Deploy withheld — nothing was released."
    evs = await events(api, run_id)
    assert "approval.requested" not in types(evs)
    assert "awaiting_approval" not in [e["payload"]["data"].get("to") for e in evs]
    rewrite = next(e for e in evs if e["type"] == "tool.decision" and e["payload"]["data"]["tool_call_id"] == "rp_005")
    assert rewrite["payload"]["data"]["source"] == "autonomy_rewrite"
    assert rewrite["payload"]["data"]["original_verdict"] == "require_approval"


async def test_cancel_quiesces_the_runner_and_a_second_cancel_answers_false(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api, [{"sleep_ms": 600000}]))
    await wait_status(api, run_id, {"running"})
    first = await api.post(f"/v1/sessions/{run_id}/cancel")
    assert first.status_code == 200 and first.json() == {"cancelled": True}
    again = await api.post(f"/v1/sessions/{run_id}/cancel")
    assert again.json() == {"cancelled": False}
    row = await wait_status(api, run_id, {"cancelled", "failed", "completed"})
    assert (row["status"], row["status_reason"]) == ("cancelled", "cancelled by user")
    evs = await events(api, run_id)
    assert "run.quiesce_requested" in types(evs)
    statuses = [e["payload"]["data"]["to"] for e in evs if e["type"] == "session.status_changed"]
    assert statuses[-3:] == ["cancelling", "finalizing", "cancelled"]
    assert (await api.post(f"/v1/sessions/{run_id}/cancel")).json() == {"cancelled": False}


async def test_cancelling_a_run_that_waits_for_approval_denies_the_pending_call(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api, DEPLOY))
    pending = await wait_pending(api, run_id)
    assert (await api.post(f"/v1/sessions/{run_id}/cancel")).json() == {"cancelled": True}
    await wait_status(api, run_id, {"cancelled"})
    approvals = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
    assert [(a["id"], a["status"]) for a in approvals] == [(pending["id"], "denied")]
    late = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
    assert late.status_code == 409


async def test_two_concurrent_decisions_yield_exactly_one_decision(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api, DEPLOY))
    pending = await wait_pending(api, run_id)
    url = f"/v1/approvals/{pending['id']}/decision"
    results = await asyncio.gather(
        *[api.post(url, json={"decision": d}) for d in ("approve", "deny", "approve", "deny")]
    )
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 409, 409, 409]
    assert all(r.json()["error"] == "approval is not pending" for r in results if r.status_code == 409)
    await wait_status(api, run_id, {"completed"})
    evs = await events(api, run_id)
    assert types(evs).count("approval.decided") == 1
    assert types(evs).count("tool.decision") == 1


async def test_a_new_run_gets_its_own_snapshot_and_status_is_visible_in_listings(api: httpx.AsyncClient) -> None:
    agent = await make_agent(api, [{"say": "hello"}])
    run_id = await start_run(api, agent, workspace=None)
    row = await wait_status(api, run_id, {"completed"})
    assert row["run_spec"]["policy_name"] == "demo" and row["run_spec"]["agent_name"] == agent
    assert row["run_spec"]["workspace"] == {
        "kind": "scratch",
        "path": None,
        "url": None,
        "ref": None,
        "credential": None,
    }
    listed = (await api.get("/v1/sessions", params={"limit": 5})).json()["sessions"]
    assert run_id in [s["id"] for s in listed]
    detail = (await api.get(f"/v1/sessions/{run_id}")).json()
    assert detail["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cost_usd": 0.0,
        "requests": 0,
    }
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert out["diff"] == "(no changes)"
    assert (await run_row(api, run_id))["finished_at"] is not None


async def test_a_tool_step_that_cannot_execute_fails_the_run_loudly(api: httpx.AsyncClient) -> None:
    script = [
        {"say": "editing"},
        {"tool": "Edit", "input": {"file_path": "/workspace/app.py", "old_string": "absent", "new_string": "x"}},
        {"say": "never said"},
    ]
    run_id = await start_run(api, await make_agent(api, script))
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["status"] == "failed"
    assert row["status_reason"] == "runner reported failed"
    assert row["result_summary"].startswith("replay runner failed:")
    evs = await events(api, run_id)
    errors = [e for e in evs if e["type"] == "run.error"]
    assert len(errors) == 1 and "old_string occurs 0 times" in errors[0]["payload"]["data"]["message"]
    said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
    assert "never said" not in said


async def test_a_denied_step_is_narrated_with_its_on_deny_text(api: httpx.AsyncClient) -> None:
    script = [
        {"tool": "Bash", "input": {"command": "curl https://example.com"}, "on_deny_say": "no network, as expected"},
        {"tool": "Bash", "input": {"command": "wget x"}},
    ]
    run_id = await start_run(api, await make_agent(api, script))
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["result_summary"] == "Replay complete: 0 executed, 2 denied."
    said = [e["payload"]["data"]["text"] for e in await events(api, run_id) if e["type"] == "agent.message"]
    assert "no network, as expected" in said
    assert any(t.startswith("Bash denied: shell command matches deny pattern") for t in said)
    calls = [e["payload"]["data"]["tool_call_id"] for e in await events(api, run_id) if e["type"] == "tool.requested"]
    assert calls == ["rp_001", "rp_002"]


# Inside the sandbox: find the runner by its command line and try to read its memory map (the first step
# of reading its tokens out of /proc/<pid>/mem). Same uid, a descendant: only non-dumpability stops it.
MEMORY_PROBE = (
    "for p in /proc/[0-9]*; do "
    "if tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -qE '^[^ ]*python[^ ]* (-S )?-m runner $'; then "
    "if head -c 64 $p/maps >/dev/null 2>&1; then echo RUNNER_MEMORY_READABLE; else echo RUNNER_MEMORY_DENIED; fi; "
    "fi; done"
)


async def test_the_agent_cannot_read_the_runners_memory(api: httpx.AsyncClient) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}, "tools": []})
    agent = await make_agent(api, [{"tool": "Bash", "input": {"command": MEMORY_PROBE}}], policy=policy)
    run_id = await start_run(api, agent, workspace=None)
    await wait_status(api, run_id, {"completed"})
    said = "\n".join(
        e["payload"]["data"].get("text", "") for e in await events(api, run_id) if e["type"] == "agent.message"
    )
    verdicts = [line for line in said.splitlines() if line.startswith("RUNNER_MEMORY_")]
    assert verdicts == ["RUNNER_MEMORY_DENIED"], said


async def test_the_ledger_says_how_the_sandbox_is_confined_and_the_agent_runs_under_the_syscall_filter(
    api: httpx.AsyncClient,
) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}, "tools": []})
    probe = "grep -E '^Seccomp:' /proc/self/status"
    agent = await make_agent(api, [{"tool": "Bash", "input": {"command": probe}}], policy=policy)
    run_id = await start_run(api, agent, workspace=None)
    await wait_status(api, run_id, {"completed"})
    said = [e["payload"]["data"].get("text", "") for e in await events(api, run_id) if e["type"] == "agent.message"]
    [launched] = [s for s in said if s.startswith("sandbox launched")]
    # The limits are whatever this host's cgroups allow (named either way); the filter is always on here.
    assert "; limits: " in launched and launched.endswith("; syscall filter: on)"), launched
    assert any("Seccomp:\t2" in s or "Seccomp: 2" in s for s in said), said  # SECCOMP_MODE_FILTER


async def test_what_a_run_leaves_on_the_host_is_private_and_grants_no_privilege(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    # Issue 11, finding 3, end to end: an agent's setuid copy of a binary must not survive onto the host.
    plant = "cp /usr/bin/id suid_id && chmod 4755 suid_id && mkfifo pipe && ls -l suid_id"
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}})
    run_id = await start_run(api, await make_agent(api, [{"tool": "Bash", "input": {"command": plant}}], policy=policy))
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["status"] == "completed"
    said = [e["payload"]["data"]["text"] for e in await events(api, run_id) if e["type"] == "agent.message"]
    assert any(text.startswith("$ cp /usr/bin/id") and "-rwsr-xr-x" in text for text in said), said

    runs, run_dir = stack.home / "runs", stack.home / "runs" / run_id
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    planted = (run_dir / "workspace" / "suid_id").lstat()
    assert planted.st_uid == os.geteuid()
    assert not planted.st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert not (run_dir / "workspace" / "pipe").exists()
    assert (run_dir / rundirs.FINISHED_MARK).exists(), "the run's directory is retired after finalization"
