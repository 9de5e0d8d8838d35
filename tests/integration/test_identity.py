"""Users, personal access tokens and personal connections, end to end on the real stack.

Users and their PATs are made the way an operator makes them, with the local admin command
(``fluidbox users add`` / ``fluidbox users token`` against the stack's database); everything else goes
through the public API with those PATs, and brokered calls go to a real MCP server that accepts only
one user's credential.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from core.digests import sha256_hex
from tests.helpers import eventually
from tests.integration.helpers import (
    events,
    issue_token,
    make_agent,
    make_policy,
    types,
    unique,
    wait_pending,
    wait_status,
)
from tests.mcp_servers import bearer, serve

pytestmark = pytest.mark.stack

FLUIDBOX = str(Path(sys.executable).parent / "fluidbox")
PAT = re.compile(r"fbx_pat_[0-9a-f]{64}")
BROKER_POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "tools": [{"match": ["mcp__*"], "action": "allow"}],
}


async def fluidbox(stack: Stack, *args: str) -> tuple[int, str, str]:
    """The real ``fluidbox`` command against this stack's database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUIDBOX_")}
    env["FLUIDBOX_DATABASE_URL"] = stack.database_url or ""
    proc = await asyncio.create_subprocess_exec(
        FLUIDBOX, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def add_user(stack: Stack, *roles: str) -> dict[str, Any]:
    email = f"{unique('u')}@example.com"
    role_args = [a for r in roles for a in ("--role", r)]
    rc, out, err = await fluidbox(stack, "users", "add", "--email", email, "--name", "Test User", *role_args)
    assert rc == 0, out + err
    return dict(json.loads(out)["member"])


async def mint(stack: Stack, email: str, name: str = "tests") -> str:
    rc, out, err = await fluidbox(stack, "users", "token", email, "--name", name)
    assert rc == 0, out + err
    return str(json.loads(out)["token"])


@asynccontextmanager
async def as_user(stack: Stack, token: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
    ) as client:
        yield client


async def test_a_pat_is_shown_once_and_its_member_is_re_checked_on_every_use(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    member = await add_user(stack)
    rc, out, err = await fluidbox(stack, "users", "token", member["email"], "--name", "laptop")
    assert rc == 0 and "shown once" in err, out + err
    token = json.loads(out)["token"]
    assert PAT.fullmatch(token) and PAT.findall(out) == [token], "printed exactly once"
    async with as_user(stack, token) as me:
        r = await me.get("/v1/auth/me")
        assert r.status_code == 200, r.text
        assert r.json() == {
            "user_id": member["user_id"],
            "membership_id": member["id"],
            "org": {"slug": "default", "display_name": "default"},
            "user": {"email": member["email"], "name": "Test User"},
            "roles": ["member"],
            "auth_kind": "pat",
        }
        listed = await me.get("/v1/auth/tokens")
        assert listed.status_code == 200
        [row] = listed.json()["tokens"]
        assert row["name"] == "laptop" and token.startswith(row["display_prefix"]) and row["last_used_at"]
        assert token not in listed.text and token[len(row["display_prefix"]) :] not in listed.text
        # Minting needs a browser session (none exists in this build): a PAT and the operator are refused.
        minted = await me.post("/v1/auth/tokens", json={"name": "more"})
        assert (minted.status_code, minted.json()["error"]) == (
            403,
            "a personal access token cannot mint, extend, or revoke tokens — use a browser session",
        )
        # An operator-only route names what it needs instead of pretending the token is unknown.
        r = await me.get("/v1/agents")
        assert r.status_code == 403 and "requires the operator (admin) token" in r.json()["error"]
        r = await me.get("/v1/admin/orgs/default/members")
        assert r.status_code == 403
    minted = await api.post("/v1/auth/tokens", json={"name": "x"})
    assert minted.status_code == 403 and "the operator token has none" in minted.json()["error"]
    assert (await api.get("/v1/auth/me")).json() == {"operator": True}
    async with as_user(stack, "fbx_pat_" + secrets.token_hex(32)) as stranger:
        assert (await stranger.get("/v1/auth/me")).status_code == 401
        assert (await stranger.get("/v1/agents")).status_code == 401
    # Only the digest is stored.
    import asyncpg

    conn = await asyncpg.connect(stack.database_url or "")
    try:
        stored = await conn.fetch(
            "SELECT * FROM api_tokens WHERE kind = 'pat' AND user_id = $1", uuid.UUID(member["user_id"])
        )
    finally:
        await conn.close()
    assert len(stored) == 1 and stored[0]["token_sha256"] == sha256_hex(token)
    assert token not in repr([dict(r) for r in stored])
    # The same email twice is refused, and nothing is added.
    rc, out, err = await fluidbox(stack, "users", "add", "--email", member["email"].upper(), "--name", "Again")
    assert rc == 1 and "already exists" in err
    rc, _, err = await fluidbox(stack, "users", "add", "--email", "x@example.com", "--name", "X", "--role", "root")
    assert rc == 1 and "unknown role(s) root" in err
    emails = [m["email"] for m in (await api.get("/v1/admin/orgs/default/members")).json()["members"]]
    assert emails.count(member["email"]) == 1 and "x@example.com" not in emails
    # A leaked token is revoked on its own; the member's other tokens keep working.
    spare = await mint(stack, member["email"], "spare")
    rc, out, err = await fluidbox(stack, "users", "revoke-token", row["id"])
    assert rc == 0 and json.loads(out)["revoked"] is True, out + err
    async with as_user(stack, token) as revoked, as_user(stack, spare) as other:
        assert (await revoked.get("/v1/auth/me")).status_code == 401
        assert (await other.get("/v1/auth/me")).status_code == 200
    rc, _, err = await fluidbox(stack, "users", "revoke-token", row["id"])
    assert rc == 1 and "already revoked" in err


async def test_a_personal_connection_is_invisible_to_everyone_but_its_owner(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    alice, bob = await add_user(stack), await add_user(stack)
    secret = "alice-" + secrets.token_hex(12)
    async with (
        serve(bearer(secret)) as srv,
        as_user(stack, await mint(stack, alice["email"])) as a,
        as_user(stack, await mint(stack, bob["email"])) as b,
    ):
        body = {
            "provider": "mcp_http",
            "access": {"read": True},
            "base_url": srv.url,
            "token": secret,
            "owner": "personal",
        }
        r = await a.post("/v1/connections", json=body)
        assert r.status_code == 200, r.text
        conn = r.json()["connection"]
        assert (conn["owner_type"], conn["owner_user_id"]) == ("user", alice["user_id"]) and secret not in r.text
        cid = conn["id"]
        for who in (b, api):  # another member, and the operator: it does not exist for them
            for method, path in [
                ("GET", f"/v1/connections/{cid}"),
                ("GET", f"/v1/connections/{cid}/tools"),
                ("POST", f"/v1/connections/{cid}/tools/refresh"),
                ("POST", f"/v1/connections/{cid}/revoke"),
            ]:
                r = await who.request(method, path)
                assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"}), (
                    method,
                    path,
                    r.text,
                )
            listed = (await who.get("/v1/connections")).json()["connections"]
            assert cid not in {c["id"] for c in listed}
        assert (await a.get(f"/v1/connections/{cid}")).json()["connection"]["status"] == "active"
        assert cid in {c["id"] for c in (await a.get("/v1/connections")).json()["connections"]}
        assert (await a.get(f"/v1/connections/{cid}/tools")).json()["snapshot"]["version"] == 1
        # The operator has no user to own a personal connection; a plain member cannot make an org one.
        r = await api.post("/v1/connections", json=body)
        assert r.status_code == 400 and "the operator token has none" in r.json()["error"]
        r = await b.post("/v1/connections", json={**body, "owner": "organization"})
        assert r.status_code == 403 and "requires the admin or owner role" in r.json()["error"]
        assert srv.methods.count("initialize") == 1, "refused requests never reached the server"
        r = await a.post(f"/v1/connections/{cid}/revoke")
        assert r.status_code == 200 and r.json()["connection"]["status"] == "revoked"


async def test_invoking_user_binds_the_invokers_connection_and_deactivation_cuts_it_mid_run(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    alice, bob = await add_user(stack), await add_user(stack)
    secret = "alice-" + secrets.token_hex(12)
    async with (
        serve(bearer(secret)) as srv,  # accepts Alice's credential and nothing else
        as_user(stack, await mint(stack, alice["email"])) as a,
        as_user(stack, await mint(stack, bob["email"])) as b,
    ):
        r = await a.post(
            "/v1/connections",
            json={
                "provider": "mcp_http",
                "access": {"read": True},
                "base_url": srv.url,
                "token": secret,
                "owner": "personal",
            },
        )
        assert r.status_code == 200, r.text
        cid = r.json()["connection"]["id"]
        requirement = {
            "slot": "calc", "connector": {"url": srv.url}, "required_tools": ["add"], "binding_mode": "invoking_user",
            "when_unavailable": "fail",  # refused at creation, as before parked runs (the default parks)
        }  # fmt: skip
        agent = await make_agent(
            api, [{"sleep_ms": 600000}], policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement],
        )  # fmt: skip
        # Bob has no personal connection to this server; the operator has no user at all.
        for who, message in [
            (b, "no active personal connection of the invoking user covers add"),
            (api, "binds to the invoking user's personal connection"),
        ]:
            r = await who.post("/v1/sessions", json={"agent": agent, "task": "t"})
            assert r.status_code == 400 and message in r.json()["error"], r.text
        r = await a.post(
            "/v1/sessions", json={"agent": agent, "task": "t", "workspace": {"kind": "local_copy", "path": "/etc"}}
        )
        assert r.status_code == 403 and "restricted to the operator" in r.json()["error"]
        r = await a.post("/v1/sessions", json={"agent": agent, "task": "t"})
        assert r.status_code == 200, r.text
        run = r.json()["session"]
        run_id = run["id"]
        assert (run["invoked_by_kind"], run["invoked_by_user_id"]) == ("user", alice["user_id"])
        [bound] = run["run_spec"]["brokered"]
        assert (bound["connection_id"], bound["owner_type"], bound["owner_user_id"]) == (cid, "user", alice["user_id"])

        # A plain member sees only the runs it invoked; the operator and an approver see all of them.
        assert (await b.get(f"/v1/sessions/{run_id}")).status_code == 404
        assert (await b.get(f"/v1/sessions/{run_id}/events")).status_code == 404
        assert (await b.post(f"/v1/sessions/{run_id}/cancel")).status_code == 404
        assert run_id not in {s["id"] for s in (await b.get("/v1/sessions")).json()["sessions"]}
        assert run_id in {s["id"] for s in (await a.get("/v1/sessions")).json()["sessions"]}
        r = await api.post(f"/v1/admin/orgs/default/members/{bob['id']}/roles", json={"roles": ["approver", "member"]})
        assert r.status_code == 200 and r.json()["member"]["roles"] == ["member", "approver"]
        assert (await b.get(f"/v1/sessions/{run_id}")).status_code == 200
        r = await b.post(f"/v1/sessions/{run_id}/cancel")
        assert r.status_code == 403 and "requires the admin or owner role" in r.json()["error"]
        r = await api.post(f"/v1/admin/orgs/default/members/{bob['id']}/roles", json={"roles": ["superuser"]})
        assert r.status_code == 400 and "superuser" in r.json()["error"]

        await wait_status(api, run_id, {"running"})
        tool_token = await issue_token(stack.database_url or "", run_id, "tool")
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {tool_token}"}, timeout=60
        ) as runner:
            call = {"tool_call_id": "c1", "tool": "mcp__calc__add", "input": {"a": 2, "b": 3}}
            answer = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=call)).json()
            assert answer["ok"] is True and answer["result"]["content"][0]["text"] == "5", answer
            assert srv.call_count("add") == 1

            # The kill switch: Alice's membership is deactivated while her run is in flight.
            r = await api.post(f"/v1/admin/orgs/default/members/{alice['id']}/deactivate")
            assert r.status_code == 200 and r.json()["member"]["status"] == "deactivated"
            again = await api.post(f"/v1/admin/orgs/default/members/{alice['id']}/deactivate")
            assert (again.status_code, again.json()) == (
                409,
                {"error": "membership is already deactivated", "code": "conflict"},
            )
            assert (await a.get("/v1/auth/me")).status_code == 401
            call = {"tool_call_id": "c2", "tool": "mcp__calc__add", "input": {"a": 1, "b": 1}}
            denied = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=call)).json()
            assert denied == {
                "ok": False,
                "denied": True,
                "message": "the owner of the bound personal connection is no longer an active member",
            }
            assert srv.call_count("add") == 1, "nothing was sent with the deactivated member's credential"
        refusals = [
            e["payload"]["data"] for e in await events(api, run_id)
            if e["type"] == "tool.decision" and e["payload"]["data"].get("source") == "binding"
        ]  # fmt: skip
        assert [d["tool_call_id"] for d in refusals] == ["c2"]
        rc, _, err = await fluidbox(stack, "users", "token", alice["email"], "--name", "after")
        assert rc == 1 and "deactivated" in err, "a deactivated member gets no new token"
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_only_the_owner_decides_an_approval_that_would_run_under_their_personal_connection(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    alice, bob = await add_user(stack), await add_user(stack)
    secret = "alice-" + secrets.token_hex(12)
    async with (
        serve(bearer(secret)) as srv,
        as_user(stack, await mint(stack, alice["email"])) as a,
        as_user(stack, await mint(stack, bob["email"])) as b,
    ):
        r = await a.post(
            "/v1/connections",
            json={"provider": "mcp_http", "access": {"read": True}, "base_url": srv.url, "token": secret,
                  "owner": "personal", "display_name": "alice-calc"},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        name = r.json()["connection"]["display_name"]
        requirement = {
            "slot": "calc", "connector": {"url": srv.url}, "required_tools": ["add"], "binding_mode": "invoking_user",
            "when_unavailable": "fail",  # refused at creation, as before parked runs (the default parks)
        }  # fmt: skip
        policy = {
            "defaults": {"tool_action": "deny"},
            "tools": [{"match": ["mcp__*"], "action": "approve"}, {"match": ["Bash"], "action": "approve"}],
        }
        script = [
            {"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}},
            {"tool": "Bash", "input": {"command": "echo credentialless"}},
        ]
        agent = await make_agent(
            api, script, policy=await make_policy(api, policy), connection_requirements=[requirement]
        )
        r = await a.post("/v1/sessions", json={"agent": agent, "task": "t"})
        assert r.status_code == 200, r.text
        run_id = r.json()["session"]["id"]
        pending = await wait_pending(api, run_id)
        assert pending["tool"] == "mcp__calc__add"
        aid = pending["id"]
        personal = (
            f"this approval executes under connection '{name}', a personal connection — "
            "only its owner, who invoked the run, may decide it"
        )

        # The operator sees it, marked, and cannot decide it — not even for the whole run.
        [listed] = [x for x in (await api.get("/v1/approvals")).json()["approvals"] if x["id"] == aid]
        assert (listed["authority"], listed["can_decide"]) == ("personal", False)
        for decision in ("approved_session", "approve", "deny"):
            r = await api.post(f"/v1/approvals/{aid}/decision", json={"decision": decision})
            assert (r.status_code, r.json()) == (403, {"error": personal, "code": "forbidden"}), r.text
        # Another member cannot see Alice's run at all; as an approver it sees it and still cannot decide.
        r = await b.post(f"/v1/approvals/{aid}/decision", json={"decision": "approve"})
        assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"})
        r = await api.post(f"/v1/admin/orgs/default/members/{bob['id']}/roles", json={"roles": ["approver"]})
        assert r.status_code == 200, r.text
        r = await b.post(f"/v1/approvals/{aid}/decision", json={"decision": "approved_session"})
        assert (r.status_code, r.json()) == (403, {"error": personal, "code": "forbidden"})
        assert aid not in {x["id"] for x in (await b.get("/v1/approvals")).json()["approvals"]}
        # Nothing changed: still pending, nothing decided in the ledger, nothing sent upstream.
        rows = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
        assert [(x["id"], x["status"]) for x in rows] == [(aid, "pending")]
        assert "approval.decided" not in types(await events(api, run_id))
        assert srv.call_count("add") == 0

        # The owner sees it in her inbox and decides it with her PAT; the call runs under her connection.
        [mine] = [x for x in (await a.get("/v1/approvals")).json()["approvals"] if x["id"] == aid]
        assert (mine["authority"], mine["can_decide"]) == ("personal", True)
        r = await a.post(f"/v1/approvals/{aid}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text
        assert (r.json()["approval"]["status"], r.json()["approval"]["decided_by"]) == (
            "approved_once",
            alice["user_id"],
        )

        # The next approval is credentialless (org authority): the approver decides it.
        async def inbox() -> list[dict[str, Any]]:
            return [x for x in (await b.get("/v1/approvals")).json()["approvals"] if x["session_id"] == run_id]

        [shell] = await eventually(inbox, message="the approver's inbox never showed the run's approval")
        assert (shell["tool"], shell["authority"], shell["can_decide"]) == ("Bash", "organization", True)
        r = await b.post(f"/v1/approvals/{shell['id']}/decision", json={"decision": "deny"})
        assert r.status_code == 200 and r.json()["approval"]["decided_by"] == bob["user_id"], r.text

        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["result_summary"] == "Replay complete: 1 executed, 1 denied."
        assert srv.call_count("add") == 1, "the owner's approval ran the call with the owner's credential"
        brokered = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "tool.brokered"]
        assert [(d["tool"], d["ok"]) for d in brokered] == [("mcp__calc__add", True)]
        decided = [e for e in await events(api, run_id) if e["type"] == "approval.decided"]
        assert [(e["payload"]["data"]["decided_by"], e["actor"]) for e in decided] == [
            (alice["user_id"], "human"),
            (bob["user_id"], "human"),
        ]


async def test_a_members_event_stream_ends_when_the_member_is_deactivated(api: httpx.AsyncClient, stack: Stack) -> None:
    carol = await add_user(stack)
    async with as_user(stack, await mint(stack, carol["email"])) as c:
        agent = await make_agent(api, [{"sleep_ms": 600000}])
        r = await c.post("/v1/sessions", json={"agent": agent, "task": "t"})
        assert r.status_code == 200, r.text
        run_id = r.json()["session"]["id"]
        async with c.stream("GET", f"/v1/sessions/{run_id}/events/stream") as stream:
            assert stream.status_code == 200
            chunks = stream.aiter_text()
            assert "session.created" in await anext(chunks)
            r = await api.post(f"/v1/admin/orgs/default/members/{carol['id']}/deactivate")
            assert r.status_code == 200

            async def rest() -> str:
                return "".join([chunk async for chunk in chunks])

            # The stream closes by itself (a run's stream otherwise never ends): within a re-check or two.
            await asyncio.wait_for(rest(), timeout=30)
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_members_with_the_admin_or_owner_role_manage_triggers_and_plain_members_cannot(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    admin_user, member = await add_user(stack, "admin"), await add_user(stack)
    agent = await make_agent(api, [{"sleep_ms": 1}])
    async with (
        as_user(stack, await mint(stack, admin_user["email"])) as a,
        as_user(stack, await mint(stack, member["email"])) as m,
    ):
        r = await a.post("/v1/triggers", json={"agent": agent, "name": unique("t"), "task_template": "hi"})
        assert r.status_code == 200, r.text
        sid = r.json()["subscription"]["id"]
        assert sid in {s["id"] for s in (await a.get("/v1/triggers")).json()["subscriptions"]}
        for method, path in (("GET", "/v1/triggers"), ("POST", f"/v1/triggers/{sid}/disable")):
            r = await m.request(method, path)
            assert r.status_code == 403 and "admin or owner role" in r.json()["error"], r.text
        r = await m.post("/v1/triggers", json={"agent": agent, "name": unique("t"), "task_template": "hi"})
        assert r.status_code == 403
        assert (await api.get(f"/v1/triggers/{sid}")).json()["subscription"]["enabled"] is True
