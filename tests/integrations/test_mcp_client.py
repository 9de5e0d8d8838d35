"""integrations.mcp_client against real mcp-SDK servers on loopback (tests/mcp_servers.py)."""

from __future__ import annotations

import time

import pytest

from integrations.mcp_client import (
    ACCEPTED_PROTOCOLS,
    OFFERED_PROTOCOL,
    AuthRejected,
    McpClientError,
    PaginationError,
    Unreachable,
    UnsupportedProtocol,
    call_tool,
    drift_message,
    photograph,
)
from tests import mcp_servers as servers

pytestmark = pytest.mark.timeout(60)

BASIC_TOOLS = ["add", "drop_connection", "echo", "fail", "rpc_error", "slow"]
TOKEN = "tok-3f9a1c-very-secret"


def test_protocol_constants() -> None:
    assert OFFERED_PROTOCOL == "2025-11-25"
    assert ACCEPTED_PROTOCOLS == {"2025-11-25", "2025-06-18"}


def test_drift_message_is_verbatim() -> None:
    assert drift_message("2025-11-25", "2025-06-18") == (
        "mcp protocol drift: server now negotiates '2025-11-25' but this run's frozen snapshot recorded "
        "'2025-06-18' — run POST /v1/connections/{id}/tools/refresh to re-photograph"
    )


# --------------------------------------------------------------------------------------------------------------------
# photograph


async def test_photograph_basic_is_sorted_complete_and_stable() -> None:
    async with servers.serve(servers.basic()) as srv:
        first = await photograph(srv.url, {})
        second = await photograph(srv.url, {})

    assert first.protocol_version == "2025-11-25"
    assert [t["name"] for t in first.tools] == BASIC_TOOLS
    for tool in first.tools:
        assert set(tool) == {"name", "description", "input_schema"}
        assert tool["input_schema"]["type"] == "object"
        assert tool["description"]
    add = next(t for t in first.tools if t["name"] == "add")
    assert set(add["input_schema"]["properties"]) == {"a", "b"}
    assert sorted(add["input_schema"]["required"]) == ["a", "b"]

    assert first.digest.startswith("sha256:") and len(first.digest) == len("sha256:") + 64
    assert second.digest == first.digest
    assert second.tools == first.tools
    # Photographing lists tools and never calls one.
    assert srv.call_count() == 0
    assert srv.methods.count("initialize") == 2
    assert srv.methods.count("tools/list") == 2


async def test_digest_tracks_every_change_to_the_tool_set() -> None:
    async with servers.serve(servers.changing()) as srv:
        base = await photograph(srv.url, {})
        assert [t["name"] for t in base.tools] == ["alpha", "beta"]

        srv.registry.add("gamma", "third tool", {"type": "object", "properties": {}})
        added = await photograph(srv.url, {})
        assert [t["name"] for t in added.tools] == ["alpha", "beta", "gamma"]
        assert added.digest != base.digest

        srv.registry.remove("gamma")
        assert (await photograph(srv.url, {})).digest == base.digest

        srv.registry.alter_schema("alpha", {"type": "object", "properties": {"q": {"type": "integer"}}})
        altered = await photograph(srv.url, {})
        assert altered.digest not in {base.digest, added.digest}
        assert altered.tools[0]["input_schema"]["properties"]["q"] == {"type": "integer"}

        srv.registry.set_description("beta", "reworded")
        reworded = await photograph(srv.url, {})
        assert reworded.digest not in {base.digest, added.digest, altered.digest}


async def test_pagination_is_followed_to_completion() -> None:
    async with servers.serve(servers.paginating(n_tools=7, page_size=3)) as srv:
        photo = await photograph(srv.url, {})
    assert [t["name"] for t in photo.tools] == [f"t{i:03d}" for i in range(7)]
    assert srv.methods.count("tools/list") == 3


async def test_endless_pagination_fails_at_max_pages() -> None:
    async with servers.serve(servers.endless()) as srv:
        with pytest.raises(PaginationError, match="within 5 pages"):
            await photograph(srv.url, {}, max_pages=5)
        assert srv.methods.count("tools/list") == 5

        with pytest.raises(PaginationError, match="within 50 pages"):
            await photograph(srv.url, {})
        assert srv.methods.count("tools/list") == 5 + 50


