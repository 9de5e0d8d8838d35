"""Dynamic connections: an agent proposes a new URL-backed connection during a run (pure checks).

Off by default; an agent revision turns it on with ``harness_config.dynamic_connections``::

    {"enabled": true, "allowedHosts": ["api.example.com", "*.example.org"], "require_approval": true}

A proposal names only a transport (``mcp_http``, ``openapi`` or ``http``), a URL and a display name. It can
never carry a command, arguments, an environment, a working directory, a relay credential or any other
secret: credentials only ever arrive through the authorization flows (OAuth sign-in, an admin's token), so a
proposal carrying one is refused with the reason. Its host must be one of the agent's ``allowedHosts`` (an
exact name, or ``*.`` + a domain for its subdomains). Saving it goes through the gate as the tool
``ProposeConnection`` and, unless the agent sets ``require_approval: false``, waits for a human approval even
when the policy allows it. A saved proposal is a ``pending`` connection: nothing can bind to it until a human
authorizes it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from core.errors import BadRequest, Forbidden

PROPOSE_CONNECTION = "ProposeConnection"
# How a model harness offers the proposal to the model (the Claude harness: ``mcp__fluidbox__propose_connection``).
PROPOSAL_SERVER = "fluidbox"
PROPOSAL_TOOL = {
    "name": "propose_connection",
    "description": (
        "Propose a new URL-backed connection (MCP server, OpenAPI or HTTP API) for a human to approve. "
        "Never include credentials: a human authorizes the connection after approving it."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "transport": {"type": "string", "enum": ["mcp_http", "openapi", "http"]},
            "base_url": {"type": "string"},
            "display_name": {"type": "string"},
        },
        "required": ["base_url"],
        "additionalProperties": False,
    },
}
TRANSPORTS = ("mcp_http", "openapi", "http")
ALLOWED_FIELDS = frozenset({"transport", "base_url", "display_name"})
# Fields that would smuggle a process or a secret in; each is refused by name, with the reason.
_LAUNCH = frozenset({"command", "args", "argv", "env", "environment", "cwd", "working_directory", "workdir"})
_SECRET_WORDS = re.compile(r"token|secret|password|passwd|credential|api[_-]?key|apikey|auth|cookie|bearer|sig", re.I)
_HOST_PATTERN = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$")


def settings(harness_config: dict[str, Any]) -> dict[str, Any]:
    """The agent's dynamic-connection settings as frozen in the RunSpec (``{}`` when off)."""
    found = harness_config.get("dynamic_connections")
    return dict(found) if isinstance(found, dict) else {}


def enabled(harness_config: dict[str, Any]) -> bool:
    return bool(settings(harness_config).get("enabled"))


def check_allowed_hosts(hosts: list[str]) -> list[str]:
    """Normalized ``allowedHosts``; ValueError naming a malformed entry."""
    out = []
    for host in hosts:
        norm = host.strip().lower().rstrip(".")
        if not _HOST_PATTERN.match(norm):
            raise ValueError(f"allowedHosts entry {host!r} is not a host name (or *.domain)")
        out.append(norm)
    return out


def host_allowed(host: str, allowed: list[str]) -> bool:
    host = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.lower()
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and host != entry[2:]:
                return True
        elif host == entry:
            return True
    return False


def check_proposal(harness_config: dict[str, Any], proposal: Any) -> dict[str, str]:
    """The normalized proposal ``{transport, base_url, display_name}``, or a refusal naming why.

    Raises:
        Forbidden: dynamic connections are off for this agent.
        BadRequest: a launch field or a secret, an unknown field, a transport that is not URL-backed, a URL
            that is not plain http(s) or that carries credentials, or a host outside ``allowedHosts``.
    """
    conf = settings(harness_config)
    if not conf.get("enabled"):
        raise Forbidden("dynamic connections are off for this agent (harness_config.dynamic_connections.enabled)")
    if not isinstance(proposal, dict):
        raise BadRequest("a connection proposal is an object {transport, base_url, display_name?}")
    launch = sorted(k for k in proposal if k.lower() in _LAUNCH)
    if launch:
        raise BadRequest(
            f"a proposed connection can never carry {', '.join(launch)}: only URL-backed connections can be "
            "proposed, and local processes are configured by an administrator"
        )
    secret = sorted(k for k in proposal if _SECRET_WORDS.search(k) or k.lower() in ("headers", "relay"))
    if secret:
        raise BadRequest(
            f"a proposed connection can never carry a secret ({', '.join(secret)}): credentials are granted "
            "through the authorization flow after a human approves the connection"
        )
    unknown = sorted(set(proposal) - ALLOWED_FIELDS)
    if unknown:
        raise BadRequest(
            f"unknown field(s) in the proposal: {', '.join(unknown)} (allowed: transport, base_url, display_name)"
        )
    transport = proposal.get("transport", "mcp_http")
    if transport not in TRANSPORTS:
        raise BadRequest(
            f"transport {transport!r} cannot be proposed: only URL-backed {', '.join(TRANSPORTS)} connections "
            "(never stdio, relay or sandbox_cli)"
        )
    url = proposal.get("base_url")
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise BadRequest("a proposal needs a `base_url` (an http(s) URL of at most 2048 characters)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest("a proposed `base_url` must be an http(s) URL with a host")
    if parts.username is not None or parts.password is not None:
        raise BadRequest("a proposed `base_url` can never carry a secret (user:password@ in the URL)")
    leaked = sorted({k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_WORDS.search(k)})
    if leaked or parts.fragment:
        raise BadRequest(
            "a proposed `base_url` can never carry a secret "
            f"({'query parameter ' + ', '.join(leaked) if leaked else 'a fragment'})"
        )
    allowed = [str(h) for h in conf.get("allowedHosts") or []]
    if not host_allowed(parts.hostname, allowed):
        raise BadRequest(
            f"host {parts.hostname!r} is not in this agent's allowedHosts ({', '.join(allowed) or 'none'})"
        )
    name = proposal.get("display_name")
    if name is not None and (not isinstance(name, str) or len(name) > 200):
        raise BadRequest("`display_name` is a string of at most 200 characters")
    return {"transport": transport, "base_url": url, "display_name": name or url}


def requires_approval(harness_config: dict[str, Any]) -> bool:
    return settings(harness_config).get("require_approval", True) is not False
