"""Security invariant 9 at the front door: a body is judged by its credential before a byte of it is read.

Each request here is written by hand on a raw connection: its headers and a first chunk go out, the rest is
held back, and the answer is read while it is still unsent. An API that buffered the body first would never
answer (the read would hit its bound); ours answers from the headers alone.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack, free_port, wait_for
from tests.helpers import eventually
from tests.integration.helpers import issue_token, make_agent, start_run, wait_status

pytestmark = pytest.mark.stack

CHUNK = 64 * 1024
MIB = 1024 * 1024
ANSWER_WITHIN = 20.0  # a bound on each read, never a measure: a guard that waits for the body never answers
IDLE = [{"sleep_ms": 600000}]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Raw:
    """One HTTP/1.1 connection driven by hand, to send part of a body and read the answer meanwhile."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def head(self, method: str, path: str, headers: dict[str, str]) -> None:
        lines = [f"{method} {path} HTTP/1.1", "host: fluidbox", *(f"{k}: {v}" for k, v in headers.items())]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await self.writer.drain()

    async def chunk(self, data: bytes) -> None:
        self.writer.write(b"%x\r\n" % len(data) + data + b"\r\n")
        await self.writer.drain()

    async def last_chunk(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def answer(self) -> Answer:
        async with asyncio.timeout(ANSWER_WITHIN):
            status_line = await self.reader.readline()
            assert status_line, "the API closed the connection without answering"
            headers: dict[str, str] = {}
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return Answer(int(status_line.split()[1]), headers, body)


@asynccontextmanager
async def tcp(url: str) -> AsyncIterator[Raw]:
    host, _, port = httpx.URL(url).netloc.decode().rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield Raw(reader, writer)
    finally:
        writer.close()


@asynccontextmanager
async def gateway(stack: Stack) -> AsyncIterator[Raw]:
    """The sandbox's way in: the gateway Unix socket bound into every sandbox."""
    reader, writer = await asyncio.open_unix_connection(str(stack.home / "gateway" / "api.sock"))
    try:
        yield Raw(reader, writer)
    finally:
        writer.close()


def chunked(content_type: str, auth: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    return {"content-type": content_type, "transfer-encoding": "chunked", **(auth or {}), **extra}


async def refused_unread(raw: Raw, method: str, path: str, headers: dict[str, str]) -> Answer:
    """Send the headers and one chunk of a body meant to be 30 MiB; the answer comes with the rest unsent."""
    await raw.head(method, path, headers)
    if headers.get("transfer-encoding") == "chunked":
        await raw.chunk(b"x" * CHUNK)
    else:
        raw.writer.write(b"x" * CHUNK)
        await raw.writer.drain()
    return await raw.answer()


UNAUTHORIZED = {"error": "unauthorized", "code": "unauthorized"}
UNKNOWN_RUN_TOKEN = {"authorization": "Bearer fbx_sess_" + "0" * 32}


@asynccontextmanager
async def held_run(api: httpx.AsyncClient) -> AsyncIterator[str]:
    run_id = await start_run(api, await make_agent(api, IDLE), workspace=None)
    await wait_status(api, run_id, {"running"})
    try:
        yield run_id
    finally:
        await api.post(f"/v1/sessions/{run_id}/cancel")


async def test_a_tokenless_or_unknown_token_upload_is_refused_before_its_body_is_read(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    workspace = f"/internal/sessions/{uuid.uuid4()}/workspace"
    gzip = "application/gzip"
    cases: list[tuple[str, str, dict[str, str]]] = [
        ("PUT", workspace, chunked(gzip)),
        ("PUT", workspace, chunked(gzip, UNKNOWN_RUN_TOKEN)),  # the right shape, looked up: unknown
        ("PUT", workspace, chunked(gzip, {"authorization": "Bearer not-a-run-token"})),
        ("PUT", workspace, {"content-type": gzip, "content-length": str(30 * MIB)}),
        ("POST", "/v1/agents", chunked("application/json")),
        ("POST", "/v1/agents", chunked("application/json", {"authorization": "Bearer guess"})),
        ("POST", "/internal/sessions/x/events", chunked("application/json", {"authorization": "Bearer fbx_pat_x"})),
    ]
    for method, path, headers in cases:
        async with tcp(stack.api_url) as raw:
            r = await refused_unread(raw, method, path, headers)
        assert (r.status, r.json()) == (401, UNAUTHORIZED), (method, path, headers)


async def test_a_tokenless_model_call_over_the_gateway_is_refused_before_its_body_is_read(stack: Stack) -> None:
    messages = "/internal/llm/v1/messages"
    for headers in (
        chunked("application/json"),
        chunked("application/json", {"x-api-key": "fbx_sess_" + "0" * 32}),
        chunked("application/json", {"x-api-key": "sk-ant-a-real-looking-key"}),
        {"content-type": "application/json", "content-length": str(30 * MIB)},
    ):
        async with gateway(stack) as raw:
            r = await refused_unread(raw, "POST", messages, headers)
        assert r.status == 401, headers
        assert r.json() == {"type": "error", "error": {"type": "authentication_error", "message": "unauthorized"}}
    async with gateway(stack) as raw:
        r = await refused_unread(raw, "POST", "/internal/llm/v1/responses", chunked("application/json"))
    assert r.status == 401 and r.json()["error"]["type"] == "authentication_error"  # the OpenAI shape


async def test_a_large_body_with_another_runs_or_audiences_token_is_refused_unread(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    async with held_run(api) as run_id, held_run(api) as other_id:
        tool = await issue_token(stack.database_url or "", run_id, "tool")
        other = await issue_token(stack.database_url or "", other_id, "workspace")
        async with tcp(stack.api_url) as raw:
            r = await refused_unread(
                raw, "PUT", f"/internal/sessions/{run_id}/workspace", chunked("application/gzip", bearer(tool))
            )
        assert (r.status, r.body) == (403, b'{"error":"wrong_audience"}')
        async with tcp(stack.api_url) as raw:
            r = await refused_unread(
                raw, "PUT", f"/internal/sessions/{run_id}/workspace", chunked("application/gzip", bearer(other))
            )
        assert (r.status, r.json()) == (404, {"error": "not found", "code": "not_found"})
        async with gateway(stack) as raw:
            r = await refused_unread(
                raw, "POST", "/internal/llm/v1/messages", chunked("application/json", {"x-api-key": tool})
            )
        assert (r.status, r.body) == (403, b'{"error":"wrong_audience"}')
        # The run's own token is let in: its body is read and judged (here: the digest does not match).
        own = await issue_token(stack.database_url or "", run_id, "workspace")
        async with tcp(stack.api_url) as raw:
            await raw.head(
                "PUT",
                f"/internal/sessions/{run_id}/workspace",
                chunked("application/gzip", bearer(own), **{"x-fluidbox-sha256": "0" * 64}),
            )
            await raw.chunk(b"not really a tar")
            await raw.last_chunk()
            r = await raw.answer()
        assert r.status == 400 and "does not match the archive" in r.json()["error"]


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@asynccontextmanager
async def second_api(stack: Stack, **env: str) -> AsyncIterator[str]:
    """Another API process of the session's stack with settings of its own (its log joins the stack's)."""
    port = free_port()
    name = f"api-{uuid.uuid4().hex[:6]}"
    overrides = {
        **stack.env,
        "FLUIDBOX_BIND": f"127.0.0.1:{port}",
        "FLUIDBOX_GATEWAY_SOCKET": str(Path(stack.home) / f"gateway-{name}" / "api.sock"),
        **env,
    }
    proc = stack._spawn(name, [sys.executable, "-m", "api.serve"], overrides)
    url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        async with httpx.AsyncClient(timeout=2) as client:
            return (await client.get(f"{url}/v1/ready")).status_code == 200

    try:
        await wait_for(ready, 60, f"the API process {name}", proc)
        yield url
    finally:
        stack.stop_process(name)


async def test_large_bodies_are_received_a_bounded_number_at_a_time(api: httpx.AsyncClient, stack: Stack) -> None:
    async with (
        second_api(stack, FLUIDBOX_MAX_CONCURRENT_LARGE_BODIES="1", FLUIDBOX_LARGE_BODY_WAIT_SECS="1") as url,
        held_run(api) as run_id,
    ):
        token = await issue_token(stack.database_url or "", run_id, "workspace")
        path = f"/internal/sessions/{run_id}/workspace"
        # Every archive below claims a digest it does not have: each is read and judged, none is stored.
        headers = chunked("application/gzip", bearer(token), **{"x-fluidbox-sha256": "0" * 64})
        declared = {k: v for k, v in headers.items() if k != "transfer-encoding"}
        big = b"x" * (3 * MIB)  # over the JSON ceiling, under the archive one

        async def another() -> httpx.Response:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                return await client.put(path, content=big, headers=declared)

        async with tcp(url) as held:
            # A body that is still arriving holds the process's one place...
            await held.head("PUT", path, headers)
            await held.chunk(b"x" * CHUNK)
            seen: list[int] = []

            async def turned_away() -> httpx.Response | None:
                r = await another()  # admitted (and judged: 400) until the held upload has taken the place
                seen.append(r.status_code)
                assert r.status_code in (400, 429), r.text
                return r if r.status_code == 429 else None

            busy = await eventually(
                turned_away, timeout=30, interval=0.05, message=lambda: f"never turned away: {seen}"
            )
            # ... so another large body waits a bounded time for it, then is told to come back.
            assert busy.json() == {
                "error": "too many large request bodies are being received at once; retry",
                "code": "too_busy",
            }
            assert busy.headers["retry-after"] == "1"
            # A model call's large body shares the places (and is refused in the provider's shape).
            llm = await issue_token(stack.database_url or "", run_id, "llm")
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                r = await client.post(
                    "/internal/llm/v1/messages",
                    content=json.dumps({"model": "replay", "messages": [], "pad": "x" * (3 * MIB)}),
                    headers={"content-type": "application/json", "x-api-key": llm},
                )
            assert r.status_code == 429 and r.json()["error"]["type"] == "too_busy", r.text
            # A small body needs no place.
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                small = await client.put(path, content=b"small", headers=declared)
            assert small.status_code == 400 and "does not match" in small.json()["error"]
            await held.last_chunk()
            finished = await held.answer()
        assert finished.status == 400 and "does not match the archive" in finished.json()["error"]
        # The place is free again once the held upload was answered.
        after = await another()
        assert after.status_code == 400 and "does not match" in after.json()["error"]
