"""The LLM facade on the real stack, in front of the scripted upstream (tests/llm_upstream.py).

A held replay run (its runner sleeps) stands for the sandbox: its ``llm`` token is minted the way
operator tooling would, and the requests go through the gateway Unix socket like a sandbox's would.
Replay runs speak the Anthropic dialect; their model ("replay") is unpriced, so costs are null here
and the cost arithmetic is covered in tests/core.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx
import pytest

from api.routes import llm
from cli.stack import Stack, free_port, wait_for
from core.llm_body import FacadeError, inspect_body
from core.redaction import MARK
from core.usage import Dialect
from db.engine import asyncpg_dsn
from tests.helpers import eventually
from tests.integration.conftest import LITELLM_MASTER_KEY, LLM_UPSTREAM_KEY
from tests.integration.helpers import (
    events,
    issue_token,
    make_agent,
    run_row,
    sandbox_env,
    start_run,
    unique,
    wait_status,
)
from tests.llm_upstream import Upstream, Usage, failure, text

IDLE = [{"sleep_ms": 600000}]
MESSAGES = "/internal/llm/v1/messages"


@asynccontextmanager
async def held_run(api: httpx.AsyncClient, **extra: Any) -> AsyncIterator[str]:
    """A running replay run whose runner just sleeps; cancelled on exit."""
    run_id = await start_run(api, await make_agent(api, IDLE), workspace=None, **extra)
    await wait_status(api, run_id, {"running"})
    try:
        yield run_id
    finally:
        await api.post(f"/v1/sessions/{run_id}/cancel")


@asynccontextmanager
async def sandbox_client(stack: Stack, token: str, *, bearer: bool = False) -> AsyncIterator[httpx.AsyncClient]:
    """What the sandbox has: the gateway socket and a run token (as x-api-key, like ANTHROPIC_API_KEY)."""
    auth = {"authorization": f"Bearer {token}"} if bearer else {"x-api-key": token}
    async with httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(stack.home / "gateway" / "api.sock")),
        base_url="http://fluidbox",
        headers={**auth, "anthropic-version": "2023-06-01"},
        timeout=60,
    ) as client:
        yield client


def body(stream: bool = True, max_tokens: int = 1024, model: str = "replay", pad: str = "") -> bytes:
    doc = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "say hi" + pad}],
    }
    return json.dumps(doc).encode()


async def wait_event(
    api: httpx.AsyncClient, run_id: str, kind: str, count: int = 1, timeout: float = 30
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def enough() -> list[dict[str, Any]] | None:
        found[:] = [e for e in await events(api, run_id) if e["type"] == kind]
        return list(found) if len(found) >= count else None

    return await eventually(
        enough, timeout=timeout, interval=0.05, message=lambda: f"no {count}x {kind} on run {run_id} (saw {len(found)})"
    )


async def wait_note(api: httpx.AsyncClient, run_id: str, needle: str, timeout: float = 30) -> None:
    notes: list[str] = []

    async def noted() -> bool:
        notes[:] = [
            e["payload"]["data"].get("text", "") for e in await events(api, run_id) if e["type"] == "agent.message"
        ]
        return any(needle in n for n in notes)

    await eventually(
        noted,
        timeout=timeout,
        interval=0.05,
        message=lambda: f"no system note containing {needle!r} on run {run_id}: {notes}",
    )


async def cost(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    r = await api.get(f"/v1/sessions/{run_id}/cost")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def llm_token(stack: Stack, run_id: str) -> str:
    return await issue_token(stack.database_url or "", run_id, "llm")


USAGE = Usage(input=321, output=54, cache_read=1000, cache_write=77)
METERED = {"input_tokens": 321, "output_tokens": 54, "cache_read_tokens": 1000, "cache_write_tokens": 77}


async def test_a_streamed_response_passes_through_byte_for_byte_and_is_metered_exactly(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("hello from the model, streamed in pieces", usage=USAGE))
    async with held_run(api) as run_id:
        token = await llm_token(stack, run_id)
        async with sandbox_client(stack, token) as sandbox:
            headers = {"content-type": "application/json", "anthropic-beta": "claude-code-20250219"}
            async with sandbox.stream("POST", MESSAGES + "?beta=true", content=body(), headers=headers) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                received = b"".join([chunk async for chunk in r.aiter_raw()])
        [seen] = llm_upstream.requests
        assert received == bytes(seen.response)  # untouched, nothing added
        assert (seen.path, seen.query) == ("/v1/messages", "beta=true")
        assert seen.headers["x-api-key"] == LLM_UPSTREAM_KEY  # the real key, swapped in
        assert token not in json.dumps(seen.headers)  # the sandbox's credential never travels on
        assert seen.headers["anthropic-beta"] == "claude-code-20250219"
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.raw == body()

        [response] = await wait_event(api, run_id, "model.response")
        data = response["payload"]["data"]
        assert {k: data[k] for k in METERED} == METERED
        assert data["model"] == "replay" and data["cost_usd"] is None  # unpriced model: null, never 0
        assert "hello" not in json.dumps(response)  # no completion text in the ledger
        report = await cost(api, run_id)
        assert report["usage"] == {**METERED, "cost_usd": 0.0, "requests": 1}
        assert report["reservations"]["active"] == 0
        assert report["breakdown"][0]["source"] == "facade" and report["breakdown"][0]["cost_usd"] is None
        got = await api.get(f"/v1/sessions/{run_id}")
        assert got.json()["usage"]["input_tokens"] == 321


async def test_a_plain_json_response_is_metered_too(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("not streamed", usage=USAGE))
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id), bearer=True) as sandbox:
        r = await sandbox.post(MESSAGES, content=body(stream=False), headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        assert r.json()["content"] == [{"type": "text", "text": "not streamed"}]
        assert r.content == bytes(llm_upstream.requests[0].response)
        [response] = await wait_event(api, run_id, "model.response")
        assert {k: response["payload"]["data"][k] for k in METERED} == METERED


async def test_a_client_that_disconnects_mid_stream_is_still_charged(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("a long answer the client never reads to the end", usage=USAGE).stalled(after=3))
    async with held_run(api) as run_id:
        async with sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
            async with sandbox.stream(
                "POST", MESSAGES, content=body(), headers={"content-type": "application/json"}
            ) as r:
                assert r.status_code == 200
                first = await anext(r.aiter_raw())
                assert b"message_start" in first
            # The client is gone; the upstream only now finishes (with the output usage at the end).
        assert (await cost(api, run_id))["reservations"]["active"] == 1
        llm_upstream.release()
        [response] = await wait_event(api, run_id, "model.response")
        assert {k: response["payload"]["data"][k] for k in METERED} == METERED
        report = await cost(api, run_id)
        assert report["usage"]["requests"] == 1 and report["reservations"]["active"] == 0


async def reservation_states(stack: Stack, run_id: str) -> list[tuple[str, str | None]]:
    conn = await asyncpg.connect(asyncpg_dsn(stack.database_url or ""))
    try:
        rows = await conn.fetch(
            "SELECT state, settle_reason FROM llm_reservations WHERE session_id = $1 ORDER BY created_at",
            uuid.UUID(run_id),
        )
    finally:
        await conn.close()
    return [(r["state"], r["settle_reason"]) for r in rows]


async def test_an_upstream_stream_that_breaks_ends_with_the_providers_error_event_and_stays_reserved(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("an answer cut short by the network", usage=USAGE).broken(after=3))
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        r = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert r.status_code == 200  # the stream had started
        [seen] = llm_upstream.requests
        sent = bytes(seen.response)
        assert sent.count(b"event: ") == 3 and r.content.startswith(sent)  # what arrived passed through as is
        # ... and then the provider's own mid-stream error, so no client mistakes the stream for complete.
        tail = r.content[len(sent) :].strip().split(b"\n")
        assert tail[0] == b"event: error"
        error = json.loads(tail[1].removeprefix(b"data: "))
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert "stream broke" in error["error"]["message"]
        # Output may have been generated and billed without a usage report: held for expiry, never zero.
        assert await reservation_states(stack, run_id) == [("reserved", None)]
        assert (await cost(api, run_id))["usage"]["requests"] == 0
        # The next call gets a fresh upstream connection and completes.
        again = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert again.status_code == 200 and b"message_stop" in again.content


async def test_an_unreachable_upstream_is_a_502_and_gives_the_reservation_back(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    # A second API process of the same deployment whose upstream URL points at a port nobody listens on.
    dead = free_port()
    port = free_port()
    env = {
        **stack.env,
        "FLUIDBOX_BIND": f"127.0.0.1:{port}",
        "FLUIDBOX_GATEWAY_SOCKET": str(stack.home / "gateway-dead" / "api.sock"),
        "FLUIDBOX_LLM_UPSTREAM_URL": f"http://127.0.0.1:{dead}",
    }
    proc = stack._spawn("api-dead-upstream", [sys.executable, "-m", "api.serve"], env)
    try:
        await wait_for(lambda: _ready(port), 60, "the second API", proc)
        async with held_run(api) as run_id:
            token = await llm_token(stack, run_id)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as other:
                r = await other.post(
                    MESSAGES, content=body(), headers={"content-type": "application/json", "x-api-key": token}
                )
            assert r.status_code == 502
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
            assert "could not be reached" in r.json()["error"]["message"]
            # Nothing was sent, so nothing can have been spent: the reservation is given back at once.
            assert await reservation_states(stack, run_id) == [("released", "upstream unreachable")]
            assert (await cost(api, run_id))["reservations"]["active"] == 0
    finally:
        stack.stop_process("api-dead-upstream")
    assert llm_upstream.requests == []


async def _ready(port: int) -> bool:
    async with httpx.AsyncClient(timeout=2) as client:
        return (await client.get(f"http://127.0.0.1:{port}/v1/ready")).status_code == 200


async def test_concurrent_requests_against_a_nearly_spent_budget_admit_exactly_what_fits(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    each = body(max_tokens=1500)
    reserve = len(each) + 1500  # what one request reserves: body bytes + declared max output
    used = 4000
    async with held_run(api, budgets={"max_tokens": used + 4 * reserve}) as run_id:
        token = await llm_token(stack, run_id)
        llm_upstream.push(text("spend some", usage=Usage(input=3000, output=1000)))
        async with sandbox_client(stack, token) as sandbox:
            first = await sandbox.post(
                MESSAGES, content=body(stream=False), headers={"content-type": "application/json"}
            )
            assert first.status_code == 200
            await wait_event(api, run_id, "model.response")
            # Eight at once, each held open upstream: only four reservations fit what is left.
            llm_upstream.push(*[text("held", usage=Usage(input=1, output=1)).stalled(after=1) for _ in range(8)])

            async def call() -> tuple[int, Any]:
                async with sandbox.stream(
                    "POST", MESSAGES, content=each, headers={"content-type": "application/json"}
                ) as r:
                    if r.status_code != 200:
                        return r.status_code, json.loads(await r.aread())
                    await anext(r.aiter_raw())
                    return 200, r

            # The admitted ones hang up after the first bytes; their upstream streams stay held open.
            results = await asyncio.gather(*[call() for _ in range(8)])
        statuses = sorted(s for s, _ in results)
        assert statuses == [200] * 4 + [429] * 4
        refused = [d for s, d in results if s == 429]
        # The reference's body: Anthropic's error shape, the refusal's code as the error's type.
        assert all(d["type"] == "error" and set(d["error"]) == {"type", "message"} for d in refused), refused
        assert all(d["error"]["type"] == "llm_budget_reservation_exceeded" for d in refused), refused
        assert all(d["error"]["message"].startswith("token budget: ") for d in refused), refused
        assert len(llm_upstream.requests) == 1 + 4  # the refused never reached the upstream
        llm_upstream.release()
        await wait_event(api, run_id, "model.response", count=5)
        report = await cost(api, run_id)
        assert report["usage"]["requests"] == 5 and report["reservations"]["active"] == 0


async def test_recorded_usage_at_the_token_cap_stops_the_run(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("expensive", usage=Usage(input=900, output=300)))
    async with held_run(api, budgets={"max_tokens": 1000}) as run_id:
        async with sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
            # Alone in flight, the first request goes through even though it may spend past the cap.
            ok = await sandbox.post(MESSAGES, content=body(stream=False), headers={"content-type": "application/json"})
            assert ok.status_code == 200
            await wait_event(api, run_id, "model.response")
            stop = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
            assert stop.status_code == 400
            assert stop.json() == {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "token budget exhausted"},
            }
            row = await wait_status(api, run_id, {"budget_exceeded"})
            assert row["status_reason"] == "max_tokens budget exceeded"
            after = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
            assert after.status_code in (400, 401)  # the run is over (and its tokens revoked)
    [exceeded] = [e for e in await events(api, run_id) if e["type"] == "budget.exceeded"]
    assert exceeded["payload"]["data"] == {"budget": "max_tokens", "limit": "1000", "spent": "1200"}
    assert len(llm_upstream.requests) == 1


async def test_wrong_audience_and_missing_tokens_are_refused(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    async with held_run(api) as run_id:
        for audience in ("tool", "control"):
            tok = await issue_token(stack.database_url or "", run_id, audience)
            async with sandbox_client(stack, tok) as sandbox:
                r = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
            assert (r.status_code, r.content) == (403, b'{"error":"wrong_audience"}'), audience
        async with sandbox_client(stack, "fbx_sess_" + "0" * 32) as sandbox:
            r = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        # Another dialect's path is not this run's endpoint.
        async with sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
            r = await sandbox.post(
                "/internal/llm/v1/responses", content=body(), headers={"content-type": "application/json"}
            )
            assert r.status_code == 404 and r.json()["type"] == "error"
            probe = await sandbox.head("/internal/llm")
            assert probe.status_code == 200
    assert llm_upstream.requests == []


async def test_a_token_revoked_after_use_is_refused_on_its_next_request(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    async with held_run(api) as run_id:
        token = await llm_token(stack, run_id)
        async with sandbox_client(stack, token) as sandbox:
            ok = await sandbox.post(MESSAGES, content=body(stream=False), headers={"content-type": "application/json"})
            assert ok.status_code == 200
            conn = await asyncpg.connect(asyncpg_dsn(stack.database_url or ""))
            try:
                await conn.execute(
                    "UPDATE api_tokens SET revoked_at = now() WHERE session_id = $1 AND audience = 'llm'",
                    uuid.UUID(run_id),
                )
            finally:
                await conn.close()
            r = await sandbox.post(MESSAGES, content=body(stream=False), headers={"content-type": "application/json"})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        report = await cost(api, run_id)
        assert report["usage"]["requests"] == 1 and report["reservations"]["active"] == 0
    assert len(llm_upstream.requests) == 1


async def test_a_model_other_than_the_frozen_one_is_422_and_nothing_is_reserved(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        r = await sandbox.post(
            MESSAGES, content=body(model="claude-opus-4-8"), headers={"content-type": "application/json"}
        )
        assert r.status_code == 422
        assert r.json()["error"]["message"].startswith("model 'claude-opus-4-8' is not valid for this session")
        garbled = await sandbox.post(MESSAGES, content=b"{not json", headers={"content-type": "application/json"})
        assert garbled.status_code == 400 and "not valid JSON" in garbled.json()["error"]["message"]
        server_tool = json.dumps({**json.loads(body()), "tools": [{"type": "web_search_20250305", "name": "ws"}]})
        r = await sandbox.post(MESSAGES, content=server_tool, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "web_search_20250305" in r.json()["error"]["message"]
        report = await cost(api, run_id)
        assert report["reservations"]["active"] == 0 and report["usage"]["requests"] == 0
    assert llm_upstream.requests == []


async def test_a_long_conversation_over_the_api_body_limit_still_reaches_the_model(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        big = body(stream=False, pad="x" * (3 * 1024 * 1024))  # over the 2 MiB limit of the rest of the API
        r = await sandbox.post(MESSAGES, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text[:300]
        assert len(llm_upstream.requests) == 1


async def test_unparsed_usage_keeps_the_reservation_until_expiry_charges_it_conservatively(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("no usage here", omit_usage=True))
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        sent = body(max_tokens=2000)
        async with sandbox.stream("POST", MESSAGES, content=sent, headers={"content-type": "application/json"}) as r:
            assert r.status_code == 200
            await r.aread()
        await wait_note(api, run_id, "model stream completed (usage unparsed)")
        report = await cost(api, run_id)
        assert report["reservations"] == {"active": 1, "tokens": len(sent) + 2000, "cost_usd": None}
        assert report["usage"]["requests"] == 0  # never counted as zero-cost usage
        # Time passes: the reservation's expiry is reached (moved, rather than waiting 30 minutes).
        conn = await asyncpg.connect((stack.database_url or "").replace("postgresql+asyncpg", "postgresql"))
        try:
            await conn.execute(
                "UPDATE llm_reservations SET expires_at = now() - interval '1 second' WHERE session_id = $1",
                uuid.UUID(run_id),
            )
        finally:
            await conn.close()

        async def converted() -> dict[str, Any] | None:
            report = await cost(api, run_id)
            return None if report["reservations"]["active"] else report

        report = await eventually(converted, timeout=30, message="the expired reservation was never converted")
        assert report["usage"]["input_tokens"] == len(sent) and report["usage"]["output_tokens"] == 2000
        assert report["breakdown"][0]["source"] == "reservation_timeout"
        await wait_note(api, run_id, "charged conservatively as its whole reservation")


UNPARSED = "model stream completed (usage unparsed)"


async def test_an_answer_without_usage_ends_with_the_usage_unparsed_note(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("streamed, no usage", omit_usage=True), text("whole, no usage", omit_usage=True))
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        for stream in (True, False):
            r = await sandbox.post(MESSAGES, content=body(stream=stream), headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
            count = 1 if stream else 2

            async def noted(count: int = count) -> list[dict[str, Any]] | None:
                notes = [e for e in await events(api, run_id) if e["payload"]["data"].get("text") == UNPARSED]
                return notes if len(notes) >= count else None

            notes = await eventually(noted, timeout=30, message=lambda: f"no {UNPARSED!r} note on run {run_id}")
            assert notes is not None and len(notes) == count
            assert notes[-1]["type"] == "agent.message"
            assert notes[-1]["payload"]["data"] == {"role": "system", "text": UNPARSED}
            assert (await events(api, run_id))[-1]["seq"] == notes[-1]["seq"]  # the answer's last word
        assert (await cost(api, run_id))["reservations"]["active"] == 2  # held for expiry, never zero


async def test_the_litellm_usage_callback_is_a_stub_answering_by_its_master_key(stack: Stack) -> None:
    async def usage_rows() -> int:
        conn = await asyncpg.connect(asyncpg_dsn(stack.database_url or ""))
        try:
            return int(await conn.fetchval("SELECT count(*) FROM usage_entries"))
        finally:
            await conn.close()

    before = await usage_rows()
    report = {"model": "claude-sonnet-4-5", "usage": {"prompt_tokens": 10, "completion_tokens": 2}, "id": "x"}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as litellm:
        for header in (f"Bearer {LITELLM_MASTER_KEY}", LITELLM_MASTER_KEY):
            for doc in (report, [report], "any JSON"):
                r = await litellm.post("/internal/llm-usage", json=doc, headers={"authorization": header})
                assert (r.status_code, r.json()) == (200, {"ok": True}), r.text
        wrong: list[dict[str, str]] = [{}, {"authorization": "Bearer sk-litellm-wrong"}]
        wrong.append({"authorization": f"Bearer {LLM_UPSTREAM_KEY}"})  # another credential of the deployment
        for headers in wrong:
            r = await litellm.post("/internal/llm-usage", json=report, headers=headers)
            assert (r.status_code, r.json()) == (200, {"ignored": "unauthenticated"}), r.text
        garbled = await litellm.post(
            "/internal/llm-usage", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert garbled.status_code == 400 and garbled.json()["code"] == "invalid_request", garbled.text
    assert await usage_rows() == before  # a stub: the facade is what meters


async def test_upstream_errors_pass_through_and_only_a_refused_key_releases_the_reservation(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    # Behind a proxy with retries and fallbacks, an overload or a rate limit may still have been billed: only a
    # 401 (the key refused before any model work) proves non-dispatch. Everything else is held for expiry.
    llm_upstream.push(failure(529, "Overloaded"), failure(429, "slow down"), failure(500, "boom"))
    llm_upstream.push(failure(401, "invalid x-api-key"))
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        busy = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert busy.status_code == 529
        assert busy.json() == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        assert (await cost(api, run_id))["reservations"]["active"] == 1  # may have been billed: held
        limited = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert limited.status_code == 429 and limited.json()["error"]["message"] == "slow down"
        assert (await cost(api, run_id))["reservations"]["active"] == 2
        broken = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert broken.status_code == 500
        assert (await cost(api, run_id))["reservations"]["active"] == 3  # unknown: held for expiry
        refused = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        report = await cost(api, run_id)
        assert report["reservations"]["active"] == 3  # the 401's reservation was released, not held
        assert report["usage"]["requests"] == 0  # held reservations are not usage until expiry charges them
        counted = await sandbox.post(
            "/internal/llm/v1/messages/count_tokens", content=body(), headers={"content-type": "application/json"}
        )
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
        assert (await cost(api, run_id))["reservations"]["active"] == 3  # count_tokens reserves nothing
    assert len(llm_upstream.requests) == 5


async def test_an_upstream_redirect_is_never_followed_so_the_key_and_body_go_nowhere_else(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    # Following a 307 would resend the body, and the real key, to wherever the upstream points.
    elsewhere = f"{llm_upstream.url}/v1/messages?followed=1"
    llm_upstream.push(failure(307, "moved").redirecting(elsewhere), failure(308, "moved").redirecting(elsewhere))
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        for status in (307, 308):
            r = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
            assert r.status_code == status and "location" not in r.headers
        assert [rec.query for rec in llm_upstream.requests] == ["", ""]  # one request each, none followed
        assert (await cost(api, run_id))["reservations"]["active"] == 2  # not proof of non-dispatch: held


async def test_a_compressed_upstream_error_is_scrubbed_of_the_key_too(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    # An upstream (or a proxy) that ignores accept-encoding: identity and echoes the key back, gzipped.
    llm_upstream.push(failure(400, f"invalid header x-api-key: {LLM_UPSTREAM_KEY}").gzipped())
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        r = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert "content-encoding" not in r.headers and LLM_UPSTREAM_KEY not in r.text
        assert r.json()["error"]["message"] == f"invalid header x-api-key: {MARK}"


PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
INLINE_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX}}


def blocks_body(content: list[dict[str, Any]], system: list[dict[str, Any]] | None = None) -> bytes:
    doc: dict[str, Any] = {
        "model": "replay",
        "max_tokens": 256,
        "stream": False,
        "messages": [{"role": "user", "content": content}],
    }
    if system is not None:
        doc["system"] = system
    return json.dumps(doc).encode()


URL_IMAGE = {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/latest/meta-data"}}
URL_DOCUMENT = {"type": "document", "source": {"type": "url", "url": "https://example.com/big.pdf"}}
FILE_DOCUMENT = {"type": "document", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}}
FILE_IMAGE = {"type": "image", "source": {"type": "file", "file_id": "file_011CPMxVD3fHLUhvTqtsQA5w"}}
FETCHED_BLOCKS: list[tuple[str, bytes, str, str]] = [
    ("image url", blocks_body([URL_IMAGE, {"type": "text", "text": "what is this"}]), "url", "image"),
    ("document url", blocks_body([URL_DOCUMENT]), "url", "document"),
    ("document file", blocks_body([FILE_DOCUMENT]), "file", "document"),
    ("image file", blocks_body([FILE_IMAGE]), "file", "image"),
    (
        "url image inside a tool result",
        blocks_body([{"type": "tool_result", "tool_use_id": "toolu_1", "content": [INLINE_IMAGE, URL_IMAGE]}]),
        "url",
        "image",
    ),
    (
        "url document in the system blocks",
        blocks_body([{"type": "text", "text": "hi"}], system=[{"type": "text", "text": "be brief"}, URL_DOCUMENT]),
        "url",
        "document",
    ),
]


async def test_blocks_the_provider_would_fetch_are_422_and_never_reach_the_upstream(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        for name, sent, source, block in FETCHED_BLOCKS:
            r = await sandbox.post(MESSAGES, content=sent, headers={"content-type": "application/json"})
            assert r.status_code == 422, (name, r.text)
            error = r.json()
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", name
            message = error["error"]["message"]
            assert message.startswith(f"content source type '{source}' is not allowed"), (name, message)
            assert f"'{block}' block" in message and "outside the sandbox" in message, (name, message)
        report = await cost(api, run_id)
        assert report["reservations"]["active"] == 0 and report["usage"]["requests"] == 0
    assert llm_upstream.requests == []


async def test_an_inline_base64_image_is_still_forwarded(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("a single pixel", usage=USAGE))
    sent = blocks_body(
        [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [INLINE_IMAGE]},
            INLINE_IMAGE,
            {"type": "text", "text": "what is this"},
        ]
    )
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        r = await sandbox.post(MESSAGES, content=sent, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        assert r.json()["content"] == [{"type": "text", "text": "a single pixel"}]
        [seen] = llm_upstream.requests
        assert seen.raw == sent  # forwarded untouched
        [response] = await wait_event(api, run_id, "model.response")
        assert {k: response["payload"]["data"][k] for k in METERED} == METERED


async def test_the_real_upstream_key_never_reaches_the_sandbox_the_ledger_logs_or_responses(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    # An upstream that echoes the key in its error text (some proxies do) must not leak it either.
    llm_upstream.push(text("fine", usage=USAGE), failure(401, f"invalid x-api-key {LLM_UPSTREAM_KEY}"))
    seen: list[bytes] = []
    async with held_run(api) as run_id:
        env = sandbox_env(run_id)
        assert all(LLM_UPSTREAM_KEY not in v for v in env.values())
        async with sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
            for _ in range(2):
                r = await sandbox.post(
                    MESSAGES, content=body(stream=False), headers={"content-type": "application/json"}
                )
                seen.append(r.content + json.dumps(dict(r.headers)).encode())
        assert b"\xe2\x80\xb9redacted\xe2\x80\xba" in seen[1]  # the echo was scrubbed, not the status lost
        assert [r.headers["x-api-key"] for r in llm_upstream.requests] == [LLM_UPSTREAM_KEY] * 2
        await wait_event(api, run_id, "model.response")
        for path in (f"/v1/sessions/{run_id}", f"/v1/sessions/{run_id}/cost", f"/v1/sessions/{run_id}/events"):
            seen.append((await api.get(path)).content)
    await wait_status(api, run_id, {"cancelled"})
    seen.append(json.dumps(await events(api, run_id)).encode())
    seen.append(json.dumps(await run_row(api, run_id)).encode())
    logs = [p for p in stack.home.rglob("*.log") if p.is_file()]
    assert any(p.name == "api.log" for p in logs)
    seen.extend(p.read_bytes() for p in logs)
    assert all(LLM_UPSTREAM_KEY.encode() not in blob for blob in seen)


# ---- body rules (pure; no stack) ---------------------------------------------------------------


class _Spec:
    model = "gpt-5.4-mini"


RESPONSES = "/internal/llm/v1/responses"
OPENAI_METERED = {"input_tokens": 321, "output_tokens": 54, "cache_read_tokens": 1000, "cache_write_tokens": 0}


@asynccontextmanager
async def openai_run(api: httpx.AsyncClient) -> AsyncIterator[str]:
    """A held replay run whose model traffic speaks OpenAI Responses (what a Codex run's would)."""
    name = unique("oai")
    config = {"script": IDLE, "model_api": "openai-responses"}
    r = await api.post("/v1/agents", json={"name": name, "harness": "replay", "harness_config": config})
    assert r.status_code == 200, r.text
    run_id = await start_run(api, name, workspace=None)
    await wait_status(api, run_id, {"running"})
    try:
        yield run_id
    finally:
        await api.post(f"/v1/sessions/{run_id}/cancel")


def responses_body(stream: bool = True, **extra: Any) -> bytes:
    doc = {"model": "replay", "input": [{"role": "user", "content": "say hi"}], "stream": stream, **extra}
    return json.dumps(doc).encode()


async def test_an_openai_responses_run_streams_through_the_facade_and_is_metered_exactly(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    llm_upstream.push(text("hello from the responses api", usage=USAGE), text("plain", usage=USAGE))
    tools = [{"type": "web_search"}, {"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
    async with openai_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id), bearer=True) as sb:
        streamed = await sb.post(
            RESPONSES,
            content=responses_body(store=True, tools=tools, max_output_tokens=512),
            headers={"content-type": "application/json"},
        )
        assert streamed.status_code == 200, streamed.text
        first = llm_upstream.requests[0]
        assert first.path == "/v1/responses" and streamed.content == bytes(first.response)  # byte for byte
        assert b"response.completed" in streamed.content
        # The real key went as OpenAI's bearer; the body was made stateless and lost the provider-run tool.
        assert first.headers["authorization"] == f"Bearer {LLM_UPSTREAM_KEY}" and "x-api-key" not in first.headers
        assert first.body["store"] is False and first.body["tools"] == [tools[1]]
        plain = await sb.post(
            RESPONSES, content=responses_body(stream=False), headers={"content-type": "application/json"}
        )
        assert plain.status_code == 200 and plain.json()["status"] == "completed"
        # OpenAI reports cached input inside input_tokens: metered split out, as the upstream declared it.
        found = await wait_event(api, run_id, "model.response", count=2)
        for event in found:
            assert {k: event["payload"]["data"][k] for k in OPENAI_METERED} == OPENAI_METERED
        report = await cost(api, run_id)
        assert report["usage"]["requests"] == 2 and report["reservations"]["active"] == 0


async def test_an_openai_responses_run_gets_openai_shaped_refusals(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    async with openai_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id), bearer=True) as sb:
        wrong = await sb.post(
            RESPONSES, content=responses_body(model="gpt-5.4"), headers={"content-type": "application/json"}
        )
        assert wrong.status_code == 422
        assert set(wrong.json()["error"]) == {"message", "type", "param", "code"}
        assert (
            wrong.json()["error"]["type"] == "invalid_request_error"
            and "frozen model" in wrong.json()["error"]["message"]
        )
        chained = await sb.post(
            RESPONSES,
            content=responses_body(previous_response_id="resp_123"),
            headers={"content-type": "application/json"},
        )
        assert chained.status_code == 422 and "previous_response_id" in chained.json()["error"]["message"]
        other = await sb.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
        assert other.status_code == 404 and "openai endpoint" in other.json()["error"]["message"]
        assert (await cost(api, run_id))["reservations"]["active"] == 0
    assert llm_upstream.requests == []


async def test_model_api_is_a_replay_setting_only(api: httpx.AsyncClient) -> None:
    config = {"model_api": "openai-responses"}
    r = await api.post(
        "/v1/agents", json={"name": unique("claude"), "harness": "claude-agent-sdk", "harness_config": config}
    )
    assert r.status_code == 422 and "replay agents only" in r.text
    name = unique("oai")
    r = await api.post("/v1/agents", json={"name": name, "harness": "replay", "harness_config": config})
    assert r.status_code == 200
    # Switching the harness while the config still names a model API is refused too; nothing is appended.
    r = await api.post(f"/v1/agents/{name}/revisions", json={"harness": "claude-agent-sdk"})
    assert r.status_code == 422 and "replay agents only" in r.text
    r = await api.get(f"/v1/agents/{name}")
    assert r.status_code == 200 and len(r.json()["revisions"]) == 1
    r = await api.post(
        "/v1/agents", json={"name": unique("x"), "harness": "replay", "harness_config": {"model_api": "gemini"}}
    )
    assert r.status_code == 400 and "model_api" in r.text  # not one of the two APIs: a validation error


def test_openai_bodies_are_made_stateless_and_lose_server_tools() -> None:
    raw = json.dumps(
        {
            "model": "gpt-5.4-mini",
            "input": [{"role": "user", "content": "hi"}],
            "store": True,
            "tools": [{"type": "function", "name": "shell"}, {"type": "web_search_preview"}, {"type": "mcp"}],
        }
    ).encode()
    doc, forward = inspect_body(Dialect.OPENAI, raw, _Spec())  # type: ignore[arg-type]
    assert json.loads(forward) == doc
    assert doc["store"] is False and doc["tools"] == [{"type": "function", "name": "shell"}]


@pytest.mark.parametrize(
    "extra",
    [
        {"previous_response_id": "resp_1"},
        {"conversation": "conv_1"},
        {"prompt": {"id": "pmpt_1"}},
        {"background": True},
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
        {"model": "gpt-5.4"},
    ],
)
def test_openai_bodies_that_lean_on_server_state_are_422(extra: dict[str, Any]) -> None:
    raw = json.dumps({"model": "gpt-5.4-mini", "input": "hi", **extra}).encode()
    with pytest.raises(FacadeError) as err:
        inspect_body(Dialect.OPENAI, raw, _Spec())  # type: ignore[arg-type]
    assert err.value.status == 422


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"},
        {"type": "input_image", "image_url": "http://169.254.169.254/latest/meta-data"},
        {"type": "input_image", "file_id": "file-abc123"},
        {"type": "input_image", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_file", "file_url": "https://example.com/report.pdf"},
        {"type": "input_file", "file_id": "file-abc123"},
    ],
)
@pytest.mark.parametrize("where", ["message", "function_call_output", "bare"])
def test_openai_parts_the_provider_would_fetch_are_422(part: dict[str, Any], where: str) -> None:
    if where == "message":
        item: dict[str, Any] = {"role": "user", "content": [{"type": "input_text", "text": "look"}, part]}
    elif where == "function_call_output":
        item = {"type": "function_call_output", "call_id": "call_1", "output": [part]}
    else:
        item = part
    raw = json.dumps({"model": "gpt-5.4-mini", "input": [item]}).encode()
    with pytest.raises(FacadeError) as err:
        inspect_body(Dialect.OPENAI, raw, _Spec())  # type: ignore[arg-type]
    assert err.value.status == 422
    field = next(f for f in ("image_url", "file_url", "file_id") if f in part)
    assert f"'{part['type']}' with '{field}' is not allowed" in err.value.message
    assert "outside the sandbox" in err.value.message