async def test_repeated_cursor_fails() -> None:
    async with servers.serve(servers.repeating_cursor()) as srv:
        with pytest.raises(PaginationError, match="repeated a cursor"):
            await photograph(srv.url, {})
        assert srv.methods.count("tools/list") == 3  # None → a → b → a (refused before asking again)


async def test_pagination_error_is_a_client_error() -> None:
    assert issubclass(PaginationError, McpClientError)
    for cls in (Unreachable, AuthRejected, UnsupportedProtocol):
        assert issubclass(cls, McpClientError)


async def test_bearer_right_token_photographs() -> None:
    async with servers.serve(servers.bearer(TOKEN)) as srv:
        photo = await photograph(srv.url, {"Authorization": f"Bearer {TOKEN}"})
    assert [t["name"] for t in photo.tools] == BASIC_TOOLS


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-0xdeadbeef"}], ids=["missing", "wrong"])
async def test_bearer_wrong_or_missing_token_is_auth_rejected(headers: dict[str, str]) -> None:
    async with servers.serve(servers.bearer(TOKEN)) as srv:
        with pytest.raises(AuthRejected) as info:
            await photograph(srv.url, headers)
    assert info.value.status == 401
    assert "wrong-token-0xdeadbeef" not in str(info.value)
    assert TOKEN not in str(info.value)
    assert srv.methods == ["initialize"]


async def test_custom_header_auth() -> None:
    async with servers.serve(servers.header("X-Api-Key", TOKEN)) as srv:
        photo = await photograph(srv.url, {"X-Api-Key": TOKEN})
        assert [t["name"] for t in photo.tools] == BASIC_TOOLS
        with pytest.raises(AuthRejected):
            await photograph(srv.url, {"Authorization": f"Bearer {TOKEN}"})


async def test_older_accepted_protocol_is_photographed() -> None:
    async with servers.serve(servers.pinned_version("2025-06-18")) as srv:
        photo = await photograph(srv.url, {})
    assert photo.protocol_version == "2025-06-18"
    assert [t["name"] for t in photo.tools] == BASIC_TOOLS


async def test_unsupported_protocol_is_refused_before_listing() -> None:
    async with servers.serve(servers.pinned_version("2024-11-05")) as srv:
        with pytest.raises(UnsupportedProtocol, match="2024-11-05") as info:
            await photograph(srv.url, {})
    assert info.value.version == "2024-11-05"
    assert "tools/list" not in srv.methods


async def test_stopped_server_is_unreachable() -> None:
    async with servers.serve(servers.basic()) as srv:
        await srv.stop()
        with pytest.raises(Unreachable):
            await photograph(srv.url, {}, timeout=5)


async def test_unresolvable_host_is_unreachable() -> None:
    with pytest.raises(Unreachable):
        await photograph("http://fluidbox-no-such-host.invalid/mcp", {}, timeout=5)


async def test_silent_server_is_unreachable_within_the_timeout() -> None:
    async with servers.blackhole() as url:
        started = time.monotonic()
        with pytest.raises(Unreachable, match="did not complete initialize"):
            await photograph(url, {}, timeout=0.5)
    assert time.monotonic() - started < 5


async def test_url_secrets_stay_out_of_errors() -> None:
    async with servers.serve(servers.basic()) as srv:
        await srv.stop()
        url = srv.url.replace("http://", "http://user:pw-secret@") + "?key=q-secret"
        with pytest.raises(Unreachable) as info:
            await photograph(url, {}, timeout=5)
    assert "pw-secret" not in str(info.value)
    assert "q-secret" not in str(info.value)


# --------------------------------------------------------------------------------------------------------------------
# call_tool


async def test_call_succeeds_exactly_once() -> None:
    async with servers.serve(servers.basic()) as srv:
        out = await call_tool(srv.url, {}, "add", {"a": 2, "b": 3}, expected_protocol="2025-11-25")
    assert out.outcome == "succeeded", out.error
    assert out.error is None
    assert out.result == {
        "content": [{"type": "text", "text": "5"}],
        "is_error": False,
        "structured_content": {"result": 5},
    }
    assert srv.calls == [("add", {"a": 2, "b": 3})]
    assert srv.executions == ["add"]
    # one short-lived session: initialize, then the call; no extra tools/list behind our back
    assert srv.methods == ["initialize", "tools/call"]


