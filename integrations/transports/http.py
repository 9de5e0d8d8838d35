"""``http``: an HTTP API without an OpenAPI document, described by a declared list of endpoints.

``config``::

    {"endpoints": [{"name": "get_item", "description": "...", "method": "GET", "path": "/items/{id}",
                    "arguments": {<JSON Schema of an object>}, "access": "read"}],
     "auth": {...}}                     # see integrations.transports._auth

Path placeholders take the argument of the same name; the remaining arguments go to the query string for
GET, HEAD and DELETE and to the JSON body otherwise. ``access`` defaults from the method (GET/HEAD read).
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from integrations.mcp_client import Photograph
from integrations.transports import TransportConnection, TransportError, _http

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_]+)\}")
MAX_ENDPOINTS = 256


def endpoint_tools(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools of a declared endpoint list; :class:`TransportError` names the first problem."""
    problem = _http.config_problem(config)
    if problem is not None:
        raise TransportError(problem)
    endpoints = config.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints or len(endpoints) > MAX_ENDPOINTS:
        raise TransportError(f"`endpoints` must list 1 to {MAX_ENDPOINTS} endpoints")
    tools: dict[str, dict[str, Any]] = {}
    for i, ep in enumerate(endpoints):
        if not isinstance(ep, dict):
            raise TransportError(f"endpoints[{i}] must be an object")
        name, method, path = ep.get("name"), str(ep.get("method", "")).upper(), ep.get("path")
        if not isinstance(name, str) or not NAME.match(name):
            raise TransportError(f"endpoints[{i}].name must be 1-64 letters, digits, - or _")
        if name in tools:
            raise TransportError(f"endpoint '{name}' is declared twice")
        if method not in _http.HTTP_METHODS:
            raise TransportError(f"endpoint '{name}': method must be one of {', '.join(_http.HTTP_METHODS)}")
        if not isinstance(path, str) or not path.startswith("/") or "://" in path:
            raise TransportError(f"endpoint '{name}': path must be a template starting with '/'")
        schema = ep.get("arguments") or {"type": "object", "properties": {}, "additionalProperties": False}
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise TransportError(f"endpoint '{name}': arguments must be a JSON Schema of type object")
        try:
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
        except jsonschema.SchemaError as err:
            raise TransportError(f"endpoint '{name}': arguments is not a valid JSON Schema: {err.message}") from None
        access = ep.get("access") or _http.default_access(method)
        if access not in ("read", "write"):
            raise TransportError(f"endpoint '{name}': access must be read or write")
        placeholders = PLACEHOLDER.findall(path)
        props = schema.get("properties", {})
        missing = [p for p in placeholders if p not in props]
        if missing:
            raise TransportError(f"endpoint '{name}': path placeholder(s) without an argument: {', '.join(missing)}")
        rest = "query" if method in ("GET", "HEAD", "DELETE") else "body"
        params = [{"name": p, "in": "path", "arg": p} for p in placeholders]
        request: dict[str, Any] = {"method": method, "path": path, "params": params, "body": None}
        if rest == "body":
            request["body"] = "*"  # every argument not in the path template
        if rest == "query":
            params += [{"name": k, "in": "query", "arg": k} for k in sorted(props) if k not in placeholders]
        tools[name] = {
            "name": name,
            "description": str(ep.get("description") or f"{method} {path}"),
            "input_schema": schema,
            "access": access,
            "request": request,
        }
    return [tools[n] for n in sorted(tools)]


class HttpProvider(_http.KeptClientsProvider):
    """Declared endpoints: photographing reads the declaration (no request); calls go through ``_http``."""

    async def list_tools(self, conn: TransportConnection) -> Photograph:
        tools = endpoint_tools(conn.config)
        return Photograph(protocol_version="http", tools=tools)


__all__ = ["HttpProvider", "endpoint_tools"]
