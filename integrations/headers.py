"""How a stored credential becomes request headers for an MCP server (static auth)."""

from __future__ import annotations

import base64


def auth_headers(token: str, *, header_name: str | None, scheme: str) -> dict[str, str]:
    """``Authorization: Bearer <t>`` by default; a custom header carries the bare token (or with the
    scheme when one is given); ``Basic`` expects ``email:api_token`` and encodes it."""
    if scheme == "Basic":
        value = "Basic " + base64.b64encode(token.encode()).decode()
    elif scheme:
        value = f"{scheme} {token}"
    else:
        value = token
    return {header_name or "Authorization": value}