async def test_call_without_expected_protocol_skips_the_drift_check() -> None:
    async with servers.serve(servers.pinned_version("2025-06-18")) as srv:
        out = await call_tool(srv.url, {}, "echo", {"text": "hi"}, expected_protocol=None)
    assert out.outcome == "succeeded"
    assert out.result is not None and out.result["content"] == [{"type": "text", "text": "hi"}]


async def test_is_error_result_is_failed_upstream_and_kept() -> None:
    async with servers.serve(servers.basic()) as srv:
        out = await call_tool(srv.url, {}, "fail", {"text": "boom"}, expected_protocol="2025-11-25")
    assert out.outcome == "failed_upstream"
    assert out.result == {"content": [{"type": "text", "text": "failed: boom"}], "is_error": True}
    assert out.error is not None and "failed: boom" in out.error
    assert srv.call_count("fail") == 1


async def test_jsonrpc_error_is_failed_upstream() -> None:
    async with servers.serve(servers.basic()) as srv:
        out = await call_tool(srv.url, {}, "rpc_error", {"text": "nope"}, expected_protocol="2025-11-25")
    assert out.outcome == "failed_upstream"
    assert out.error is not None and "-32602" in out.error and "rejected: nope" in out.error
    assert out.result is not None and out.result["is_error"] is True
    assert srv.call_count("rpc_error") == 1


async def test_http_4xx_on_call_is_failed_upstream() -> None:
    async with servers.serve(servers.http_error_on_call(429)) as srv:
        out = await call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol="2025-11-25")
    assert out.outcome == "failed_upstream"
    assert out.error is not None and "HTTP 429" in out.error
    assert srv.call_count() == 1
    assert srv.executions == []


async def test_http_5xx_on_call_is_ambiguous() -> None:
    async with servers.serve(servers.http_error_on_call(502)) as srv:
        out = await call_tool(srv.url, {}, "add", {"a": 1, "b": 1}, expected_protocol="2025-11-25")
    assert out.outcome == "ambiguous"
    assert out.result is None
    assert out.error is not None and "HTTP 502" in out.error
    assert srv.call_count() == 1


async def test_stopped_server_is_failed_before_send() -> None:
    async with servers.serve(servers.basic()) as srv:
        await srv.stop()
        out = await call_tool(srv.url, {}, "add", {"a": 2, "b": 3}, expected_protocol="2025-11-25", timeout=5)
    assert out.outcome == "failed_before_send"
    assert out.result is None
    assert out.error is not None and "cannot reach" in out.error
    assert srv.methods == []


async def test_unresolvable_host_is_failed_before_send() -> None:
    out = await call_tool(
        "http://fluidbox-no-such-host.invalid/mcp", {}, "add", {}, expected_protocol="2025-11-25", timeout=5
    )
    assert out.outcome == "failed_before_send"


async def test_silent_server_is_failed_before_send_within_the_timeout() -> None:
    async with servers.blackhole() as url:
        started = time.monotonic()
        out = await call_tool(url, {}, "add", {"a": 1, "b": 2}, expected_protocol="2025-11-25", timeout=0.5)
    assert out.outcome == "failed_before_send"
    assert out.error is not None and "did not complete initialize" in out.error
    assert time.monotonic() - started < 5


async def test_protocol_drift_is_failed_before_send() -> None:
    async with servers.serve(servers.basic()) as srv:
        out = await call_tool(srv.url, {}, "add", {"a": 2, "b": 3}, expected_protocol="2025-06-18")
    assert out.outcome == "failed_before_send"
    assert out.result is None
    assert out.error == (
        "mcp protocol drift: server now negotiates '2025-11-25' but this run's frozen snapshot recorded "
        "'2025-06-18' — run POST /v1/connections/{id}/tools/refresh to re-photograph"
    )
    assert srv.call_count() == 0
    assert srv.methods == ["initialize"]


