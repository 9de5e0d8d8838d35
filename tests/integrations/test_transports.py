"""Transport providers against real servers: our FastAPI app's OpenAPI document, GitHub's document served by
Prism, and the npm MCP servers (server-everything, server-filesystem) launched over stdio."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integrations.transports import TransportConnection, TransportDeps, Transports
from integrations.transports.stdio import StdioProvider
from integrations.urls import UrlPolicy
from tests.helpers import eventually
from tests.http_apis import RunningApp, prism_github, serve_items
from tests.openapi_docs import ROOT

EVERYTHING = ROOT / ".node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
FILESYSTEM = ROOT / ".node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"


@pytest.fixture
async def transports() -> AsyncIterator[Transports]:
    t = Transports(TransportDeps(UrlPolicy(allow_loopback=True), max_response_bytes=4096))
    try:
        yield t
    finally:
        await t.aclose()


@pytest.fixture
async def items() -> AsyncIterator[RunningApp]:
    async with serve_items() as app:
        yield app


def openapi_conn(app: RunningApp, **config: Any) -> TransportConnection:
    return TransportConnection(
        id="c-openapi",
        transport="openapi",
        base_url=app.url,
        config={"document_url": app.url + "/openapi.json", **config},
        credential="secret-token-1234",
    )


def by_name(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in tools}


async def test_each_operation_becomes_a_tool_with_path_query_header_and_body_arguments_and_refs_resolved(
    transports: Transports, items: RunningApp
) -> None:
    provider = transports.provider_for("openapi")
    photo = await provider.list_tools(openapi_conn(items))
    tools = by_name(photo.tools)
    assert set(tools) == {"getItem", "createItem", "deleteItem", "bigReport", "whoAmI"}
    get = tools["getItem"]
    props = get["input_schema"]["properties"]
    assert set(props) == {"store", "item_id", "verbose", "x-trace"}
    assert set(get["input_schema"]["required"]) == {"store", "item_id"}
    assert {p["in"] for p in get["request"]["params"]} == {"path", "query", "header"}
    # The body's $ref (ItemIn → Label) is resolved into the frozen schema: no $ref is left for the gate.
    body = tools["createItem"]["input_schema"]["properties"]["body"]
    assert "$ref" not in json.dumps(body)
    assert body["properties"]["labels"]["items"]["properties"]["name"]["type"] == "string"
    # Default access classes from the method.
    assert (tools["getItem"]["access"], tools["createItem"]["access"], tools["deleteItem"]["access"]) == (
        "read", "write", "write",
    )  # fmt: skip
    answer = await provider.call_tool(
        openapi_conn(items), get, {"store": "a b", "item_id": 7, "verbose": True, "x-trace": "t-1"}
    )
    assert answer.outcome == "succeeded", answer.error
    sent = items.seen.requests[-1]
    assert sent["path"] == "/stores/a%20b/items/7" and sent["query"] == "verbose=true"
    assert sent["headers"]["x-trace"] == "t-1" and sent["headers"]["authorization"] == "Bearer secret-token-1234"
    assert answer.result is not None
    structured = answer.result["structured_content"]
    assert structured["status"] == 200 and structured["body"]["store"] == "a b"
    assert structured["headers"]["content-type"] == "application/json"
    created = await provider.call_tool(
        openapi_conn(items), tools["createItem"], {"store": "s", "body": {"title": "t", "labels": [{"name": "bug"}]}}
    )
    assert created.outcome == "succeeded" and created.result is not None
    assert created.result["structured_content"]["status"] == 201
    assert json.loads(items.seen.requests[-1]["body"]) == {"title": "t", "labels": [{"name": "bug"}]}


async def test_filters_and_access_overrides_shape_the_tool_set(transports: Transports, items: RunningApp) -> None:
    provider = transports.provider_for("openapi")
    conn = openapi_conn(items, include={"tags": ["items", "admin"]}, access={"getItem": "write", "delete*": "read"})
    tools = by_name((await provider.list_tools(conn)).tools)
    assert set(tools) == {"getItem", "createItem", "deleteItem"}
    assert (tools["getItem"]["access"], tools["deleteItem"]["access"]) == ("write", "read")
    only = by_name((await provider.list_tools(openapi_conn(items, include={"operations": ["create*"]}))).tools)
    assert set(only) == {"createItem"}


async def test_arguments_are_validated_against_the_frozen_schema_before_anything_is_sent(
    transports: Transports, items: RunningApp
) -> None:
    provider = transports.provider_for("openapi")
    tools = by_name((await provider.list_tools(openapi_conn(items))).tools)
    before = len(items.seen.requests)
    for bad in ({"store": "s"}, {"store": "s", "item_id": "seven"}, {"store": "s", "item_id": 1, "extra": 1}):
        answer = await provider.call_tool(openapi_conn(items), tools["getItem"], bad)
        assert answer.outcome == "failed_before_send" and "frozen schema" in (answer.error or "")
    # A header argument can never replace the credential.
    forged = dict(tools["getItem"])
    forged["request"] = {**forged["request"], "params": [*forged["request"]["params"],
                         {"name": "Authorization", "in": "header", "arg": "store"}]}  # fmt: skip
    answer = await provider.call_tool(openapi_conn(items), forged, {"store": "x", "item_id": 1})
    assert answer.outcome == "failed_before_send" and "reserved header" in (answer.error or "")
    assert len(items.seen.requests) == before, "nothing reached the API"


async def test_a_response_is_capped_and_only_allowed_headers_are_returned(
    transports: Transports, items: RunningApp
) -> None:
    provider = transports.provider_for("openapi")
    tools = by_name((await provider.list_tools(openapi_conn(items))).tools)
    answer = await provider.call_tool(openapi_conn(items), tools["bigReport"], {"size": 100000})
    assert answer.outcome == "succeeded" and answer.result is not None
    structured = answer.result["structured_content"]
    assert structured["truncated"] is True and len(structured["body"]) == 4096
    assert set(structured["headers"]) <= {"content-type", "content-length"}


async def test_api_key_in_query_and_basic_auth_definitions(transports: Transports, items: RunningApp) -> None:
    provider = transports.provider_for("openapi")
    conn = openapi_conn(items, auth={"type": "api_key", "in": "query", "name": "key"})
    tools = by_name((await provider.list_tools(conn)).tools)
    await provider.call_tool(conn, tools["getItem"], {"store": "s", "item_id": 1})
    assert items.seen.requests[-1]["query"] == "key=secret-token-1234"
    assert "authorization" not in items.seen.requests[-1]["headers"]
    basic = TransportConnection(**{**conn.__dict__, "config": {**conn.config, "auth": {"type": "basic"}},
                                   "credential": "me:pw"})  # fmt: skip
    await provider.call_tool(basic, tools["getItem"], {"store": "s", "item_id": 1})
    assert items.seen.requests[-1]["headers"]["authorization"] == "Basic bWU6cHc="


async def test_http_endpoints_declared_without_a_document(transports: Transports, items: RunningApp) -> None:
    provider = transports.provider_for("http")
    config = {
        "endpoints": [
            {"name": "get_item", "method": "GET", "path": "/stores/{store}/items/{item_id}",
             "arguments": {"type": "object", "properties": {"store": {"type": "string"}, "item_id": {"type": "integer"},
                           "verbose": {"type": "boolean"}}, "required": ["store", "item_id"],
                           "additionalProperties": False}},
            {"name": "create_item", "method": "POST", "path": "/stores/{store}/items", "access": "write",
             "arguments": {"type": "object", "properties": {"store": {"type": "string"}, "title": {"type": "string"}},
                           "required": ["store", "title"]}},
            {"name": "peek", "method": "DELETE", "path": "/stores/{store}/items/{item_id}", "access": "read",
             "arguments": {"type": "object", "properties": {"store": {"type": "string"},
                           "item_id": {"type": "integer"}}}},
        ]
    }  # fmt: skip
    conn = TransportConnection(id="c-http", transport="http", base_url=items.url, config=config, credential="tok-9999")
    tools = by_name((await provider.list_tools(conn)).tools)
    assert {n: t["access"] for n, t in tools.items()} == {"get_item": "read", "create_item": "write", "peek": "read"}
    got = await provider.call_tool(conn, tools["get_item"], {"store": "s", "item_id": 3, "verbose": False})
    assert got.outcome == "succeeded" and items.seen.requests[-1]["query"] == "verbose=false"
    made = await provider.call_tool(conn, tools["create_item"], {"store": "s", "title": "hello"})
    assert made.outcome == "succeeded" and json.loads(items.seen.requests[-1]["body"]) == {"title": "hello"}
    before = len(items.seen.requests)
    bad = await provider.call_tool(conn, tools["get_item"], {"store": "s"})
    assert bad.outcome == "failed_before_send" and len(items.seen.requests) == before


async def test_github_document_served_by_prism_maps_and_calls(transports: Transports) -> None:
    provider = transports.provider_for("openapi")
    with prism_github() as (url, doc):
        conn = TransportConnection(id="gh", transport="openapi", base_url=url, config={"document": doc},
                                   credential="ghp_canary")  # fmt: skip
        tools = by_name((await provider.list_tools(conn)).tools)
        assert {"repos_get", "issues_create", "issues_list-for-repo", "issues_get", "meta_root"} == set(tools)
        assert tools["issues_create"]["operation_id"] == "issues/create"
        assert tools["issues_create"]["access"] == "write" and tools["repos_get"]["access"] == "read"
        title = tools["issues_create"]["input_schema"]["properties"]["body"]["properties"]["title"]
        assert "oneOf" in title and "$ref" not in json.dumps(tools["issues_create"]["input_schema"])
        listed = tools["issues_list-for-repo"]["input_schema"]["properties"]
        assert {"owner", "repo", "state", "labels", "per_page"} <= set(listed)
        repo = await provider.call_tool(conn, tools["repos_get"], {"owner": "octocat", "repo": "hello"})
        assert repo.outcome == "succeeded", repo.error
        assert repo.result is not None and repo.result["structured_content"]["status"] == 200
        assert "full_name" in repo.result["structured_content"]["body"]
        issue = await provider.call_tool(
            conn, tools["issues_create"], {"owner": "o", "repo": "r", "body": {"title": "x"}}
        )
        assert issue.outcome == "succeeded" and issue.result is not None
        assert issue.result["structured_content"]["status"] == 201
        # Prism validates requests against the document: what the broker built is what GitHub documents.
        bad = await provider.call_tool(conn, tools["issues_list-for-repo"], {"owner": "o", "repo": "r", "state": "x"})
        assert bad.outcome == "failed_before_send", "the frozen enum refused it before sending"


# ---- stdio MCP -------------------------------------------------------------------------------------------------


def everything(marker: str, **config: Any) -> TransportConnection:
    return TransportConnection(
        id=f"c-{marker}",
        transport="stdio",
        base_url=f"stdio://{marker}",
        config={"command": "node", "args": [str(EVERYTHING), "stdio", marker], **config},
        credential="stdio-credential-abcd",
    )


def server_pids(marker: str) -> list[int]:
    """Processes whose argument vector contains ``marker`` as one whole argument."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv and any(a.endswith(b"index.js") for a in argv):
            found.append(int(entry.name))
    return found


