"""Result deliveries through the real stack: the finalizer starts a DeliveryWorkflow per webhook
destination, the worker signs and posts, and the run never depends on its receiver."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from cli.stack import Stack, free_port
from config.settings import Settings
from config.temporal import connect_client
from core.runspec import InvocationContext
from core.signing import verify
from db.deliveries import callback_secret_context
from db.engine import create_pool
from integrations.sealing import Sealer
from services.context import AppContext
from services.runs import RunFactory, RunRequest
from tests.helpers import context_over, eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import events, make_agent, wait_status
from tests.workflows.test_delivery import Receiver

pytestmark = pytest.mark.stack


@dataclass
class Harness:
    ctx: AppContext
    factory: RunFactory
    tenant_id: str
    sealer: Sealer


@pytest.fixture(scope="module")
async def harness(stack: Stack) -> AsyncIterator[Harness]:
    pool = await create_pool(stack.database_url or "", min_size=1, max_size=3)
    settings = Settings(temporal_address=stack.temporal_address, task_queue=stack.task_queue)
    client = await connect_client(settings)

    async def temporal() -> Any:
        return client

    ctx = context_over(pool, settings, temporal=temporal)
    try:
        yield Harness(
            ctx,
            ctx.run_factory,
            await ctx.identity.boot_tenant(),
            Sealer.from_setting(FAST["FLUIDBOX_CREDENTIAL_KEY"]),
        )
    finally:
        await pool.close()


@dataclass
class Invoked:
    run_id: str
    subscription_id: str
    secret: str


async def invoke(h: Harness, api: httpx.AsyncClient, url: str, *, enabled: bool = True) -> Invoked:
    """A subscription holding a sealed callback secret, and a run it fired with a webhook destination."""
    agent = await make_agent(api, [{"sleep_ms": 1}])
    sub_id = str(uuid.uuid4())
    secret = "fbx_whsec_" + secrets.token_hex(32)
    async with h.ctx.pool.acquire() as conn:
        agent_id = await conn.fetchval(
            "SELECT id FROM agents WHERE tenant_id = $1 AND name = $2", uuid.UUID(h.tenant_id), agent
        )
        await conn.execute(
            "INSERT INTO trigger_subscriptions (id, tenant_id, name, agent_id, kind, enabled, task_template,"
            " callback_url, callback_secret_sealed, token_generation) VALUES ($1,$2,$3,$4,'api',$5,'t',$6,$7,1)",
            uuid.UUID(sub_id),
            uuid.UUID(h.tenant_id),
            f"sub-{sub_id[:8]}",
            agent_id,
            enabled,
            url,
            h.sealer.seal(secret, context=callback_secret_context(sub_id)),
        )
    dest = {"kind": "webhook", "subscription_id": sub_id, "url": url, "token_generation": 1}
    row = await h.factory.create(
        h.tenant_id,
        RunRequest(agent=agent, task="report back", result_destinations=[dest]),
        InvocationContext(kind="api", actor="trigger", subscription_id=sub_id),
        invoked_by_kind="trigger",
    )
    return Invoked(str(row.id), sub_id, secret)


async def deliveries(api: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    r = await api.get(f"/v1/sessions/{run_id}/deliveries")
    assert r.status_code == 200, r.text
    return list(r.json()["deliveries"])


async def wait_delivery(
    api: httpx.AsyncClient, run_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    async def there() -> dict[str, Any] | None:
        seen[:] = await deliveries(api, run_id)
        return seen[0] if seen and done(seen[0]) else None

    return await eventually(there, timeout=timeout, message=lambda: f"delivery of run {run_id} never got there: {seen}")


def closed(row: dict[str, Any]) -> bool:
    return row["status"] != "pending"


async def finished(api: httpx.AsyncClient, run_id: str) -> None:
    row = await wait_status(api, run_id, {"completed", "failed", "cancelled", "budget_exceeded"})
    assert row["status"] == "completed", row["status_reason"]


async def callbacks(api: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in await events(api, run_id) if e["type"].startswith("callback.")]


async def test_a_finished_run_posts_one_correctly_signed_body(harness: Harness, api: httpx.AsyncClient) -> None:
    async with Receiver() as rx:
        run = await invoke(harness, api, rx.url)
        await finished(api, run.run_id)
        row = await wait_delivery(api, run.run_id, closed)
    assert row["status"] == "delivered" and row["attempts"] == 1 and row["last_status_code"] == 200
    assert row["subscription_id"] == run.subscription_id and row["destination"]["url"] == rx.url
    (req,) = rx.requests
    verify(
        run.secret,
        req.headers["x-fluidbox-timestamp"],
        req.body,
        req.headers["x-fluidbox-signature"],
        now=int(time.time()),
    )
    assert req.headers["x-fluidbox-event"] == "run.finished"
    assert req.headers["x-fluidbox-delivery"] == row["id"]
    body = req.json()
    assert body["delivery_id"] == row["id"] and body["attempt"] == 1
    assert body["run"]["id"] == run.run_id and body["run"]["status"] == "completed"
    assert body["run"]["finished_at"] is not None
    assert {a["name"] for a in body["artifacts"]} >= {"changes.patch"}
    assert await callbacks(api, run.run_id) == [
        {"type": "callback.delivered", "data": {"delivery_id": row["id"], "url": rx.url, "attempt": 1}}
    ]
    # The secret never reaches the ledger or the API.
    assert run.secret not in str(await events(api, run.run_id)) + str(await deliveries(api, run.run_id))


async def test_a_receiver_on_a_forbidden_address_is_refused_and_gets_nothing(
    harness: Harness, api: httpx.AsyncClient
) -> None:
    async with Receiver() as rx:
        # 0.0.0.0 reaches the loopback listener on Linux, so a request let through would land in rx.
        run = await invoke(harness, api, f"http://0.0.0.0:{rx.port}/hook")
        await finished(api, run.run_id)
        row = await wait_delivery(api, run.run_id, closed)
    assert row["status"] == "failed" and row["attempts"] == 0
    assert "unspecified address" in row["last_error"]
    assert rx.requests == []
    (failed,) = await callbacks(api, run.run_id)
    assert failed["type"] == "callback.failed" and "unspecified address" in failed["data"]["error"]


async def test_a_dead_receiver_leaves_the_run_completed(harness: Harness, api: httpx.AsyncClient) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    run = await invoke(harness, api, nobody)
    await finished(api, run.run_id)
    row = await wait_delivery(api, run.run_id, lambda r: r["attempts"] >= 1)
    assert row["status"] == "pending" and row["next_attempt_at"] is not None
    assert "request failed" in row["last_error"]
    after = (await api.get(f"/v1/sessions/{run.run_id}")).json()["session"]
    assert after["status"] == "completed" and after["status_reason"] is None
    assert await callbacks(api, run.run_id) == []


async def test_a_disabled_subscription_sends_nothing_and_records_the_skip(
    harness: Harness, api: httpx.AsyncClient
) -> None:
    async with Receiver() as rx:
        run = await invoke(harness, api, rx.url, enabled=False)
        await finished(api, run.run_id)
        row = await wait_delivery(api, run.run_id, closed)
    assert row["status"] == "skipped" and "disabled" in row["last_error"]
    assert rx.requests == []
    (event,) = await callbacks(api, run.run_id)
    assert event["type"] == "callback.failed" and event["data"]["skipped"] is True


async def test_the_deliveries_route_needs_the_admin_token_and_a_known_run(stack: Stack, api: httpx.AsyncClient) -> None:
    r = await api.get(f"/v1/sessions/{uuid.uuid4()}/deliveries")
    assert r.status_code == 404
    async with httpx.AsyncClient(base_url=stack.api_url) as anon:
        r = await anon.get(f"/v1/sessions/{uuid.uuid4()}/deliveries")
    assert r.status_code == 401


# ---- through the real trigger routes -------------------------------------------------------------


async def create_trigger(api: httpx.AsyncClient, agent: str, url: str) -> dict[str, Any]:
    r = await api.post(
        "/v1/triggers",
        json={
            "agent": agent,
            "name": f"dlv-{uuid.uuid4().hex[:8]}",
            "task_template": "report back",
            "callback_url": url,
        },
    )
    assert r.status_code == 200, r.text
    created = dict(r.json())
    assert created["callback_secret"].startswith("fbx_whsec_")
    return created


async def invoke_trigger(stack: Stack, created: dict[str, Any]) -> str:
    sub_id = created["subscription"]["id"]
    async with httpx.AsyncClient(
        base_url=stack.api_url, headers={"authorization": f"Bearer {created['token']}"}, timeout=60
    ) as trig:
        r = await trig.post(f"/v1/triggers/{sub_id}/invoke", json={})
    assert r.status_code == 200, r.text
    return str(r.json()["session_id"])


async def test_an_invoked_trigger_delivers_a_body_signed_with_the_shown_once_secret(
    stack: Stack, api: httpx.AsyncClient
) -> None:
    async with Receiver() as rx:
        created = await create_trigger(api, await make_agent(api, [{"sleep_ms": 1}]), rx.url)
        run_id = await invoke_trigger(stack, created)
        await finished(api, run_id)
        row = await wait_delivery(api, run_id, closed)
    assert row["status"] == "delivered"
    (req,) = rx.requests
    verify(
        created["callback_secret"],
        req.headers["x-fluidbox-timestamp"],
        req.body,
        req.headers["x-fluidbox-signature"],
        now=int(time.time()),
    )
    body = req.json()
    assert body["run"]["id"] == run_id and body["run"]["invocation"]["subscription_id"] == created["subscription"]["id"]
    # The poll endpoint answers the same document, with delivery_id and attempt null.
    sub_id = created["subscription"]["id"]
    async with httpx.AsyncClient(
        base_url=stack.api_url, headers={"authorization": f"Bearer {created['token']}"}, timeout=60
    ) as trig:
        polled = (await trig.get(f"/v1/triggers/{sub_id}/runs/{run_id}")).json()
    assert polled == {**body, "delivery_id": None, "attempt": None}


async def test_a_token_rotated_while_the_run_works_retires_its_callback(stack: Stack, api: httpx.AsyncClient) -> None:
    async with Receiver() as rx:
        created = await create_trigger(api, await make_agent(api, [{"sleep_ms": 600000}]), rx.url)
        run_id = await invoke_trigger(stack, created)
        await wait_status(api, run_id, {"running"})
        r = await api.post(f"/v1/triggers/{created['subscription']['id']}/rotate_token")
        assert r.status_code == 200, r.text
        assert (await api.post(f"/v1/sessions/{run_id}/cancel")).json()["cancelled"] is True
        await wait_status(api, run_id, {"cancelled"})
        row = await wait_delivery(api, run_id, closed)
    assert row["status"] == "skipped" and "rotated" in row["last_error"]
    assert rx.requests == []
