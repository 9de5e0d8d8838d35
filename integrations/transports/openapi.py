"""``openapi``: an HTTP API described by an OpenAPI 3 document, one tool per operation.

``config``::

    {"document_url": "https://api.example.com/openapi.json",   # fetched (admitted like any outbound URL), or
     "document": {...} | "<JSON or YAML text>",                 # uploaded with the connection
     "include": {"tags": ["issues"], "operations": ["issues/*"]},  # optional: fnmatch patterns on operationId
     "access": {"issues/get-*": "write"},                       # optional: overrides of the default access class
     "auth": {...}}                                             # see integrations.transports._auth

The document is validated with ``openapi-spec-validator`` and its local ``$ref``\\ s resolved with ``prance``.
A client's document is never a fetcher (``integrations.documents``): a ``$ref`` to a file or a URL is refused
before any validation, the validator runs with retrieval handlers that refuse every scheme, YAML aliases are
refused, nesting and size are bounded, and each operation's schema may expand (through local references
nested inside each other) only to ``MAX_SCHEMA_NODES`` values, so a few kilobytes cannot become gigabytes.

Each operation becomes a tool named from its ``operationId`` (characters outside ``[A-Za-z0-9_-]`` become
``_``) whose input schema has one property per path, query and header parameter and ``body`` for a JSON request
body; its default access class comes from the method (GET/HEAD read, everything else write). OpenAPI 3.0's
``nullable`` is translated to a JSON Schema type list so the gate validates what the document means.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import re
from typing import Any, cast

import httpx2
import yaml

from integrations.documents import (
    MAX_DEPTH,
    DocumentError,
    NoRetrieval,
    check_tree,
    load_yaml,
    pointer,
    refuse_external_references,
)
from integrations.mcp_client import Photograph, _describe, _tls_context
from integrations.pinning import PinnedTransport
from integrations.transports import TransportConnection, TransportDeps, TransportError, _http
from integrations.urls import UrlRefused

MAX_DOCUMENT_BYTES = 20 * 1024 * 1024
MAX_OPERATIONS = 512
# Values in one operation's input schema once its references are expanded (GitHub's largest: about 2,000).
MAX_SCHEMA_NODES = 50_000
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_JSON_MEDIA = re.compile(r"^application/([a-z0-9.+-]*\+)?json$")


_FIELDS = {"document_url", "document", "include", "access", "auth", "max_response_bytes", "response_headers"}


def config_problem(config: dict[str, Any]) -> str | None:
    """Why an ``openapi`` configuration is malformed (shapes only), or None."""
    extra = set(config) - _FIELDS
    if extra:
        return f"unknown openapi field(s): {', '.join(sorted(extra))}"
    if (config.get("document") is None) == (config.get("document_url") is None):
        return "an openapi connection needs exactly one of `document_url` or `document`"
    if config.get("document_url") is not None and not isinstance(config["document_url"], str):
        return "`document_url` must be a URL"
    if config.get("document") is not None and not isinstance(config["document"], dict | str):
        return "`document` must be the OpenAPI document (an object, or JSON / YAML text)"
    include = config.get("include")
    if include is not None:
        if not isinstance(include, dict) or set(include) - {"tags", "operations"}:
            return "`include` may only hold `tags` and `operations` (lists of patterns)"
        for key in ("tags", "operations"):
            value = include.get(key)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                return f"`include.{key}` must be a list of strings"
    access = config.get("access")
    if access is not None and (
        not isinstance(access, dict)
        or not all(isinstance(k, str) and v in ("read", "write") for k, v in access.items())
    ):
        return "`access` must map operation patterns to read or write"
    return _http.config_problem(config)


def tool_name(operation_id: str) -> str:
    return _UNSAFE.sub("_", operation_id)[:64]


def load_document(source: dict[str, Any] | str) -> dict[str, Any]:
    """The document as a mapping (uploaded as an object, or as JSON / YAML text)."""
    if isinstance(source, dict):
        return source
    try:
        doc = load_yaml(source)
    except DocumentError as err:
        raise TransportError(f"the OpenAPI document is refused: {err}") from None
    except yaml.YAMLError as err:
        raise TransportError(f"the OpenAPI document is neither JSON nor YAML: {str(err)[:200]}") from None
    if not isinstance(doc, dict):
        raise TransportError("the OpenAPI document must be an object")
    return doc


async def fetch_document(deps: TransportDeps, url: str) -> dict[str, Any]:
    """GET the document from an admitted URL (pinned, no redirects, size-capped)."""
    try:
        admitted = await deps.url_policy.admit(url)
    except UrlRefused as err:
        raise TransportError(f"document_url refused: {err}") from None
    client = httpx2.AsyncClient(
        timeout=httpx2.Timeout(deps.timeout),
        follow_redirects=False,
        trust_env=False,
        verify=_tls_context(),
        transport=PinnedTransport(admitted, verify=_tls_context()),
    )
    raw = bytearray()
    try:
        async with client, client.stream("GET", admitted.url, headers={"Accept": "application/json"}) as response:
            if response.status_code != 200:
                raise TransportError(f"fetching the OpenAPI document answered HTTP {response.status_code}")
            async for chunk in response.aiter_bytes():
                raw.extend(chunk)
                if len(raw) > MAX_DOCUMENT_BYTES:
                    raise TransportError(f"the OpenAPI document is larger than {MAX_DOCUMENT_BYTES} bytes")
    except httpx2.HTTPError as err:
        raise TransportError(f"could not fetch the OpenAPI document: {_describe(err)}") from None
    return load_document(raw.decode("utf-8", errors="replace"))


def resolve_document(doc: dict[str, Any]) -> dict[str, Any]:
    """Validate (openapi-spec-validator), then resolve every local ``$ref`` (prance). Blocking: run in a thread.

    Nothing is fetched or read: references outside the document are refused first, and the validator's
    retrieval handlers refuse every scheme besides. An error names where the document is wrong."""
    # Imported here: they cost most of a second, and only connecting or refreshing an OpenAPI connection needs them.
    from jsonschema_path import SchemaPath
    from openapi_spec_validator.shortcuts import get_validator_cls
    from openapi_spec_validator.validation.exceptions import OpenAPIValidationError
    from prance.util.resolver import RESOLVE_INTERNAL, RefResolver

    try:
        check_tree(doc, what="the OpenAPI document")
        refuse_external_references(doc)
    except DocumentError as err:
        raise TransportError(f"the OpenAPI document is refused: {err}") from None
    version = str(doc.get("openapi", ""))
    if not version.startswith("3."):
        raise TransportError("only OpenAPI 3.x documents are supported (no `openapi: 3.x` field)")
    try:
        validator = get_validator_cls(cast(Any, doc))
        validator(SchemaPath.from_dict(cast(Any, doc), handlers=NoRetrieval())).validate()
    except OpenAPIValidationError as err:
        raise TransportError(f"invalid OpenAPI document at {pointer(tuple(err.absolute_path))}: {_rule(err)}") from None
    except DocumentError as err:
        raise TransportError(f"the OpenAPI document is refused: {err}") from None
    except Exception as err:  # the validator's own failures on unreadable input
        raise TransportError(f"invalid OpenAPI document: {type(err).__name__}") from None
    resolver = RefResolver(
        json.loads(json.dumps(doc)),
        "file:///openapi.json",
        resolve_types=RESOLVE_INTERNAL,
        # A recursive schema (a tree of comments...) stops at its second visit with an open object.
        recursion_limit_handler=lambda *_: {},
    )
    try:
        resolver.resolve_references()
    except Exception as err:
        raise TransportError(f"cannot resolve the OpenAPI document's references: {str(err)[:300]}") from None
    return dict(resolver.specs)


def _rule(err: Any) -> str:
    """Which rule of the OpenAPI schema a value breaks, without quoting the value (it may be large)."""
    rule, expected = str(err.validator), err.validator_value
    if rule in ("required", "additionalProperties", "unevaluatedProperties"):
        return str(err.message).split("\n", 1)[0][:200]  # names properties, not values
    if rule in ("type", "enum", "const", "format", "pattern") and len(json.dumps(expected, default=str)) <= 120:
        return f"does not satisfy `{rule}` {json.dumps(expected, default=str)}"
    return f"does not satisfy `{rule}` of the OpenAPI schema"


class _Budget:
    """How many more values one operation's schema may expand to."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.left = MAX_SCHEMA_NODES

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise TransportError(
                f"the input schema of operation '{self.name}' expands past {MAX_SCHEMA_NODES} values "
                "(references nested in references): simplify it or leave the operation out with `include`"
            )


