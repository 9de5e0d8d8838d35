"""integrations.mcp_pool: kept-open sessions against real mcp-SDK servers, with the claim semantics intact."""

from __future__ import annotations

import asyncio

import pytest

from integrations.mcp_client import OFFERED_PROTOCOL, call_tool
from integrations.mcp_pool import SessionPool
from tests import mcp_servers as servers

pytestmark = pytest.mark.timeout(60)

TOKEN = "tok-pool-1b2c3d-secret"


def text(outcome_result: dict[str, object] | None) -> str:
    assert outcome_result is not None
    content = outcome_result["content"]
    assert isinstance(content, list)
    return str(content[0]["text"])


async def test_sequential_calls_share_one_session(pool: SessionPool) -> None:
    async with servers.serve(servers.basic()) as srv:
        for i in range(5):
            out = await pool.call_tool(srv.url, {}, "add", {"a": i, "b": 1}, expected_protocol=OFFERED_PROTOCOL)
            assert out.outcome == "succeeded", out.error
            assert text(out.result) == str(i + 1)
        assert srv.methods.count("initialize") == 1
        assert srv.call_count("add") == 5
        assert pool.opened == 1


async def test_concurrent_calls_each_borrow_their_own_session(pool: SessionPool) -> None:
    async with servers.serve(servers.basic()) as srv:
        outs = await asyncio.gather(
            *(pool.call_tool(srv.url, {}, "add", {"a": i, "b": 0}, expected_protocol=None) for i in range(6))
        )
        assert sorted(text(o.result) for o in outs) == [str(i) for i in range(6)]
        assert srv.call_count("add") == 6
        assert pool.opened == 6  # none was lent twice at once
        assert pool.idle_count == 4  # kept up to the per-key cap, the rest closed


async def test_credentials_never_share_a_session(pool: SessionPool) -> None:
    async with servers.serve(servers.bearer(TOKEN)) as srv:
        ok = await pool.call_tool(
            srv.url, {"Authorization": f"Bearer {TOKEN}"}, "echo", {"text": "x"}, expected_protocol=None
        )
        assert ok.outcome == "succeeded"
        # A different credential cannot ride the session the right one opened.
        bad = await pool.call_tool(
            srv.url, {"Authorization": "Bearer wrong"}, "echo", {"text": "x"}, expected_protocol=None
        )
        assert bad.outcome == "failed_before_send"
        assert "401" in (bad.error or "")
        assert srv.executions == ["echo"]


async def test_a_server_that_forgot_the_session_gets_the_call_exactly_once(pool: SessionPool) -> None:
    async with servers.serve(servers.basic()) as first:
        port = first.port
        out = await pool.call_tool(first.url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None)
        assert out.outcome == "succeeded"
        await first.stop()
    # The same address, a new process: the pooled session id means nothing to it (HTTP 404).
    async with servers.serve(servers.basic(), port=port) as second:
        out = await pool.call_tool(second.url, {}, "add", {"a": 2, "b": 2}, expected_protocol=None)
        assert out.outcome == "succeeded", out.error
        assert text(out.result) == "4"
        assert second.call_count("add") == 2  # the refused one (404) and the fresh session's one
        assert second.executions == ["add"]  # executed exactly once


async def test_a_server_gone_after_a_pooled_call_is_before_send_not_ambiguous(pool: SessionPool) -> None:
    async with servers.serve(servers.basic()) as srv:
        out = await pool.call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None)
        assert out.outcome == "succeeded"
        await srv.stop()
        gone = await pool.call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None)
        # Nothing can have executed: the retryable state, exactly as a fresh session would report it.
        assert gone.outcome == "failed_before_send", gone
        fresh = await call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None)
        assert fresh.outcome == gone.outcome


async def test_a_dropped_connection_mid_call_stays_ambiguous_and_closes_the_session(pool: SessionPool) -> None:
    async with servers.serve(servers.basic()) as srv:
        warm = await pool.call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None)
        assert warm.outcome == "succeeded"
        out = await pool.call_tool(srv.url, {}, "drop_connection", {}, expected_protocol=None)
        assert out.outcome == "ambiguous", out
        assert pool.idle_count == 0
        again = await pool.call_tool(srv.url, {}, "add", {"a": 2, "b": 2}, expected_protocol=None)
        assert again.outcome == "succeeded"
        assert pool.opened == 2


async def test_tool_errors_keep_the_session(pool: SessionPool) -> None:
    async with servers.serve(servers.basic()) as srv:
        out = await pool.call_tool(srv.url, {}, "fail", {"text": "nope"}, expected_protocol=None)
        assert out.outcome == "failed_upstream"
        out = await pool.call_tool(srv.url, {}, "add", {"a": 2, "b": 2}, expected_protocol=None)
        assert out.outcome == "succeeded"
        assert pool.opened == 1


async def test_protocol_drift_is_refused_before_sending(pool: SessionPool) -> None:
    async with servers.serve(servers.pinned_version("2025-06-18")) as srv:
        out = await pool.call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol="2025-11-25")
        assert out.outcome == "failed_before_send"
        assert "protocol drift" in (out.error or "")
        assert srv.call_count("add") == 0


async def test_idle_sessions_expire(pool: SessionPool) -> None:
    short = SessionPool(idle_secs=0.0)
    try:
        async with servers.serve(servers.basic()) as srv:
            for _ in range(2):
                out = await short.call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None)
                assert out.outcome == "succeeded"
            assert short.opened == 2
            assert srv.methods.count("initialize") == 2
    finally:
        await short.aclose()


async def test_aclose_ends_every_session_task() -> None:
    p = SessionPool()
    async with servers.serve(servers.basic()) as srv:
        await asyncio.gather(
            *(p.call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None) for _ in range(3))
        )
        assert p.idle_count == 3
        await p.aclose()
        assert p.idle_count == 0
        names = {t.get_name() for t in asyncio.all_tasks()}
        assert not any(n.startswith("mcp-session") for n in names)
        # The server saw the sessions closed (the SDK's DELETE on exit).
        assert [m for m, _ in srv.recorder.http_requests].count("DELETE") == 3
