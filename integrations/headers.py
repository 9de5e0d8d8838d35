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


def header_credential_problem(token: str, *, header_name: str | None, scheme: str) -> str | None:
    """Why ``token`` cannot travel in the header :func:`auth_headers` makes of it (None: it can). A header value is
    printable ASCII (HTTP clients encode it so, and a line break would end it); ``Basic`` is base64 of any text."""
    if scheme == "Basic" or all(" " <= ch <= "~" for ch in token):
        return None
    return (
        f"the credential cannot be sent in the {header_name or 'Authorization'} header: "
        "it must be printable ASCII (no line breaks, control or non-ASCII characters)"
    )
