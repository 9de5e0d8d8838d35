"""``mcp_http``: MCP over Streamable HTTP, through :mod:`integrations.mcp_client` and the kept-open pool."""

from __future__ import annotations

from typing import Any

from integrations import mcp_client
from integrations.headers import auth_headers
from integrations.mcp_client import CallOutcome, Photograph
from integrations.transports import TransportConnection, TransportDeps
from integrations.urls import UrlRefused


def mcp_headers(conn: TransportConnection) -> dict[str, str]:
    if not conn.credential:
        return {}
    if conn.auth_kind == "oauth":
        return auth_headers(conn.credential, header_name=None, scheme="Bearer")
    return auth_headers(conn.credential, header_name=conn.header_name, scheme=conn.scheme)


class McpHttpProvider:
    """Photographs over a fresh session; calls through the pool when the process has one."""

    def __init__(self, deps: TransportDeps) -> None:
        self.deps = deps

    async def list_tools(self, conn: TransportConnection) -> Photograph:
        try:
            admitted = await self.deps.url_policy.admit(conn.base_url)
        except UrlRefused as err:
            raise mcp_client.Unreachable(str(err)) from None
        return await mcp_client.photograph(admitted.url, mcp_headers(conn), pin=admitted)

    async def call_tool(
        self, conn: TransportConnection, tool: dict[str, Any], arguments: dict[str, Any]
    ) -> CallOutcome:
        try:
            # Admitted again right before connecting: a name that now resolves somewhere forbidden is refused
            # with nothing sent, and the call connects only to the addresses vetted here (pinned).
            admitted = await self.deps.url_policy.admit(conn.base_url)
        except UrlRefused as err:
            return CallOutcome(outcome="failed_before_send", result=None, error=str(err))
        pool = self.deps.pool
        call = pool.call_tool if pool is not None else mcp_client.call_tool
        return await call(
            admitted.url,
            mcp_headers(conn),
            str(tool["name"]),
            arguments,
            expected_protocol=conn.protocol_version,
            pin=admitted,
        )

    async def close(self) -> None:
        """The pool belongs to the process (the worker closes it); nothing of its own to release."""
