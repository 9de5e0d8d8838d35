"""Checking connector catalog entries, whatever their transport (the shipped file and custom entries alike).

An entry names the ``transport`` that speaks to its server (the same names as a connection's, plus
``streamable_http``, the catalog's older spelling of ``mcp_http``) and what that transport needs:

==============  ===========================================================================================
transport       the entry needs
==============  ===========================================================================================
mcp_http        ``url`` (an entry without one is listed, not connectable)
openapi         ``url`` (or a document naming its server) and ``transport_config`` (the document, its auth)
http            ``url`` and ``transport_config.endpoints``
stdio           ``sandbox_launch`` (a server inside the sandbox) or ``transport_config.command`` (a server
                on the worker hosts): catalog entries are trusted configuration, so they may name a command
relay           an ``https`` ``url``, ``auth_mode: api_key`` (the relay credential is given as ``token`` when
                the entry is connected, then sealed) and optional ``transport_config: {timeout_s, ca_pem}``
sandbox_cli     a ``sandbox-cli://<name>`` ``url``, ``auth_mode: none`` (these tools never carry a
                credential) and ``transport_config.tools``: each tool's command, argument template and schema
==============  ===========================================================================================

:func:`check_entry` answers the first problem as one sentence naming the entry, or the entry with its transport
configuration normalized. The URL policy (admission) is the caller's: the shipped file is checked at boot, a
custom entry when it is posted.
"""

from __future__ import annotations

from typing import Any

from core.errors import BadRequest
from core.sandbox_cli import check_tools
from integrations.transports.openapi import config_problem as openapi_problem
from integrations.transports.relay import RelayConfigError
from integrations.transports.relay import check_config as relay_config
from integrations.transports.stdio import validate_config as stdio_problem

CATALOG_TRANSPORTS = ("streamable_http", "mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli")
SANDBOX_CLI_SCHEME = "sandbox-cli://"


class CatalogEntryError(ValueError):
    """A catalog entry its transport cannot use (the message names the entry and the problem)."""


def check_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with its ``transport_config`` normalized; :class:`CatalogEntryError` naming the first problem."""
    slug = entry.get("slug") or "?"
    transport = entry.get("transport") or "streamable_http"
    where = f"catalog entry '{slug}' ({transport})"

    def refuse(problem: str) -> CatalogEntryError:
        return CatalogEntryError(f"{where}: {problem}")

    if transport not in CATALOG_TRANSPORTS:
        raise refuse(f"unknown transport (known: {', '.join(CATALOG_TRANSPORTS)})")
    url = entry.get("url")
    config = entry.get("transport_config")
    if config is not None and not isinstance(config, dict):
        raise refuse("`transport_config` must be an object")
    auth_mode = entry.get("auth_mode") or "api_key"
    if transport != "stdio" and entry.get("sandbox_launch"):
        raise refuse("`sandbox_launch` applies to stdio entries only")
    out = dict(entry, transport=transport)
    if transport in ("streamable_http", "mcp_http"):
        if config:
            raise refuse("an MCP-over-HTTP entry takes no `transport_config`")
    elif transport == "openapi":
        if config is None:
            raise refuse("needs `transport_config` (document_url or document, and its auth)")
        if problem := openapi_problem(config):
            raise refuse(problem)
    elif transport == "http":
        if not url:
            raise refuse("needs the API's base `url`")
        if config is None or not isinstance(config.get("endpoints"), list) or not config["endpoints"]:
            raise refuse("needs `transport_config.endpoints` (method, path, arguments, access)")
    elif transport == "stdio":
        if config is not None and entry.get("sandbox_launch"):
            raise refuse("give `sandbox_launch` (inside the sandbox) or `transport_config` (worker hosts), not both")
        if config is not None and (problem := stdio_problem(config)):
            raise refuse(problem)
    elif transport == "relay":
        if auth_mode != "api_key":
            raise refuse(
                "a relay entry needs `auth_mode: api_key`: the relay's credential is given as `token` when the "
                "entry is connected, and sealed"
            )
        if not url:
            raise refuse("needs the relay's https `url`")
        try:
            out["transport_config"] = relay_config(url, config)
        except RelayConfigError as err:
            raise refuse(str(err)) from None
    else:  # sandbox_cli
        out["transport_config"] = _sandbox_cli(url, config, auth_mode, refuse)
    return out


def _sandbox_cli(url: Any, config: dict[str, Any] | None, auth_mode: str, refuse: Any) -> dict[str, Any]:
    if auth_mode != "none":
        raise refuse(
            "a sandbox_cli entry needs `auth_mode: none`: its tools run inside the sandbox, which never holds a "
            "credential (a CLI that needs one belongs behind a brokered transport)"
        )
    name = (
        url[len(SANDBOX_CLI_SCHEME) :].strip("/") if isinstance(url, str) and url.startswith(SANDBOX_CLI_SCHEME) else ""
    )
    if not name:
        raise refuse("needs a `url` of the form sandbox-cli://<name> (what agents' requirements name)")
    extra = sorted(set(config or {}) - {"tools"})
    if extra:
        raise refuse(f"unknown sandbox_cli setting(s): {', '.join(extra)} (a sandbox_cli entry takes `tools` only)")
    try:
        return {"tools": check_tools((config or {}).get("tools"))}
    except BadRequest as err:
        raise refuse(str(err)) from None


def check_entries(entries: Any) -> list[dict[str, Any]]:
    """Every entry of a catalog file checked (:func:`check_entry`), and slugs unique."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CatalogEntryError("a catalog file is a list of entries (objects)")
    seen: set[str] = set()
    for entry in entries:
        slug = entry.get("slug")
        if not isinstance(slug, str) or not slug:
            raise CatalogEntryError("every catalog entry needs a `slug`")
        if slug in seen:
            raise CatalogEntryError(f"catalog entry '{slug}' appears twice")
        seen.add(slug)
    return [check_entry(e) for e in entries]


__all__ = ["CATALOG_TRANSPORTS", "CatalogEntryError", "check_entries", "check_entry"]