async def test_protocol_drift_downwards_is_failed_before_send() -> None:
    async with servers.serve(servers.pinned_version("2025-06-18")) as srv:
        out = await call_tool(srv.url, {}, "add", {"a": 2, "b": 3}, expected_protocol="2025-11-25")
    assert out.outcome == "failed_before_send"
    assert out.error == drift_message("2025-06-18", "2025-11-25")
    assert srv.call_count() == 0


async def test_unsupported_protocol_is_failed_before_send() -> None:
    async with servers.serve(servers.pinned_version("2024-11-05")) as srv:
        out = await call_tool(srv.url, {}, "add", {"a": 2, "b": 3}, expected_protocol="2024-11-05")
    assert out.outcome == "failed_before_send"
    assert out.error is not None and "unsupported MCP protocol version '2024-11-05'" in out.error
    assert srv.call_count() == 0


async def test_auth_refused_at_initialize_is_failed_before_send_without_leaking() -> None:
    wrong = "Bearer wrong-token-0xfeedface"
    async with servers.serve(servers.bearer(TOKEN)) as srv:
        out = await call_tool(srv.url, {"Authorization": wrong}, "add", {"a": 1, "b": 2}, expected_protocol=None)
        ok = await call_tool(
            srv.url, {"Authorization": f"Bearer {TOKEN}"}, "add", {"a": 1, "b": 2}, expected_protocol="2025-11-25"
        )
    assert out.outcome == "failed_before_send" and out.auth_rejected
    assert out.error is not None and "HTTP 401" in out.error
    assert "feedface" not in out.error and TOKEN not in out.error
    assert ok.outcome == "succeeded" and not ok.auth_rejected
    assert srv.calls == [("add", {"a": 1, "b": 2})]  # only the authorised call arrived


async def test_custom_header_call() -> None:
    async with servers.serve(servers.header("X-Api-Key", TOKEN)) as srv:
        out = await call_tool(srv.url, {"X-Api-Key": TOKEN}, "echo", {"text": "yo"}, expected_protocol="2025-11-25")
    assert out.outcome == "succeeded"
    assert srv.call_count("echo") == 1


async def test_timeout_after_send_is_ambiguous_and_bounded() -> None:
    async with servers.serve(servers.basic()) as srv:
        started = time.monotonic()
        out = await call_tool(srv.url, {}, "slow", {"seconds": 10}, expected_protocol="2025-11-25", timeout=0.5)
        elapsed = time.monotonic() - started
    assert out.outcome == "ambiguous"
    assert out.result is None
    assert out.error is not None and "outcome unknown" in out.error
    assert elapsed < 5, elapsed
    assert srv.call_count("slow") == 1
    assert srv.executions == ["slow"]  # it really started upstream: that is why it must not be retried


async def test_dropped_connection_after_send_is_ambiguous() -> None:
    async with servers.serve(servers.basic()) as srv:
        out = await call_tool(srv.url, {}, "drop_connection", {}, expected_protocol="2025-11-25", timeout=10)
    assert out.outcome == "ambiguous"
    assert out.result is None
    assert srv.call_count("drop_connection") == 1
    assert srv.executions == ["drop_connection"]


async def test_changing_server_call_uses_current_registry() -> None:
    async with servers.serve(servers.changing()) as srv:
        srv.registry.add("double", "double n", {"type": "object"}, fn=lambda args: args["n"] * 2)
        out = await call_tool(srv.url, {}, "double", {"n": 21}, expected_protocol="2025-11-25")
    assert out.outcome == "succeeded"
    assert out.result is not None and out.result["content"] == [{"type": "text", "text": "42"}]
    assert "structured_content" not in out.result
    assert srv.calls == [("double", {"n": 21})]


@pytest.mark.parametrize(("status", "rejected"), [(401, True), (403, False)])
async def test_only_a_401_to_tools_call_marks_the_token_as_rejected(status: int, rejected: bool) -> None:
    """An OAuth caller refreshes and retries once after a 401 (the token was not accepted); a 403 is a scope
    problem that a refresh does not fix."""
    async with servers.serve(servers.http_error_on_call(status)) as srv:
        out = await call_tool(srv.url, {}, "add", {"a": 1, "b": 2}, expected_protocol=None)
    assert out.outcome == "failed_upstream" and out.auth_rejected is rejected
    assert srv.executions == []
