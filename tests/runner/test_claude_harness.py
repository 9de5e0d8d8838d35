"""The Claude harness's own parts, fast: the loopback relay (against a real HTTP server on a Unix socket),
the CLI's environment, the capability parsing, the gate witness and the outcome mapping.

The harness end to end (the real CLI in a real sandbox, through the gate and the LLM facade) is in
tests/integration/test_claude_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from claude_agent_sdk import PermissionResultAllow, ResultMessage, ToolResultBlock, ToolUseBlock
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from runner import claude
from runner.claude import UngovernedTool, Witness, brokered_result, brokered_tools, cli_env, outcome
from runner.relay import Relay, rewrite_head
from tests.helpers import server_thread

TOKEN = "fbx_sess_llm_token_for_the_relay"


class UdsServer:
    """A real HTTP server on a Unix socket (what the relay faces in the sandbox), recording what it got."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[dict[str, Any]] = []
        self.release = threading.Event()
        routes = [Route("/echo", self._echo, methods=["POST", "GET"]), Route("/stream", self._stream)]
        config = uvicorn.Config(Starlette(routes=routes), uds=str(path), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)

    async def _echo(self, request: Request) -> JSONResponse:
        body = await request.body()
        record = {"headers": [(k.lower(), v) for k, v in request.headers.items()], "body": body.decode()}
        self.seen.append(record)
        return JSONResponse(record)

    async def _stream(self, request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            yield b"data: first\n\n"
            # The second event waits until the test has read the first through the relay.
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            yield b"data: second\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture
def uds_server(tmp_path: Path) -> Iterator[UdsServer]:
    srv = UdsServer(tmp_path / "api.sock")
    with server_thread(srv.server):
        try:
            yield srv
        finally:
            srv.release.set()  # a stream still waiting for its second event ends


def test_the_relay_replaces_every_credential_header_with_the_run_token(uds_server: UdsServer) -> None:
    with Relay(str(uds_server.path), api_key=TOKEN) as relay, httpx.Client(base_url=relay.url) as client:
        r = client.post(
            "/echo",
            content=b'{"hello": "world"}',
            headers={"x-api-key": "placeholder", "authorization": "Bearer another", "x-other": "kept"},
        )
        assert r.status_code == 200
        headers = r.json()["headers"]
        assert [v for k, v in headers if k == "x-api-key"] == [TOKEN]
        assert not [k for k, _ in headers if k == "authorization"]
        assert ["x-other", "kept"] in headers
        assert r.json()["body"] == '{"hello": "world"}'


def test_keep_alive_requests_and_chunked_bodies_are_each_rewritten(uds_server: UdsServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"part one, "
        yield b"part two"

    with Relay(str(uds_server.path), api_key=TOKEN) as relay, httpx.Client(base_url=relay.url) as client:
        first = client.post("/echo", content=b"a" * 200_000, headers={"x-api-key": "p"})
        second = client.post("/echo", content=chunks(), headers={"x-api-key": "p"})
        third = client.get("/echo")
        assert relay.connections == 1, "one kept-alive connection carried all three requests"
    assert first.json()["body"] == "a" * 200_000
    assert second.json()["body"] == "part one, part two"
    assert ["transfer-encoding", "chunked"] in second.json()["headers"]
    for answer in (first, second, third):
        assert [v for k, v in answer.json()["headers"] if k == "x-api-key"] == [TOKEN]


@pytest.mark.timeout(60)
def test_a_streamed_response_is_relayed_as_it_arrives(uds_server: UdsServer) -> None:
    # The upstream holds its second event until the first one has come out of the relay: a relay that
    # buffered the response would never deliver the first, and this test would time out.
    with Relay(str(uds_server.path), api_key=TOKEN) as relay, httpx.Client(base_url=relay.url, timeout=30) as client:
        with client.stream("GET", "/stream") as response:
            lines = response.iter_lines()
            assert next(lines) == "data: first"
            uds_server.release.set()
            rest = [line for line in lines if line]
    assert rest == ["data: second"]


def test_without_a_key_the_relay_is_a_plain_byte_pipe(uds_server: UdsServer) -> None:
    with Relay(str(uds_server.path)) as relay, httpx.Client(base_url=relay.url) as client:
        headers = client.post("/echo", content=b"x", headers={"x-api-key": "theirs"}).json()["headers"]
    assert [v for k, v in headers if k == "x-api-key"] == ["theirs"]


def test_stop_closes_the_listener_and_open_connections(uds_server: UdsServer) -> None:
    relay = Relay(str(uds_server.path), api_key=TOKEN).start()
    port = relay.port
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    assert b"200 OK" in sock.recv(65536)
    relay.stop()
    sock.settimeout(10)
    assert sock.recv(65536) == b"", "the open connection was closed"
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_an_unreachable_socket_is_a_502_in_the_provider_error_shape(tmp_path: Path) -> None:
    with Relay(str(tmp_path / "nothing.sock"), api_key=TOKEN) as relay, httpx.Client(base_url=relay.url) as client:
        r = client.post("/v1/messages", content=b"{}" * 50_000)
    assert r.status_code == 502
    assert r.json()["type"] == "error" and "control plane is unreachable" in r.json()["error"]["message"]


def test_malformed_heads_are_refused() -> None:
    with pytest.raises(claude_relay_error()):
        rewrite_head(b"POST / HTTP/1.1\r\nno colon here\r\n\r\n", b"k")
    with pytest.raises(claude_relay_error()):
        rewrite_head(b"POST / HTTP/1.1\r\ncontent-length: -3\r\n\r\n", b"k")
    head, length, chunked = rewrite_head(b"POST / HTTP/1.1\r\nContent-Length: 12\r\nX-Api-Key: a\r\n\r\n", b"k")
    assert (length, chunked) == (12, False)
    assert head == b"POST / HTTP/1.1\r\nContent-Length: 12\r\nx-api-key: k\r\n\r\n"


def claude_relay_error() -> type[Exception]:
    from runner.relay import BadRequest

    return BadRequest


# -- the CLI's environment and configuration ------------------------------------------------------------


def test_the_cli_environment_is_an_allow_list_without_any_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUIDBOX_SESSION_ID", "run-1")
    monkeypatch.setenv("FLUIDBOX_TOOL_TOKEN", "fbx_sess_tool")
    monkeypatch.setenv("SOMETHING_ELSE", "x")
    env = cli_env(base_url="http://127.0.0.1:1/internal/llm", model="claude-haiku-4-5", home="/tmp/h")
    assert not [k for k in env if k.startswith("FLUIDBOX_")]
    assert "SOMETHING_ELSE" not in env and "fbx_sess_tool" not in json.dumps(env)
    assert env["ANTHROPIC_API_KEY"] == claude.PLACEHOLDER_KEY
    assert env["ENABLE_TOOL_SEARCH"] == "false" and env["CLAUDE_CODE_MAX_RETRIES"] == "2"
    assert {env[k] for k in env if k.startswith("ANTHROPIC_") and k.endswith("MODEL")} == {"claude-haiku-4-5"}


def test_brokered_surfaces_come_from_the_capabilities_document() -> None:
    doc = {
        "servers": [
            {"class": "brokered", "name": "calc", "tools": [{"name": "add", "input_schema": {"type": "object"}}]},
            {"class": "sandbox", "name": "fs", "command": "x", "args": []},
        ]
    }
    assert brokered_tools(json.dumps(doc)) == {"calc": [{"name": "add", "input_schema": {"type": "object"}}]}
    assert brokered_tools(None) == {} and brokered_tools("  ") == {}
    for bad, message in [
        ("{", "not JSON"),
        ("[]", "no servers list"),
        ('{"servers": [{"class": "brokered"}]}', "name"),
    ]:
        with pytest.raises(ValueError, match=message):
            brokered_tools(bad)


def test_broker_answers_become_tool_results_the_model_can_read() -> None:
    ok = {"ok": True, "result": {"content": [{"type": "text", "text": "5"}], "is_error": False}}
    assert brokered_result(ok) == {"content": [{"type": "text", "text": "5"}], "is_error": False}
    denied = brokered_result({"ok": False, "denied": True, "message": "policy"})
    assert denied["is_error"] and denied["content"][0]["text"] == "fluidbox denied this call: policy"
    failed = brokered_result({"ok": False, "error": "outcome ambiguous"})
    assert failed["content"][0]["text"] == "brokered execution failed: outcome ambiguous"


# -- the gate witness and the outcome ---------------------------------------------------------------------


def test_a_result_for_an_undecided_call_is_ungoverned_but_a_cli_refusal_is_not() -> None:
    witness = Witness()
    witness.saw(ToolUseBlock(id="t1", name="Bash", input={"command": "ls"}))
    witness.saw(ToolUseBlock(id="t2", name="Glob", input={}))
    witness.decided["t3"] = PermissionResultAllow()
    witness.check(ToolResultBlock(tool_use_id="t3", content="fine"))
    witness.check(
        ToolResultBlock(tool_use_id="t2", content="<tool_use_error>No such tool</tool_use_error>", is_error=True)
    )
    with pytest.raises(UngovernedTool) as excinfo:
        witness.check(ToolResultBlock(tool_use_id="t1", content="a.txt"))
    assert (excinfo.value.tool, excinfo.value.tool_call_id) == ("Bash", "t1")


def _result(**fields: Any) -> ResultMessage:
    base: dict[str, Any] = {
        "subtype": "success", "duration_ms": 1, "duration_api_ms": 1, "is_error": False, "num_turns": 1,
        "session_id": "s",
    }  # fmt: skip
    return ResultMessage(**{**base, **fields})


def test_the_final_result_becomes_the_summary_or_the_failure() -> None:
    assert outcome(_result(result="Fixed it.")) == ("Fixed it.", None)
    assert outcome(_result(result=""))[0] == "(the agent finished without a final message)"
    summary, failure = outcome(_result(is_error=True, result="API Error: 400 nope", api_error_status=400))
    assert summary == "" and failure == "claude-agent-sdk agent ended with an error (HTTP 400): API Error: 400 nope"
    assert outcome(_result(subtype="error_max_turns", errors=["max turns"]))[1] == (
        "claude-agent-sdk agent ended with an error: max turns"
    )


def test_with_a_path_prefix_the_relay_adds_its_token_to_nothing_else(uds_server: UdsServer) -> None:
    with Relay(str(uds_server.path), api_key=TOKEN, path_prefix="/echo") as relay:
        with httpx.Client(base_url=relay.url) as client:
            assert client.post("/echo", content=b"x").status_code == 200
        # Another route of the control plane: never forwarded (the token is for the facade only).
        with httpx.Client(base_url=relay.url) as client, pytest.raises(httpx.HTTPError):
            client.get("/stream")
        with httpx.Client(base_url=relay.url) as client, pytest.raises(httpx.HTTPError):
            client.get("/echoes")


class TcpServer(UdsServer):
    """The same recording server on loopback TCP: what the relay faces in a Kubernetes Pod."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        routes = [Route("/echo", self._echo, methods=["POST", "GET"])]
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(Starlette(routes=routes), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)


def test_in_a_pod_the_relay_reaches_the_control_plane_over_http_and_still_swaps_the_key() -> None:
    srv = TcpServer()
    try:
        with server_thread(srv.server, sockets=[srv.sock]):
            with Relay(srv.url, api_key=TOKEN) as relay, httpx.Client(base_url=relay.url) as client:
                r = client.post("/echo", content=b"{}", headers={"x-api-key": "placeholder"})
        assert r.status_code == 200
        assert [v for k, v in r.json()["headers"] if k == "x-api-key"] == [TOKEN]
    finally:
        srv.sock.close()


def test_the_harness_uses_the_socket_on_a_host_and_the_control_url_in_a_pod() -> None:
    base = {"FLUIDBOX_CONTROL_URL": "http://fluidbox-api.fluidbox.svc:8000"}
    assert claude.Settings.from_env({**base, "FLUIDBOX_CONTROL_SOCKET": "/run/fluidbox/api.sock"}).socket_path == (
        "/run/fluidbox/api.sock"
    )
    in_pod = {**base, "FLUIDBOX_BOOTSTRAP_FILE": "/var/run/fluidbox/bootstrap/token"}
    assert claude.Settings.from_env(in_pod).socket_path == "http://fluidbox-api.fluidbox.svc:8000"
    with pytest.raises(ValueError, match="FLUIDBOX_CONTROL_SOCKET is not set"):
        claude.Settings.from_env(base)  # a host sandbox never falls back to the cosmetic URL