async def test_one_lazy_process_per_connection_is_reused_restarted_after_a_crash_and_closed(
    transports: Transports,
) -> None:
    provider = transports.provider_for("stdio")
    assert isinstance(provider, StdioProvider)
    marker = "fbx-reuse-" + os.urandom(4).hex()
    conn = everything(marker)
    assert server_pids(marker) == [], "nothing runs before the first call"
    for i in range(3):
        answer = await provider.call_tool(conn, {"name": "echo"}, {"message": f"m{i}"})
        assert answer.outcome == "succeeded" and answer.result is not None
        assert answer.result["content"][0]["text"] == f"Echo: m{i}"
    pids = server_pids(marker)
    assert len(pids) == 1 and provider.started == 1
    os.kill(pids[0], signal.SIGKILL)
    await eventually(lambda: _gone(pids[0]), timeout=20)
    again = await provider.call_tool(conn, {"name": "echo"}, {"message": "after"})
    assert again.outcome == "succeeded", again.error
    assert provider.started == 2 and server_pids(marker) not in ([], pids)
    await transports.aclose()
    assert await eventually(lambda: _none_left(marker), timeout=20)


async def _gone(pid: int) -> bool:
    try:  # the process may be reaped between any two reads of /proc
        return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, ProcessLookupError):
        return True