def _json_schema(node: Any, openapi_30: bool, budget: _Budget, depth: int = 0) -> Any:
    """OpenAPI 3.0 schema dialect → JSON Schema: ``nullable`` becomes a ``null`` type.

    The resolved document shares one object per referenced schema; this copy expands them, so it spends
    ``budget`` as it goes and stops at ``MAX_DEPTH`` levels (a chain of references nests a level each)."""
    budget.take()
    if depth > MAX_DEPTH:
        raise TransportError(f"the input schema of operation '{budget.name}' nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, list):
        return [_json_schema(v, openapi_30, budget, depth + 1) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: _json_schema(v, openapi_30, budget, depth + 1)
        for k, v in node.items()
        if k not in ("nullable", "example", "xml")
    }
    if openapi_30 and node.get("nullable") is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        elif "type" not in out and ("oneOf" in out or "anyOf" in out):
            key = "oneOf" if "oneOf" in out else "anyOf"
            out[key] = [*out[key], {"type": "null"}]
    return out


def _matches(patterns: list[str], value: str) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def operation_tools(resolved: dict[str, Any], config: dict[str, Any]) -> list[dict[str, Any]]:
    """One tool per (filtered) operation of a resolved document."""
    include = config.get("include") or {}
    tags, ops = list(include.get("tags") or []), list(include.get("operations") or [])
    overrides: dict[str, str] = dict(config.get("access") or {})
    openapi_30 = str(resolved.get("openapi", "")).startswith("3.0")
    tools: dict[str, dict[str, Any]] = {}
    for path, item in (resolved.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        shared = [p for p in item.get("parameters", []) if isinstance(p, dict)]
        for method, op in item.items():
            if method.upper() not in _http.HTTP_METHODS or not isinstance(op, dict):
                continue
            op_id = str(op.get("operationId") or f"{method}_{path}")
            if tags and not set(op.get("tags") or []) & set(tags):
                continue
            if ops and not _matches(ops, op_id):
                continue
            name = tool_name(op_id)
            if name in tools:
                raise TransportError(f"two operations map to the tool name '{name}'")
            tool = _operation_tool(name, op_id, method.upper(), path, shared, op, openapi_30)
            if tool is None:
                continue
            for pattern, access in overrides.items():
                if _matches([pattern], op_id) or _matches([pattern], name):
                    tool["access"] = access
            tools[name] = tool
            if len(tools) > MAX_OPERATIONS:
                raise TransportError(f"more than {MAX_OPERATIONS} operations: filter them with `include`")
    if not tools:
        raise TransportError("the OpenAPI document has no operation left after filtering")
    return [tools[n] for n in sorted(tools)]


def _operation_tool(
    name: str, op_id: str, method: str, path: str, shared: list[dict[str, Any]], op: dict[str, Any], v30: bool
) -> dict[str, Any] | None:
    budget = _Budget(op_id)
    params: dict[tuple[str, str], dict[str, Any]] = {(p["in"], p["name"]): p for p in shared if "name" in p}
    params |= {(p["in"], p["name"]): p for p in op.get("parameters", []) if isinstance(p, dict) and "name" in p}
    properties: dict[str, Any] = {}
    required: list[str] = []
    wire: list[dict[str, str]] = []
    for (where, pname), p in sorted(params.items(), key=lambda kv: (kv[0][0] != "path", kv[0])):
        if where not in ("path", "query", "header"):
            continue  # cookie parameters are never sent by the broker
        arg = pname if pname not in properties else f"{where}_{pname}"
        schema = p.get("schema")
        if schema is None and isinstance(p.get("content"), dict) and p["content"]:
            schema = next(iter(p["content"].values())).get("schema")
        schema = _json_schema(schema or {}, v30, budget)
        if p.get("description") and isinstance(schema, dict) and "description" not in schema:
            schema = {**schema, "description": p["description"]}
        properties[arg] = schema
        if p.get("required") or where == "path":
            required.append(arg)
        wire.append({"name": pname, "in": where, "arg": arg})
    body_arg: str | None = None
    media_type: str | None = None
    body = op.get("requestBody")
    if isinstance(body, dict) and isinstance(body.get("content"), dict):
        media = [m for m in body["content"] if _JSON_MEDIA.match(m.split(";")[0].strip())]
        if not media:
            return None  # only JSON request bodies are brokered; other operations are left out
        media_type = media[0]
        body_arg = "body" if "body" not in properties else "request_body"
        properties[body_arg] = _json_schema(body["content"][media_type].get("schema") or {}, v30, budget)
        if body.get("required"):
            required.append(body_arg)
    description = str(op.get("summary") or op.get("description") or f"{method} {path}")
    return {
        "name": name,
        "description": description[:1024],
        "input_schema": {"type": "object", "properties": properties, "required": required,
                         "additionalProperties": False},
        "access": _http.default_access(method),
        "operation_id": op_id,
        "request": {"method": method, "path": path, "params": wire, "body": body_arg, "media_type": media_type},
    }  # fmt: skip


def server_url(resolved: dict[str, Any]) -> str | None:
    servers = resolved.get("servers") or []
    if servers and isinstance(servers[0], dict) and isinstance(servers[0].get("url"), str):
        url = str(servers[0]["url"])
        return url if "://" in url else None
    return None


class OpenApiProvider(_http.KeptClientsProvider):
    """Photographing reads (and fetches) the document; calls send the frozen request recipe."""

    async def document(self, config: dict[str, Any]) -> dict[str, Any]:
        if config.get("document") is not None:
            return load_document(config["document"])
        if isinstance(config.get("document_url"), str):
            return await fetch_document(self.deps, config["document_url"])
        raise TransportError("an openapi connection needs `document_url` or `document`")

    async def list_tools(self, conn: TransportConnection) -> Photograph:
        doc = await self.document(conn.config)
        resolved = await asyncio.to_thread(resolve_document, doc)
        tools = operation_tools(resolved, conn.config)
        return Photograph(protocol_version=f"openapi {resolved['openapi']}", tools=tools)
