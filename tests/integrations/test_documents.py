"""A client's document is never a fetcher: OpenAPI ``$ref``\\ s to files and URLs, ``$id`` base tricks, YAML
alias bombs, deep nesting and reference bombs, each against the real OpenAPI provider and validator."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integrations.documents import DocumentError, check_tree, load_yaml
from integrations.transports import TransportConnection, TransportDeps, TransportError
from integrations.transports.openapi import (
    MAX_SCHEMA_NODES,
    OpenApiProvider,
    load_document,
    operation_tools,
    resolve_document,
)
from integrations.urls import UrlPolicy

CANARY = "fbx_admin_CANARY-0b5e7d"


class Hits:
    """A loopback HTTP listener that answers every GET with a JSON schema and counts the requests."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        hits = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.paths.append(self.path)
                body = json.dumps({"type": "string", "description": CANARY}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def listener() -> Iterator[Hits]:
    hits = Hits()
    thread = threading.Thread(target=hits.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hits
    finally:
        hits.server.shutdown()
        hits.server.server_close()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text(json.dumps(CANARY))
    return path


def document(schema: Any, version: str = "3.0.3") -> dict[str, Any]:
    """One GET operation whose query parameter has ``schema``."""
    return {
        "openapi": version,
        "info": {"title": "t", "version": "1"},
        "paths": {
            "/a": {
                "get": {
                    "operationId": "a",
                    "parameters": [{"name": "q", "in": "query", "schema": schema}],
                    "responses": {"200": {"description": "ok"}},
                }
            }
        },
    }


def refused(doc: dict[str, Any]) -> str:
    with pytest.raises(TransportError) as caught:
        resolve_document(doc)
    return str(caught.value)


def test_a_ref_to_a_host_file_is_refused_before_validation_and_its_content_never_comes_back(
    secret_file: Path,
) -> None:
    for ref in (f"file://{secret_file}", str(secret_file), "admin-token", f"{secret_file}#/x"):
        message = refused(document({"$ref": ref}))
        assert "does not point inside the document" in message, message
        assert "#/paths/~1a/get/parameters/0/schema" in message
        assert CANARY not in message and str(secret_file) not in message


def test_a_ref_to_a_url_is_never_fetched(listener: Hits) -> None:
    for ref in (f"{listener.url}/schema.json", f"{listener.url}/s.json#/definitions/x", "//127.0.0.1/x"):
        message = refused(document({"$ref": ref}))
        assert "only local references" in message
    refused(document({"$dynamicRef": f"{listener.url}/d.json"}, version="3.1.0"))
    assert listener.paths == []


@pytest.mark.parametrize("version", ["3.0.3", "3.1.0"])
def test_an_id_cannot_turn_a_local_ref_into_a_fetch(listener: Hits, secret_file: Path, version: str) -> None:
    """``$id`` changes the base a ``#`` reference resolves against: the validator still fetches nothing."""
    for base in (f"{listener.url}/base.json", f"file://{secret_file}"):
        doc = document({"$id": base, "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}, version)
        try:
            resolve_document(doc)
        except TransportError as err:
            assert CANARY not in str(err)
    assert listener.paths == []


def test_a_yaml_alias_bomb_is_refused_without_expanding() -> None:
    levels = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 10)}]" for i in range(8)]
    bomb = "\n".join(levels)
    assert len(bomb) < 500
    with pytest.raises(TransportError, match=r"YAML aliases \(\*name\) are not accepted \(line 2\)"):
        load_document(bomb)
    with pytest.raises(DocumentError, match="aliases"):
        load_yaml(bomb)


def test_deep_yaml_and_deep_json_trees_are_refused_with_a_reason_not_a_crash() -> None:
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(TransportError, match="nests deeper than 64 levels"):
        load_document(deep)
    tree: Any = "leaf"
    for _ in range(5000):
        tree = {"a": tree}
    with pytest.raises(DocumentError, match="nests deeper than 64 levels"):
        check_tree(tree)
    assert "nests deeper" in refused({"openapi": "3.0.3", "x": tree})


def test_yaml_dates_stay_strings_so_a_document_round_trips_through_json() -> None:
    assert load_yaml("released: 2024-01-01\nat: 2024-01-01T10:00:00Z\n") == {
        "released": "2024-01-01",
        "at": "2024-01-01T10:00:00Z",
    }


def test_nested_local_refs_that_expand_past_the_budget_are_refused() -> None:
    """Ten properties per level, each a reference to the next level: 4 KB that would photograph as gigabytes."""
    levels = 8
    schemas: dict[str, Any] = {
        f"S{i}": {
            "type": "object",
            "properties": {f"p{j}": {"$ref": f"#/components/schemas/S{i + 1}"} for j in range(10)},
        }
        for i in range(levels)
    }
    schemas[f"S{levels}"] = {"type": "string"}
    doc = document({"$ref": "#/components/schemas/S0"})
    doc["components"] = {"schemas": schemas}
    assert len(json.dumps(doc)) < 5000
    resolved = resolve_document(doc)
    with pytest.raises(TransportError, match=f"operation 'a' expands past {MAX_SCHEMA_NODES} values"):
        operation_tools(resolved, {})


def test_a_chain_of_references_deeper_than_the_bound_is_refused() -> None:
    schemas = {
        f"S{i}": {"type": "object", "properties": {"n": {"$ref": f"#/components/schemas/S{i + 1}"}}} for i in range(300)
    }
    schemas["S300"] = {"type": "string"}
    doc = document({"$ref": "#/components/schemas/S0"})
    doc["components"] = {"schemas": schemas}
    with pytest.raises(TransportError, match="nests deeper than 64 levels"):
        operation_tools(resolve_document(doc), {})


def test_a_validation_error_names_the_place_and_rule_without_quoting_the_value() -> None:
    message = refused(document("s" * 5000))
    assert message.startswith("invalid OpenAPI document at #/paths/~1a/get/parameters/0")
    assert "s" * 100 not in message and len(message) < 400


async def test_the_provider_refuses_a_file_ref_in_an_uploaded_document(secret_file: Path) -> None:
    provider = OpenApiProvider(TransportDeps(UrlPolicy(allow_loopback=True)))
    doc = document({"$ref": f"file://{secret_file}"})
    for source in (doc, json.dumps(doc)):
        conn = TransportConnection(
            id="c", transport="openapi", base_url="http://127.0.0.1:1", config={"document": source}
        )
        with pytest.raises(TransportError) as caught:
            await provider.list_tools(conn)
        assert CANARY not in str(caught.value)
