"""Trigger subscriptions of kind ``api``, in process: secrets shown once, the management rules, who may do what,
and fires that start a run (the workflow start is what ``api.workflows.started`` records).

Schedule subscriptions need Temporal Schedules, and the runs' outcomes need a worker: those stay in
``tests/integration/test_triggers.py``."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.api.admin_helpers import make_agent, member_with_token, unique
from tests.api.conftest import Api

HOOK = "http://127.0.0.1:9/hook"
SUBSCRIPTION_FIELDS = {
    "id", "tenant_id", "name", "agent_id", "kind", "trigger_kind", "enabled", "task_template", "allow_task_override",
    "allow_workspace_override", "autonomous", "budgets", "workspace", "pinned_revision_id", "capabilities",
    "concurrency_policy", "when_unavailable", "callback_url", "has_callback_secret", "token_generation",
    "schedule_cron", "schedule_timezone", "missed_run_policy", "connection_id", "event_filter", "created_at",
    "updated_at",
}  # fmt: skip


async def create(client: httpx.AsyncClient, agent: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "name": unique("trig"), "task_template": "Handle {{item}}", **extra}
    r = await client.post("/v1/triggers", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def invoke(
    api: Api, sid: str, token: str, body: dict[str, Any] | None = None, key: str | None = None
) -> httpx.Response:
    headers = {"idempotency-key": key} if key is not None else {}
    async with api.as_token(token) as trigger:
        return await trigger.post(
            f"/v1/triggers/{sid}/invoke", json=body or {"context": {"item": "x"}}, headers=headers
        )


async def detail(api: Api, sid: str) -> dict[str, Any]:
    r = await api.client.get(f"/v1/triggers/{sid}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_the_token_and_callback_secret_are_shown_once_and_never_again(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    made = await create(api.client, agent, callback_url=HOOK)
    token, secret, sub = made["token"], made["callback_secret"], made["subscription"]
    assert token.startswith("fbx_trig_") and len(token) == len("fbx_trig_") + 64
    assert secret.startswith("fbx_whsec_") and len(secret) == len("fbx_whsec_") + 64
    assert set(sub) == SUBSCRIPTION_FIELDS, "never the sealed secret, nor the id of the key that sealed it"
    assert (sub["kind"], sub["trigger_kind"], sub["has_callback_secret"], sub["callback_url"]) == (
        "api",
        "api",
        True,
        HOOK,
    )
    base = "http://127.0.0.1:8787"  # the public URL the test's settings name
    assert {k: made[k] for k in ("base_url", "invoke_url", "poll_url_template", "ingress_url", "ingress_path")} == {
        "base_url": base,
        "invoke_url": f"{base}/v1/triggers/{sub['id']}/invoke",
        "poll_url_template": f"{base}/v1/triggers/{sub['id']}/runs/{{session_id}}",
        "ingress_url": None,
        "ingress_path": None,
    }
    assert made["schedule"] is None
    run = (await invoke(api, sub["id"], token)).json()["session_id"]
    listed = await api.client.get("/v1/triggers")
    assert listed.json()["base_url"] == base and listed.json()["schedules"] == []
    assert [s for s in listed.json()["subscriptions"] if s["id"] == sub["id"]] == [sub]
    async with api.as_token(token) as trigger:
        polled = await trigger.get(f"/v1/triggers/{sub['id']}/runs/{run}")
    for text in (listed.text, (await api.client.get(f"/v1/triggers/{sub['id']}")).text, polled.text):
        assert token[len("fbx_trig_") :] not in text and secret[len("fbx_whsec_") :] not in text
        assert "callback_secret_sealed" not in text and "callback_key_id" not in text


async def test_an_invoke_starts_one_run_and_the_same_idempotency_key_replays_it(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    made = await create(api.client, agent)
    sid, token = made["subscription"]["id"], made["token"]
    first = await invoke(api, sid, token, {"context": {"item": "a", "n": 3}}, key="order-17")
    assert first.status_code == 200, first.text
    run_id = first.json()["session_id"]
    assert first.json() == {
        "session_id": run_id,
        "status": "created",
        "replay": False,
        "poll_url": f"/v1/triggers/{sid}/runs/{run_id}",
    }
    spec = api.workflows.started[run_id]
    assert spec.task == "Handle a"
    again = await invoke(api, sid, token, {"context": {"n": 3, "item": "a"}}, key="order-17")
    assert again.json() == {**first.json(), "replay": True}
    drift = await invoke(api, sid, token, {"context": {"item": "b", "n": 3}}, key="order-17")
    assert (drift.status_code, drift.json()) == (
        422,
        {"error": "Idempotency-Key was already used with a different request body", "code": "unprocessable"},
    )
    burst = await asyncio.gather(*(invoke(api, sid, token, key="same-key") for _ in range(4)))
    assert len({r.json()["session_id"] for r in burst}) == 1
    assert sorted(r.json()["replay"] for r in burst) == [False, True, True, True]
    assert len(api.workflows.started) == 2, "one workflow per run, never one per replay"
    got = await detail(api, sid)
    assert len(got["sessions"]) == 2 and len(got["invocations"]) == 2 and got["deliveries"] == []
    newest = got["sessions"][-1]
    assert newest["id"] == run_id and newest["idempotency_key"] == "order-17"
    assert (newest["invocation_kind"], newest["invoked_by_kind"], newest["task"]) == ("api", "trigger", "Handle a")


async def test_a_poll_answers_the_run_finished_document_of_this_subscriptions_runs_only(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    one, two = await create(api.client, agent), await create(api.client, agent)
    run = (await invoke(api, one["subscription"]["id"], one["token"])).json()["session_id"]
    async with api.as_token(one["token"]) as mine, api.as_token(two["token"]) as other:
        polled = await mine.get(f"/v1/triggers/{one['subscription']['id']}/runs/{run}")
        assert polled.status_code == 200, polled.text
        body = polled.json()
        assert (body["event"], body["delivery_id"], body["attempt"], body["artifacts"]) == (
            "run.finished",
            None,
            None,
            [],
        )
        assert body["run"]["id"] == run and body["run"]["status"] == "created" and body["run"]["agent_name"] == agent
        assert body["run"]["invocation"]["subscription_id"] == one["subscription"]["id"]
        assert body["usage"]["tool_calls"] == 0
        r = await other.get(f"/v1/triggers/{two['subscription']['id']}/runs/{run}")
        assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"})
        # Another subscription's token on this subscription's path is not even authenticated.
        assert (await other.get(f"/v1/triggers/{one['subscription']['id']}/runs/{run}")).status_code == 401


async def test_run_now_fires_as_the_operator_and_the_refusals_start_nothing(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    made = await create(api.client, agent, task_template="Nightly sweep at {{fire_time}}")
    sid, token = made["subscription"]["id"], made["token"]
    r = await api.client.post(f"/v1/triggers/{sid}/run-now")
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"session_id", "status"} and r.json()["status"] == "created"
    spec = api.workflows.started[r.json()["session_id"]]
    assert spec.task.startswith("Nightly sweep at 20") and spec.task.endswith("Z")
    disabled = await api.client.post(f"/v1/triggers/{sid}/disable")
    assert disabled.status_code == 200 and disabled.json()["subscription"]["enabled"] is False
    for refused in (await api.client.post(f"/v1/triggers/{sid}/run-now"), await invoke(api, sid, token)):
        assert (refused.status_code, refused.json()) == (
            409,
            {"error": "trigger subscription is disabled", "code": "conflict"},
        )
    overridden = await api.client.post(f"/v1/triggers/{sid}/enable")
    assert overridden.json()["subscription"]["enabled"] is True
    r = await invoke(api, sid, token, {"task": "something else"})
    assert (r.status_code, r.json()["error"]) == (400, "this subscription does not allow task override")
    # The management token never invokes.
    r = await api.client.post(f"/v1/triggers/{sid}/invoke", json={"context": {"item": "x"}})
    assert r.status_code == 401
    assert len(api.workflows.started) == 1 and len((await detail(api, sid))["sessions"]) == 1


async def test_a_rotation_retires_the_old_token_and_the_new_one_polls_earlier_runs(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    made = await create(api.client, agent)
    sid, old = made["subscription"]["id"], made["token"]
    run = (await invoke(api, sid, old)).json()["session_id"]
    r = await api.client.post(f"/v1/triggers/{sid}/rotate_token")
    assert r.status_code == 200, r.text
    new = r.json()["token"]
    assert new != old and new.startswith("fbx_trig_") and r.json()["revoked"] == 1
    assert r.json()["subscription"]["token_generation"] == 2
    assert r.json()["invoke_url"] == made["invoke_url"]
    assert (await invoke(api, sid, old)).status_code == 401
    async with api.as_token(new) as trigger:
        assert (await trigger.get(f"/v1/triggers/{sid}/runs/{run}")).status_code == 200


async def test_a_patch_changes_only_the_mutable_fields_and_mints_a_new_secret_for_a_new_callback(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    one, two = await create(api.client, agent), await create(api.client, agent)
    sid = one["subscription"]["id"]
    refusals: list[tuple[dict[str, Any], int, str]] = [
        ({"agent": "x", "kind": "schedule"}, 400, "cannot change agent, kind: mutable fields are name, task_template"),
        ({"name": two["subscription"]["name"]}, 409, "already exists"),
        ({"name": ""}, 400, "invalid request: name: String should have at least 1 character"),
        ({"allow_task_override": "sometimes"}, 400, "invalid request: allow_task_override:"),
        ({"concurrency_policy": "sometimes"}, 400, "unknown concurrency_policy 'sometimes'"),
        ({"task_template": "Broken {{"}, 400, "unclosed '{{'"),
        ({"callback_url": "http://169.254.169.254/latest/meta-data"}, 400, "callback_url: refusing"),
    ]
    for body, status, message in refusals:
        r = await api.client.patch(f"/v1/triggers/{sid}", json=body)
        assert r.status_code == status and message in r.json()["error"], (body, r.text)
    assert (await detail(api, sid))["subscription"] == one["subscription"], "a refused patch changes nothing"
    r = await api.client.patch(f"/v1/triggers/{sid}", json={"callback_url": HOOK, "concurrency_policy": "replace"})
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"subscription", "schedule", "callback_secret"} and r.json()["schedule"] is None
    secret = r.json()["callback_secret"]
    assert secret.startswith("fbx_whsec_") and r.json()["subscription"]["concurrency_policy"] == "replace"
    r = await api.client.patch(f"/v1/triggers/{sid}", json={"callback_url": HOOK})
    assert r.status_code == 200 and r.json()["callback_secret"] is None  # the same URL keeps its secret
    r = await api.client.patch(f"/v1/triggers/{sid}", json={"callback_url": ""})
    assert r.json()["subscription"]["callback_url"] is None and r.json()["subscription"]["has_callback_secret"] is False
    assert secret[len("fbx_whsec_") :] not in (await api.client.get(f"/v1/triggers/{sid}")).text


async def test_members_with_the_admin_or_owner_role_manage_triggers_and_plain_members_cannot(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    admin, plain = await member_with_token(api, ["admin"]), await member_with_token(api, ["member", "approver"])
    async with admin.client as a, plain.client as m:
        r = await a.post("/v1/triggers", json={"agent": agent, "name": unique("t"), "task_template": "hi"})
        assert r.status_code == 200, r.text
        sid = r.json()["subscription"]["id"]
        assert sid in {s["id"] for s in (await a.get("/v1/triggers")).json()["subscriptions"]}
        for method, path in (
            ("GET", "/v1/triggers"),
            ("POST", "/v1/triggers"),
            ("GET", f"/v1/triggers/{sid}"),
            ("POST", f"/v1/triggers/{sid}/disable"),
            ("POST", f"/v1/triggers/{sid}/run-now"),
        ):
            r = await m.request(method, path, json={} if method == "POST" else None)
            assert r.status_code == 403 and "admin or owner role" in r.json()["error"], (path, r.text)
    assert (await detail(api, sid))["subscription"]["enabled"] is True and api.workflows.started == {}


async def test_an_admin_members_trigger_cannot_copy_a_host_path_when_created_edited_or_fired(
    api: Api, tmp_path: Path
) -> None:
    """Issue 24, finding 2 (the stack test of the same name also runs the fires to their end)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "README").write_text("hello\n")
    agent = await make_agent(api.client, [{"say": "done"}])
    defaulted = await make_agent(
        api.client, [{"say": "done"}], default_workspace={"kind": "local_copy", "path": str(tree)}
    )
    admin = await member_with_token(api, ["admin"])
    async with admin.client as member:
        for workspace in (
            {"kind": "local_copy", "path": str(tree)},
            {"kind": "git_repository", "url": f"file://{tree}"},
        ):
            r = await member.post(
                "/v1/triggers",
                json={"agent": agent, "name": unique("host"), "task_template": "t", "workspace": workspace},
            )
            assert r.status_code == 403, r.text
            assert "control-plane host path and is restricted to the operator" in r.json()["error"]
        r = await member.post("/v1/triggers", json={"agent": defaulted, "name": unique("dflt"), "task_template": "t"})
        assert r.status_code == 403 and "the agent's default workspace is a control-plane host path" in r.text
        assert (await member.get("/v1/triggers")).json()["subscriptions"] == []

        # The operator's own host-path trigger: members may fire it, not edit it.
        mine = await create(
            api.client, agent, task_template="Copy it", workspace={"kind": "local_copy", "path": str(tree)}
        )
        sid = mine["subscription"]["id"]
        r = await member.patch(f"/v1/triggers/{sid}", json={"task_template": "Now read /root {{item}}"})
        assert r.status_code == 403 and "restricted to the operator" in r.json()["error"], r.text
        assert (await detail(api, sid))["subscription"]["task_template"] == "Copy it"
        fired = await member.post(f"/v1/triggers/{sid}/run-now")
        assert fired.status_code == 200, fired.text
        spec = api.workflows.started[fired.json()["session_id"]]
        assert spec.workspace.kind == "local_copy"

    # A row an admin member stored before the rule (host_paths_allowed false) fires no host path; the operator's
    # edit lets it fire again.
    legacy = await create(
        api.client, agent, task_template="Copy it", workspace={"kind": "local_copy", "path": str(tree)}
    )
    lid = legacy["subscription"]["id"]
    async with api.ctx.pool.acquire() as conn:
        await conn.execute("UPDATE trigger_subscriptions SET host_paths_allowed = false WHERE id = $1", uuid.UUID(lid))
    r = await api.client.post(f"/v1/triggers/{lid}/run-now")
    assert r.status_code == 403 and "restricted to the operator" in r.json()["error"], r.text
    r = await invoke(api, lid, legacy["token"], body={}, key=unique("k"))
    assert r.status_code == 403, r.text
    assert (await detail(api, lid))["sessions"] == [] and len(api.workflows.started) == 1
    r = await api.client.patch(f"/v1/triggers/{lid}", json={"name": legacy["subscription"]["name"]})
    assert r.status_code == 200, r.text
    r = await api.client.post(f"/v1/triggers/{lid}/run-now")
    assert r.status_code == 200, r.text
    assert r.json()["session_id"] in api.workflows.started