async def _none_left(marker: str) -> bool:
    return all([await _gone(p) for p in server_pids(marker)])


async def test_no_shell_interprets_arguments_and_only_the_declared_environment_is_passed(
    transports: Transports,
) -> None:
    provider = transports.provider_for("stdio")
    marker = "; rm -rf / #" + os.urandom(4).hex()
    os.environ["FBX_WORKER_SECRET"] = "worker-only-secret"
    try:
        conn = everything(marker, env={"GREETING": "$(whoami)"}, credential_env="SERVICE_TOKEN")
        echoed = await provider.call_tool(conn, {"name": "echo"}, {"message": "; rm -rf /"})
        assert echoed.result is not None and echoed.result["content"][0]["text"] == "Echo: ; rm -rf /"
        pids = server_pids(marker)
        assert len(pids) == 1, "the marker reached the server as one literal argument"
        env_answer = await provider.call_tool(conn, {"name": "get-env"}, {})
        assert env_answer.result is not None
        env = json.loads(env_answer.result["content"][0]["text"])
        assert env["GREETING"] == "$(whoami)" and env["SERVICE_TOKEN"] == "stdio-credential-abcd"
        assert "FBX_WORKER_SECRET" not in env
    finally:
        del os.environ["FBX_WORKER_SECRET"]