def test_openai_inline_images_and_files_are_forwarded() -> None:
    pixel = f"data:image/png;base64,{PNG_1PX}"
    parts = [
        {"type": "input_text", "text": "compare these"},
        {"type": "input_image", "image_url": pixel, "detail": "low"},
        {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjQK"},
    ]
    doc = {"model": "gpt-5.4-mini", "input": [{"role": "user", "content": parts}]}
    body_, forward = inspect_body(Dialect.OPENAI, json.dumps(doc).encode(), _Spec())  # type: ignore[arg-type]
    assert json.loads(forward)["input"] == doc["input"] and body_["store"] is False


class _Replay:
    model = "replay"


def test_anthropic_tool_use_input_is_not_mistaken_for_content_and_depth_is_bounded() -> None:
    # A tool call's input is the model's own JSON: a "source" in it is data, not a block to fetch.
    echoed = {"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {"source": {"type": "url", "url": "x"}}}
    doc = {"model": "replay", "max_tokens": 10, "messages": [{"role": "assistant", "content": [echoed]}]}
    raw = json.dumps(doc).encode()
    assert inspect_body(Dialect.ANTHROPIC, raw, _Replay())[1] == raw  # type: ignore[arg-type]
    nested: dict[str, Any] = {"type": "text", "text": "deep"}
    for _ in range(40):
        nested = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [nested]}
    deep = json.dumps({**doc, "messages": [{"role": "user", "content": [nested]}]}).encode()
    with pytest.raises(FacadeError) as err:
        inspect_body(Dialect.ANTHROPIC, deep, _Replay())  # type: ignore[arg-type]
    assert err.value.status == 422 and "nested deeper than" in err.value.message
    with pytest.raises(FacadeError) as err:
        inspect_body(Dialect.ANTHROPIC, b"[" * 100_000, _Replay())  # type: ignore[arg-type]
    assert err.value.status == 400


async def test_the_runs_spend_row_stays_equal_to_the_sum_of_its_usage_entries(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    # Admission reads one row per run (session_spend, kept by a trigger) instead of summing every entry.
    llm_upstream.push(text("one", usage=USAGE), text("two", usage=Usage(input=5, output=7)))
    async with held_run(api) as run_id, sandbox_client(stack, await llm_token(stack, run_id)) as sandbox:
        for _ in range(2):
            r = await sandbox.post(MESSAGES, content=body(), headers={"content-type": "application/json"})
            assert r.status_code == 200
        await wait_event(api, run_id, "model.response", count=2)
        conn = await asyncpg.connect(asyncpg_dsn(stack.database_url or ""))
        try:
            rid = uuid.UUID(run_id)
            spend = await conn.fetchrow(
                "SELECT used_tokens, used_cost, entries FROM session_spend WHERE session_id = $1", rid
            )
            assert (spend["used_tokens"], spend["used_cost"], spend["entries"]) == (
                321 + 54 + 1000 + 77 + 5 + 7,
                None,
                2,
            )
            # Priced entries from any writer add up; unpriced ones leave the cost alone (as sum() would).
            for cost in ("0.50", None, "0.25"):
                await conn.execute(
                    "INSERT INTO usage_entries (id, session_id, model, input_tokens, cost_usd, source, external_id)"
                    " VALUES ($1, $2, 'replay', 10, $3::numeric, 'litellm_callback', $4)",
                    uuid.uuid4(),
                    rid,
                    cost,
                    f"ext-{uuid.uuid4()}",
                )
            spend = await conn.fetchrow(
                "SELECT used_tokens, used_cost, entries FROM session_spend WHERE session_id = $1", rid
            )
            summed = await conn.fetchrow(
                "SELECT sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens) AS t,"
                " sum(cost_usd) AS c, count(*) AS n FROM usage_entries WHERE session_id = $1",
                rid,
            )
            assert (spend["used_tokens"], spend["used_cost"], spend["entries"]) == (
                summed["t"],
                summed["c"],
                summed["n"],
            )
            assert str(spend["used_cost"]) == "0.75"
        finally:
            await conn.close()


async def test_a_client_that_stops_reading_is_dropped_after_the_write_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # A sandbox that keeps its connection open but never reads must not hold the relay (and the upstream
    # connection) forever: past the write deadline the relay stops writing to it and only drains the upstream.
    monkeypatch.setattr(llm, "CLIENT_SEND_TIMEOUT_SECS", 0.05)
    written: list[bytes] = []
    never = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["body"] == b"second":
            await never.wait()  # the server's write buffer is full: its send waits for the peer to read
        written.append(message["body"])

    client = llm._Client(send)  # type: ignore[arg-type]
    for chunk in (b"first", b"second", b"third"):
        await client.send({"type": "http.response.body", "body": chunk, "more_body": True})
    assert written == [b"first"] and not client.listening
