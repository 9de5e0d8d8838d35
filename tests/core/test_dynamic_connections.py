"""The pure checks of a dynamic-connection proposal and of sandbox CLI declarations."""

from __future__ import annotations

from typing import Any

import pytest

from core.dynamic_connections import check_proposal, host_allowed
from core.errors import BadRequest, Forbidden
from core.sandbox_cli import check_tools

ON: dict[str, Any] = {"dynamic_connections": {"enabled": True, "allowedHosts": ["api.example.com", "*.example.org"]}}


def test_off_unless_the_agent_enables_it() -> None:
    with pytest.raises(Forbidden, match="dynamic connections are off"):
        check_proposal({}, {"base_url": "https://api.example.com/mcp"})


@pytest.mark.parametrize(
    ("proposal", "message"),
    [
        ({"base_url": "https://api.example.com/mcp", "command": "npx"}, "can never carry command"),
        ({"base_url": "https://api.example.com/mcp", "env": {"A": "1"}}, "can never carry env"),
        ({"base_url": "https://api.example.com/mcp", "client_secret": "x"}, "can never carry a secret"),
        ({"base_url": "https://api.example.com/mcp", "headers": {"Authorization": "x"}}, "can never carry a secret"),
        ({"base_url": "https://u:p@api.example.com/mcp"}, "user:password@"),
        ({"base_url": "https://api.example.com/mcp?access_token=x"}, "query parameter access_token"),
        ({"base_url": "https://evil.example.net/mcp"}, "not in this agent's allowedHosts"),
        ({"base_url": "https://example.org/mcp"}, "not in this agent's allowedHosts"),
        ({"transport": "relay", "base_url": "https://api.example.com/mcp"}, "cannot be proposed"),
        ({"base_url": "ftp://api.example.com/"}, "must be an http(s) URL"),
        ({"base_url": "https://api.example.com/", "colour": "red"}, "unknown field"),
    ],
)
def test_refusals_name_the_reason(proposal: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        check_proposal(ON, proposal)


def test_an_allowed_proposal_is_normalized() -> None:
    assert check_proposal(ON, {"base_url": "https://a.example.org/mcp", "transport": "openapi"}) == {
        "transport": "openapi",
        "base_url": "https://a.example.org/mcp",
        "display_name": "https://a.example.org/mcp",
    }
    assert host_allowed("API.example.com", ["api.example.com"]) and not host_allowed(
        "xapi.example.com", ["api.example.com"]
    )


def test_sandbox_cli_declarations_close_their_argument_set() -> None:
    tool = {
        "name": "git_log",
        "command": "git",
        "args": ["log", "--max-count", "{count}"],
        "input_schema": {
            "type": "object",
            "properties": {"count": {"type": "integer"}},
            "additionalProperties": False,
        },
    }
    assert check_tools([tool])[0]["timeout_s"] == 60.0
    with pytest.raises(BadRequest, match="more than once"):
        check_tools([tool, tool])
    with pytest.raises(BadRequest, match="no spaces, no shell"):
        check_tools([{**tool, "command": "sh -c"}])
