"""An auth definition (never a secret) applied to one request with the connection's credential.

``config["auth"]`` of an ``openapi`` or ``http`` connection::

    {"type": "bearer"}                                   Authorization: Bearer <credential>
    {"type": "basic"}                                    Authorization: Basic base64(<user:password>)
    {"type": "api_key", "in": "header", "name": "X-Key"} X-Key: <credential>
    {"type": "api_key", "in": "query", "name": "key"}    ?key=<credential>
    {"type": "oauth"}                                    Authorization: Bearer <access token of the OAuth connect>
    {"type": "none"}                                     nothing

Without one, the connection's ``header_name`` / ``scheme`` columns apply (as for MCP connections).
"""

from __future__ import annotations

from typing import Any

from integrations.headers import auth_headers, header_credential_problem
from integrations.transports import TransportConnection

AUTH_TYPES = ("bearer", "basic", "api_key", "oauth", "none")


def auth_definition(conn: TransportConnection) -> dict[str, Any]:
    auth = conn.config.get("auth")
    if isinstance(auth, dict) and auth.get("type") in AUTH_TYPES:
        return auth
    if conn.auth_kind == "oauth":
        return {"type": "oauth"}
    if conn.scheme == "Basic":
        return {"type": "basic"}
    if conn.header_name:
        return {"type": "api_key", "in": "header", "name": conn.header_name, "scheme": conn.scheme}
    return {"type": "bearer"}


def reserved_names(auth: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Header names (lower case) and query names an argument may never set: they carry the credential."""
    if auth.get("type") == "none":
        return set(), set()
    if auth.get("type") == "api_key":
        if auth.get("in") == "query":
            return set(), {str(auth.get("name"))}
        return {str(auth.get("name", "")).lower()}, set()
    return {"authorization"}, set()


def credential_parts(conn: TransportConnection) -> tuple[dict[str, str], dict[str, str]]:
    """The headers and query parameters that carry the credential for one request."""
    auth = auth_definition(conn)
    kind = auth["type"]
    token = conn.credential
    if kind == "none" or not token:
        return {}, {}
    if kind == "api_key":
        name = str(auth.get("name") or "")
        if auth.get("in") == "query":
            return {}, {name: token}
        return auth_headers(token, header_name=name, scheme=str(auth.get("scheme", ""))), {}
    if kind == "basic":
        return auth_headers(token, header_name=None, scheme="Basic"), {}
    return auth_headers(token, header_name=None, scheme="Bearer"), {}


def credential_problem(conn: TransportConnection) -> str | None:
    """Why the connection's credential cannot be sent the way its auth definition sends it, or None."""
    auth = auth_definition(conn)
    kind, token = auth["type"], conn.credential
    if not token or kind in ("none", "basic") or (kind == "api_key" and auth.get("in") == "query"):
        return None  # nothing sent, base64, or percent-encoded into the query
    if kind == "api_key":
        name, scheme = str(auth.get("name") or ""), str(auth.get("scheme", ""))
        return header_credential_problem(token, header_name=name, scheme=scheme)
    return header_credential_problem(token, header_name=None, scheme="Bearer")


def validate_auth(auth: Any) -> str | None:
    """Why an auth definition is malformed, or None."""
    if auth is None:
        return None
    if not isinstance(auth, dict) or auth.get("type") not in AUTH_TYPES:
        return f"`auth.type` must be one of {', '.join(AUTH_TYPES)}"
    if auth["type"] == "api_key":
        if auth.get("in") not in ("header", "query"):
            return "an api_key auth needs `in`: header or query"
        name = auth.get("name")
        if (
            not isinstance(name, str)
            or not name
            or len(name) > 64
            or not name.replace("-", "").replace("_", "").isalnum()
        ):
            return "an api_key auth needs a `name` (letters, digits, - and _)"
    extra = set(auth) - {"type", "in", "name", "scheme"}
    if extra:
        return f"unknown auth field(s): {', '.join(sorted(extra))}"
    return None
