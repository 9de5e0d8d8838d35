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


def _spec(harness_config: dict[str, Any], policy: dict[str, Any] | None = None) -> Any:
    from tests.core.test_gate import ALLOW_ALL, make_spec

    spec = make_spec(policy or ALLOW_ALL)
    return spec.model_copy(update={"harness_config": harness_config})


def test_the_gate_holds_every_proposal_for_a_human_even_when_the_policy_allows_it() -> None:
    from core.gate import decide

    proposal = {"transport": "mcp_http", "base_url": "https://api.example.com/mcp"}
    off = decide(_spec({}), "ProposeConnection", proposal, registered_calls=1)
    assert (off.verdict, off.source) == ("deny", "capability")
    held = decide(_spec(ON), "ProposeConnection", proposal, registered_calls=1)
    assert (held.verdict, held.source, held.policy) == ("require_approval", "dynamic_connection", None)
    deny_all = {"name": "deny", "defaults": {"tool_action": "deny"}}
    assert decide(_spec(ON, deny_all), "ProposeConnection", proposal, registered_calls=1).verdict == "deny"
    opted_out = {"dynamic_connections": {**ON["dynamic_connections"], "require_approval": False}}
    assert decide(_spec(opted_out), "ProposeConnection", proposal, registered_calls=1).verdict == "allow"


def test_the_sandbox_learns_tool_surfaces_and_launch_lines_but_never_urls_or_credentials() -> None:
    import json
    from pathlib import Path

    from core.runner_env import runner_env
    from core.wire import ENV_CAPABILITIES

    class Settings:
        socket_path = Path("/run/api.sock")
        heartbeat_secs = 5.0
        token_ttl_secs = 600
        gateway_staleness_secs = 30.0
        replay_delay_ms = 0

    cli_tool = {"name": "git_log", "description": "", "command": "git", "args": ["log"], "timeout_s": 60.0,
                "input_schema": {"type": "object", "additionalProperties": False}}  # fmt: skip
    brokered = [
        {"slot": "calc", "url": "https://secret-host.example/mcp", "transport": "relay", "tools": [{"name": "add"}]},
        {"slot": "git", "url": "sandbox-cli://git", "transport": "sandbox_cli", "tools": [cli_tool]},
    ]
    capabilities = [{"name": "b", "servers": [{"class": "sandbox", "name": "lint", "command": "lint-mcp",
                                               "args": ["--stdio"], "tools": [{"name": "check"}]}]}]  # fmt: skip
    spec = _spec(ON).model_copy(update={"brokered": brokered, "capabilities": capabilities})
    raw = runner_env(spec, Settings())[ENV_CAPABILITIES]
    servers = {s["name"]: s for s in json.loads(raw)["servers"]}
    assert [s["class"] for s in servers.values()] == ["brokered", "sandbox_cli", "sandbox", "dynamic_connections"]
    assert servers["git"]["tools"][0]["command"] == "git" and "command" not in servers["calc"]["tools"][0]
    assert (servers["lint"]["command"], servers["lint"]["args"]) == ("lint-mcp", ["--stdio"])
    assert servers["fluidbox"]["tools"][0]["name"] == "propose_connection"
    assert "secret-host" not in raw
    plain = runner_env(_spec({}).model_copy(update={"brokered": [], "capabilities": []}), Settings())
    assert ENV_CAPABILITIES not in plain, "nothing to mount, nothing to say"