async def test_filesystem_server_over_stdio(transports: Transports, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello from the worker host")
    conn = TransportConnection(
        id="fs", transport="stdio", base_url="stdio://fs",
        config={"command": "node", "args": [str(FILESYSTEM), str(tmp_path)]},
    )  # fmt: skip
    provider = transports.provider_for("stdio")
    names = {t["name"] for t in (await provider.list_tools(conn)).tools}
    assert {"read_text_file", "list_directory"} <= names
    answer = await provider.call_tool(conn, {"name": "read_text_file"}, {"path": str(tmp_path / "notes.txt")})
    assert answer.outcome == "succeeded" and answer.result is not None
    assert "hello from the worker host" in answer.result["content"][0]["text"]


async def test_a_stdio_command_that_does_not_exist_fails_before_send(transports: Transports) -> None:
    conn = TransportConnection(id="x", transport="stdio", base_url="stdio://x",
                               config={"command": "/nonexistent/fbx-server"})  # fmt: skip
    answer = await transports.provider_for("stdio").call_tool(conn, {"name": "t"}, {})
    assert answer.outcome == "failed_before_send"


__all__ = ["httpx"]


async def test_calls_reuse_a_kept_connection_only_to_the_addresses_admission_just_vetted(items: RunningApp) -> None:
    # The connection names a host whose DNS answer the test controls (a rebinding resolver): the app listens
    # on 127.0.0.1 only, so an answer of 127.0.0.2 alone must never reach it.
    answer = ["127.0.0.1"]
    policy = UrlPolicy(allow_loopback=True, resolver=lambda host, port: list(answer) if host == "items.test" else [])
    transports = Transports(TransportDeps(policy))
    provider = transports.provider_for("openapi")
    try:
        photo = await provider.list_tools(openapi_conn(items))
        get = by_name(photo.tools)["getItem"]
        port = items.url.rsplit(":", 1)[1]
        conn = TransportConnection(
            id="c-rebind", transport="openapi", base_url=f"http://items.test:{port}", config={}, credential="tok-1234"
        )

        async def call(item: int) -> str:
            out = await provider.call_tool(conn, get, {"store": "s", "item_id": item})
            assert out.outcome == "succeeded", out.error
            assert out.result["structured_content"]["body"]["item_id"] == item
            seen = items.seen.requests[-1]
            assert seen["path"] == f"/stores/s/items/{item}" and seen["headers"]["host"] == f"items.test:{port}"
            return str(seen["peer"])

        first = await call(1)
        assert [await call(2), await call(3)] == [first, first], "the same vetted address set reuses the connection"

        answer[:] = ["127.0.0.2"]  # rebinding: a kept connection to 127.0.0.1 must not carry this call
        before = items.seen.count()
        out = await provider.call_tool(conn, get, {"store": "s", "item_id": 4})
        assert out.outcome == "failed_before_send" and "127.0.0.2" in (out.error or "")
        assert items.seen.count() == before, "nothing reached the app through the old connection"

        answer[:] = ["127.0.0.1", "127.0.0.3"]  # a different set (even one that includes the old address)
        second = await call(5)
        assert second != first
        assert await call(6) == second

        # Idle kept clients close (their connections with them); the next call opens a fresh one.
        await eventually(lambda: _true(len(provider.clients) == 0), timeout=30, message="the kept client stayed")
        assert await call(7) not in (first, second)
    finally:
        await transports.aclose()
    assert len(provider.clients) == 0, "shutdown closes what is kept"


async def _true(value: bool) -> bool:
    return value