BAD_SUBSCRIPTIONS: list[tuple[dict[str, Any], int, str]] = [
    ({"agent": "no-such-agent"}, 400, "unknown agent 'no-such-agent'"),
    ({"concurrency_policy": "often"}, 400, "unknown concurrency_policy"),
    ({"capabilities": ["not-attached"]}, 400, "capabilities can only narrow"),
    ({"events": ["pull_request.opened"]}, 400, "apply to event subscriptions"),
    ({"task_template": "Fix {{issue"}, 400, "unclosed '{{'"),
    ({"callback_url": "http://10.0.0.5/hook"}, 400, "callback_url: refusing"),
    ({"callback_url": "ftp://example.com/x"}, 400, "callback_url: refusing"),
    ({"when_unavailable": "wait"}, 400, "when_unavailable"),
    ({"colour": "red"}, 400, "unknown field 'colour'"),
]


async def test_a_bad_subscription_is_refused_naming_the_problem_and_nothing_is_stored(api: Api) -> None:
    agent = await make_agent(api.client, [{"say": "done"}])
    for extra, status, message in BAD_SUBSCRIPTIONS:
        body = {"agent": agent, "name": unique("bad"), "task_template": "t", **extra}
        r = await api.client.post("/v1/triggers", json=body)
        assert r.status_code == status and message in r.json()["error"], (extra, r.text)
        assert set(r.json()) == {"error", "code"}
    assert (await api.client.get("/v1/triggers")).json()["subscriptions"] == []
