"""integrations.llm_upstream against the scripted LLM upstream on loopback (tests/llm_upstream.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

from cli.stack import free_port
from core.redaction import MARK
from core.usage import Dialect
from integrations.llm_upstream import (
    ANTHROPIC_VERSION,
    LlmUpstream,
    NoAnswer,
    Unreachable,
    chunks,
    error_content,
    passed_headers,
    relay_headers,
    request_headers,
    request_url,
)
from tests.llm_upstream import Upstream, Usage, failure, running_upstream, text

pytestmark = pytest.mark.timeout(60)

KEY = "sk-ant-real-upstream-key-0123456789"
BODY = json.dumps({"model": "replay", "max_tokens": 16, "stream": True, "messages": []}).encode()


@pytest.fixture(scope="module")
def scripted() -> Iterator[Upstream]:
    with running_upstream() as up:
        yield up


@pytest.fixture
def upstream(scripted: Upstream) -> Upstream:
    scripted.clear()
    scripted.default = text("ok")
    return scripted


@pytest.fixture
async def client() -> AsyncIterator[LlmUpstream]:
    c = LlmUpstream(timeout_secs=10.0, keepalive_secs=4.0)
    try:
        yield c
    finally:
        await c.close()


def test_the_real_key_goes_where_each_dialect_expects_it_and_nothing_else_of_the_client_does() -> None:
    client = {"accept": "text/event-stream", "anthropic-beta": "tools-2", "x-api-key": "llm-token", "cookie": "a=b"}
    assert request_headers(Dialect.ANTHROPIC, KEY, client) == {
        "content-type": "application/json",
        "accept-encoding": "identity",
        "accept": "text/event-stream",
        "x-api-key": KEY,
        "anthropic-version": ANTHROPIC_VERSION,
        "anthropic-beta": "tools-2",
    }
    assert request_headers(Dialect.OPENAI, KEY, {"authorization": "Bearer llm-token"}) == {
        "content-type": "application/json",
        "accept-encoding": "identity",
        "accept": "application/json",
        "authorization": f"Bearer {KEY}",
    }


def test_the_upstream_url_joins_base_path_and_query() -> None:
    assert request_url("https://api.example.com/", "v1/messages", "") == "https://api.example.com/v1/messages"
    assert request_url("http://proxy:4000/anthropic", "v1/messages", "beta=true") == (
        "http://proxy:4000/anthropic/v1/messages?beta=true"
    )


async def test_a_streamed_answer_is_relayed_as_sse_and_the_upstream_sees_only_the_real_key(
    client: LlmUpstream, upstream: Upstream
) -> None:
    upstream.push(text("streamed to the end", usage=Usage(input=5, output=4)))
    headers = request_headers(Dialect.ANTHROPIC, KEY, {"accept": "text/event-stream"})
    answer = await client.post(request_url(upstream.url, "v1/messages", ""), BODY, headers)
    assert answer.status == 200
    relayed, streaming = relay_headers(answer, passed_headers(answer))
    assert streaming
    assert (b"content-type", b"text/event-stream; charset=utf-8") in relayed
    assert (b"cache-control", b"no-cache") in relayed and (b"x-accel-buffering", b"no") in relayed
    received = b"".join([chunk async for chunk in chunks(answer)])
    answer.release()
    assert b"event: message_stop" in received
    [seen] = upstream.requests
    assert seen.headers["x-api-key"] == KEY and seen.headers["accept-encoding"] == "identity"
    assert "user-agent" not in seen.headers and "cookie" not in seen.headers


async def test_a_redirect_is_answered_not_followed(client: LlmUpstream, upstream: Upstream) -> None:
    upstream.push(failure(307, "moved").redirecting(f"{upstream.url}/v1/messages?followed=1"))
    answer = await client.post(f"{upstream.url}/v1/messages", BODY, request_headers(Dialect.ANTHROPIC, KEY, {}))
    assert answer.status == 307
    assert await error_content(answer, KEY) is not None
    assert [r.query for r in upstream.requests] == [""]


@pytest.mark.parametrize("gzipped", [False, True])
async def test_an_error_answer_is_read_whole_and_scrubbed_of_the_key(
    client: LlmUpstream, upstream: Upstream, gzipped: bool
) -> None:
    turn = failure(400, f"invalid header x-api-key: {KEY}")
    upstream.push(turn.gzipped() if gzipped else turn)
    answer = await client.post(f"{upstream.url}/v1/messages", BODY, request_headers(Dialect.ANTHROPIC, KEY, {}))
    content = await error_content(answer, KEY)
    assert content is not None and KEY.encode() not in content
    assert json.loads(content)["error"]["message"] == f"invalid header x-api-key: {MARK}"


async def test_nothing_listening_is_unreachable_and_the_session_comes_back_after_close(
    client: LlmUpstream, upstream: Upstream
) -> None:
    with pytest.raises(Unreachable) as err:
        await client.post(f"http://127.0.0.1:{free_port()}/v1/messages", BODY, {})
    assert str(err.value) == "ClientConnectorError"
    assert not issubclass(Unreachable, NoAnswer)
    await client.close()
    answer = await client.post(f"{upstream.url}/v1/messages", BODY, request_headers(Dialect.ANTHROPIC, KEY, {}))
    assert answer.status == 200
    await answer.read()
    answer.release()
