"""Catalog entries for the relay and sandbox CLI transports, and the "no credential" rule of sandbox CLI tools,
against the real stack: a real TLS relay (a CA the test creates) in front of a real MCP server, and the shipped
``git`` entry running git inside a real sandbox."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.helpers import events, make_agent, make_policy, start_run, unique, wait_status
from tests.mcp_servers import basic, serve
from tests.relay_servers import tls_relay

pytestmark = pytest.mark.stack

POLICY: dict[str, Any] = {"defaults": {"tool_action": "deny"}, "tools": [{"match": ["mcp__*"], "action": "allow"}]}
ECHO_TOOL = {
    "name": "echo_args",
    "command": "printf",
    "args": ["[%s]\\n", "{text}"],
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False},
}


def said(evs: list[dict[str, Any]]) -> list[str]:
    return [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]


def git_repo(path: Path) -> Path:
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_GLOBAL": "/dev/null"}  # fmt: skip
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True, env=env)
    (path / "a.txt").write_text("a")
    subprocess.run(["git", "add", "a.txt"], cwd=path, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "the only commit"], cwd=path, check=True, env=env)
    (path / "a.txt").write_text("changed")
    return path


async def test_the_shipped_git_entry_connects_without_a_credential_and_runs_its_reads_in_the_sandbox(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    entry = (await api.get("/v1/catalog/git")).json()["connector"]
    assert (entry["transport"], entry["auth_mode"], entry["url"]) == ("sandbox_cli", "none", "sandbox-cli://git")
    before = (await api.get("/v1/connections")).json()
    refused = await api.post("/v1/catalog/git/connect", json={"token": "never-in-a-sandbox"})
    assert refused.status_code == 400 and "takes no `token`" in refused.json()["error"], refused.text
    assert (await api.get("/v1/connections")).json() == before

    made = await api.post("/v1/catalog/git/connect", json={})
    assert made.status_code == 200, made.text
    connection = made.json()["connection"]
    assert connection["transport"] == "sandbox_cli" and connection["base_url"] == "sandbox-cli://git"
    classes = {t["name"]: t["access"] for t in (await api.get(f"/v1/connections/{connection['id']}/tools")).json()[
        "snapshot"]["tools"]}  # fmt: skip
    # The entry's reviewed reads are callable at once; its writes stay off until an admin copies them in.
    assert classes["git_log"] == classes["git_status"] == "read" and classes["git_commit"] != "write"
    listed = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
    assert listed["git"]["connection"]["id"] == connection["id"]

    script = [{"tool": "mcp__git__git_log", "input": {"count": 3}}, {"tool": "mcp__git__git_status", "input": {}}]
    agent = await make_agent(
        api, script, policy=await make_policy(api, POLICY),
        connection_requirements=[
            {"slot": "git", "connector": {"url": "sandbox-cli://git"}, "required_tools": ["git_log", "git_status"]}
        ],
    )  # fmt: skip
    run_id = await start_run(api, agent, workspace=git_repo(tmp_path / "repo"))
    row = await wait_status(api, run_id, {"completed", "failed"})
    texts = said(await events(api, run_id))
    assert row["result_summary"] == "Replay complete: 2 executed, 0 denied.", texts
    assert any(t.startswith("mcp__git__git_log → ") and t.endswith(" the only commit") for t in texts), texts
    assert any(t.startswith("mcp__git__git_status → ## main") and "M a.txt" in t for t in texts), texts


async def test_a_sandbox_cli_connection_never_takes_a_credential(api: httpx.AsyncClient) -> None:
    url = f"sandbox-cli://{unique('nocred')}"
    body = {"transport": "sandbox_cli", "base_url": url, "tools": [ECHO_TOOL]}
    for extra, field in (
        ({"token": "s3cret"}, "`token`"),
        ({"credential_env": "PARKTEST_MCP_TOKEN"}, "`credential_env`"),
    ):
        r = await api.post("/v1/connections", json={**body, **extra})
        assert r.status_code == 400, r.text
        assert f"a sandbox_cli connection carries no credential, so it takes no {field}" in r.json()["error"]
    assert not [c for c in (await api.get("/v1/connections")).json()["connections"] if c["base_url"] == url]
    made = await api.post("/v1/connections", json=body)
    assert made.status_code == 200, made.text
    connection_id = made.json()["connection"]["id"]
    put = await api.put(f"/v1/connections/{connection_id}/credential", json={"token": "s3cret"})
    assert put.status_code == 400 and "carries no credential" in put.json()["error"], put.text
    assert (await api.get(f"/v1/connections/{connection_id}")).json()["connection"]["status"] == "active"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"transport": "sandbox_cli", "url": "sandbox-cli://x", "auth_mode": "api_key",
          "transport_config": {"tools": [ECHO_TOOL]}}, "a sandbox_cli entry needs `auth_mode: none`"),
        ({"transport": "sandbox_cli", "url": "sandbox-cli://x", "auth_mode": "none"},
         "a sandbox_cli connection needs `tools`"),
        ({"transport": "sandbox_cli", "url": "https://93.184.216.34/x", "auth_mode": "none",
          "transport_config": {"tools": [ECHO_TOOL]}}, "needs a `url` of the form sandbox-cli://<name>"),
        ({"transport": "relay", "url": "https://93.184.216.34/mcp", "auth_mode": "none"},
         "a relay entry needs `auth_mode: api_key`"),
        ({"transport": "relay", "url": "http://93.184.216.34/mcp", "auth_mode": "api_key"},
         "a relay URL must be https://"),
        ({"transport": "relay", "auth_mode": "api_key"}, "needs the relay's https `url`"),
        ({"transport": "relay", "url": "https://93.184.216.34/mcp", "auth_mode": "api_key",
          "transport_config": {"token": "x"}}, "unknown relay setting(s): token"),
    ],
)  # fmt: skip
async def test_bad_relay_and_sandbox_cli_entries_are_refused_naming_the_problem(
    api: httpx.AsyncClient, entry: dict[str, Any], message: str
) -> None:
    before = (await api.get("/v1/catalog")).json()
    slug = unique("bad")
    r = await api.post("/v1/catalog", json={"slug": slug, "name": "Bad", **entry})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"catalog entry '{slug}' ({entry['transport']}): ") and message in r.json()[
        "error"], r.text  # fmt: skip
    assert (await api.get("/v1/catalog")).json() == before


async def test_a_relay_entry_connects_with_the_relays_credential_sealed(api: httpx.AsyncClient) -> None:
    canary = "relay-entry-" + secrets.token_hex(12)
    async with serve(basic()) as upstream, tls_relay(upstream.url, canary) as relay:
        slug = unique("laptop")
        config = {"timeout_s": 15, "ca_pem": relay.ca_pem}
        doc = {"slug": slug, "name": "My laptop", "url": relay.url, "transport": "relay", "auth_mode": "api_key",
               "transport_config": config, "access": {"read": {"tools": ["add", "echo"]}, "write": False}}  # fmt: skip
        made = await api.post("/v1/catalog", json=doc)
        assert made.status_code == 200, made.text
        assert made.json()["connector"]["transport_config"]["timeout_s"] == 15.0
        listed = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
        assert listed[slug]["connectable"] is True and listed[slug]["connection"] is None
        missing = await api.post(f"/v1/catalog/{slug}/connect", json={})
        assert missing.status_code == 400 and "needs the relay's credential as `token`" in missing.json()["error"]
        wrong = await api.post(f"/v1/catalog/{slug}/connect", json={"token": "not-it"})
        assert wrong.status_code == 400 and "rejected this credential" in wrong.json()["error"], wrong.text
        ok = await api.post(f"/v1/catalog/{slug}/connect", json={"token": canary})
        assert ok.status_code == 200, ok.text
        connection = ok.json()["connection"]
        assert connection["transport"] == "relay" and connection["base_url"] == relay.url
        assert {t["name"] for t in ok.json()["snapshot"]["tools"]} >= {"add", "echo"}
        tools = (await api.get(f"/v1/connections/{connection['id']}/tools")).json()["snapshot"]["tools"]
        assert {t["name"]: t["access"] for t in tools if t["name"] in ("add", "echo")} == {
            "add": "read",
            "echo": "read",
        }
        listed = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
        assert listed[slug]["connection"]["id"] == connection["id"]
        for text in (ok.text, json.dumps(listed), (await api.get(f"/v1/connections/{connection['id']}")).text):
            assert canary not in text
