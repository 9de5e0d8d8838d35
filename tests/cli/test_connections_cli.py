"""`fluidbox connections …` as a user runs it, against a real stack: a device relay (a real TLS relay with a
certificate from a CA the test creates, in front of a real MCP server) and a sandbox CLI, created from flags and
from a body file; bad input is one line on stderr and exit status 2, with nothing stored."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.stack import Stack
from tests.mcp_servers import basic, serve
from tests.relay_servers import tls_relay

FLUIDBOX = str(Path(sys.executable).parent / "fluidbox")
pytestmark = pytest.mark.stack

ECHO_TOOL = {
    "name": "echo_args",
    "description": "Print each argument in brackets",
    "command": "printf",
    "args": ["[%s]\\n", "{text}"],
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False},
}


@pytest.fixture(scope="module")
async def stack() -> AsyncIterator[tuple[Stack, str]]:
    env = {
        "FLUIDBOX_REPLAY_DELAY_MS": "0",
        "FLUIDBOX_LOG_LEVEL": "WARNING",
        "FLUIDBOX_CREDENTIAL_KEY": secrets.token_hex(32),
        "FLUIDBOX_ALLOW_LOOPBACK_CONNECTORS": "true",
    }
    st = Stack.ephemeral("fbxcc-", env)
    try:
        token = await st.start()
        yield st, token
    finally:
        st.stop()
        shutil.rmtree(st.home, ignore_errors=True)


async def fluidbox(st: tuple[Stack, str], *args: str, code: int = 0, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``fluidbox connections …`` (off the event loop: the test's servers run beside it)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLUIDBOX_")}
    base.update(FLUIDBOX_URL=st[0].api_url, FLUIDBOX_ADMIN_TOKEN=st[1], FLUIDBOX_HOME=str(st[0].home), **env)
    done = await asyncio.to_thread(
        subprocess.run, [FLUIDBOX, "connections", *args], env=base, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    if code == 2:
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
        assert done.stdout == ""
    return done


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


async def listed(st: tuple[Stack, str]) -> str:
    return (await fluidbox(st, "list")).stdout


async def test_a_relay_connection_is_created_inspected_refreshed_and_revoked_from_the_command_line(
    stack: tuple[Stack, str], tmp_path: Path
) -> None:
    canary = "cli-relay-" + secrets.token_hex(12)
    async with serve(basic()) as upstream, tls_relay(upstream.url, canary) as relay:
        ca = tmp_path / "relay-ca.pem"
        ca.write_text(relay.ca_pem)
        flags = ["create", "--transport", "relay", "--base-url", relay.url, "--token-env", "RELAY_TOKEN"]
        # Without the relay's CA the certificate is not trusted: refused upstream (exit 1), nothing stored.
        untrusted = await fluidbox(stack, *flags, code=1, RELAY_TOKEN=canary)
        assert "→ 502:" in untrusted.stderr and "certificate" in untrusted.stderr.lower()
        wrong = await fluidbox(stack, *flags, "--ca-pem", str(ca), code=2, RELAY_TOKEN="not-the-credential")
        assert "→ 400: the relay rejected this credential (connection rolled back)" in wrong.stderr
        slow = await fluidbox(stack, *flags, "--ca-pem", str(ca), "--timeout", "600", code=2, RELAY_TOKEN=canary)
        assert "relay timeout_s must be a number of seconds in (0, 120]" in slow.stderr
        assert relay.url not in await listed(stack)

        made = as_json(
            await fluidbox(
                stack, *flags, "--ca-pem", str(ca), "--timeout", "10", "--name", "my laptop",
                "--access", '{"read": {"tools": ["add", "echo"]}}', RELAY_TOKEN=canary,
            )
        )  # fmt: skip
        connection = made["connection"]
        assert (connection["transport"], connection["status"]) == ("relay", "active")
        assert connection["transport_config"]["timeout_s"] == 10
        assert f"{connection['id']}  relay  active  {relay.url}  my laptop" in await listed(stack)
        shown = as_json(await fluidbox(stack, "show", connection["id"]))
        assert shown["connection"]["base_url"] == relay.url
        tools = as_json(await fluidbox(stack, "tools", connection["id"]))["snapshot"]
        assert {t["name"]: t["access"] for t in tools["tools"] if t["name"] in ("add", "echo")} == {
            "add": "read",
            "echo": "read",
        }
        refreshed = as_json(await fluidbox(stack, "refresh", connection["id"]))["snapshot"]
        assert refreshed["version"] == tools["version"] + 1
        revoked = as_json(await fluidbox(stack, "revoke", connection["id"]))
        assert revoked["connection"]["status"] == "revoked"
        again = await fluidbox(stack, "refresh", connection["id"], code=2)
        assert "→ 400: connection is revoked" in again.stderr
        unknown = await fluidbox(stack, "show", str(uuid.uuid4()), code=2)
        assert "→ 404" in unknown.stderr
        outputs = [made, shown, tools, refreshed, revoked]
        assert canary not in json.dumps(outputs) and canary not in await listed(stack)


async def test_a_sandbox_cli_connection_is_created_from_a_body_file_and_never_takes_a_credential(
    stack: tuple[Stack, str], tmp_path: Path
) -> None:
    url = f"sandbox-cli://cli-{uuid.uuid4().hex[:8]}"
    body = tmp_path / "body.yaml"
    body.write_text(yaml.safe_dump({"transport": "sandbox_cli", "base_url": url, "tools": [ECHO_TOOL]}))
    refused = await fluidbox(stack, "create", "--file", str(body), "--token-env", "SOME_TOKEN", code=2, SOME_TOKEN="x")
    assert "→ 400: a sandbox_cli connection carries no credential, so it takes no `token`" in refused.stderr
    assert url not in await listed(stack)

    made = as_json(await fluidbox(stack, "create", "--file", str(body), "--name", "printf", "--access", "read: true"))
    connection = made["connection"]
    assert (connection["transport"], connection["base_url"]) == ("sandbox_cli", url)
    assert [t["name"] for t in made["snapshot"]["tools"]] == ["echo_args"]
    assert f"{connection['id']}  sandbox_cli  active  {url}  printf" in await listed(stack)
    tools = as_json(await fluidbox(stack, "tools", connection["id"]))["snapshot"]["tools"]
    assert [(t["name"], t["access"]) for t in tools] == [("echo_args", "read")]
    # The declarations are the photograph: nothing to refresh.
    stale = await fluidbox(stack, "refresh", connection["id"], code=2)
    assert "a sandbox_cli connection's tools are its declarations" in stale.stderr
    # The same body with flags: --tools as a file of declarations.
    decl = tmp_path / "tools.json"
    decl.write_text(json.dumps([ECHO_TOOL]))
    url2 = url + "-flags"
    from_flags = as_json(
        await fluidbox(stack, "create", "--transport", "sandbox_cli", "--base-url", url2, "--tools", str(decl))
    )
    assert from_flags["connection"]["base_url"] == url2


async def test_a_git_credential_is_created_from_the_command_line_and_never_shown(stack: tuple[Stack, str]) -> None:
    canary = "git-cli-" + secrets.token_hex(12)
    url = "https://git.example.com/team"
    made = as_json(
        await fluidbox(
            stack, "create", "--transport", "git", "--base-url", url, "--scheme", "Basic", "--name", "team repos",
            "--token-env", "GIT_TOKEN", GIT_TOKEN=f"bot:{canary}",
        )
    )  # fmt: skip
    connection = made["connection"]
    assert (connection["transport"], connection["status"], connection["base_url"]) == ("git", "active", url)
    assert f"{connection['id']}  git  active  {url}  team repos" in await listed(stack)
    shown = as_json(await fluidbox(stack, "show", connection["id"]))
    revoked = as_json(await fluidbox(stack, "revoke", connection["id"]))
    assert revoked["connection"]["status"] == "revoked"
    assert canary not in json.dumps([made, shown, revoked]) and canary not in await listed(stack)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--transport", "ftp"],
         "unknown transport 'ftp' (one of: mcp_http, openapi, http, stdio, relay, sandbox_cli, git)"),
        (["--transport", "relay", "--scheme", "Basic"],
         "--scheme does not apply to a relay connection (it applies to git)"),
        (["--transport", "git", "--base-url", "https://git.example.com/t", "--scheme", "Digest", "--token-env", "T"],
         "→ 400: invalid request: scheme: Input should be 'Bearer', 'Basic' or ''"),
        (["--transport", "sandbox_cli", "--ca-pem", "/etc/hostname"],
         "--ca-pem does not apply to a sandbox_cli connection (it applies to relay)"),
        (["--transport", "relay", "--base-url", "https://127.0.0.1:9/mcp", "--tools", "/etc/hostname"],
         "--tools does not apply to a relay connection (it applies to sandbox_cli)"),
        (["--transport", "relay", "--timeout", "soon"], "--timeout must be a number of seconds, not 'soon'"),
        (["--transport", "relay", "--ca-pem", "/no/such/ca.pem"], "cannot read --ca-pem /no/such/ca.pem"),
        (["--file", "/no/such/body.yaml"], "cannot read the request body /no/such/body.yaml"),
        (["--transport", "sandbox_cli", "--base-url", "sandbox-cli://x", "--tools", "{dir}/object.json"],
         "must hold a list of tool declarations"),
        (["--file", "{dir}/token.json"], "holds a `token`: keep credentials out of files, pass --token-env VAR"),
        (["--transport", "relay", "--base-url", "http://127.0.0.1:9/mcp", "--token-env", "T"],
         "→ 400: a relay URL must be https://"),
        (["--transport", "sandbox_cli", "--base-url", "sandbox-cli://x", "--access", "[1]"],
         "--access must be an object"),
        (["--transport", "sandbox_cli", "--base-url", "sandbox-cli://x"],
         "→ 400: a sandbox_cli connection needs `tools`"),
    ],
)  # fmt: skip
async def test_bad_input_is_one_line_and_exit_status_2_and_stores_nothing(
    stack: tuple[Stack, str], tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "object.json").write_text(json.dumps({"name": "not a list"}))
    (tmp_path / "token.json").write_text(json.dumps({"transport": "relay", "token": "in-a-file"}))
    before = await listed(stack)
    done = await fluidbox(stack, "create", *[a.format(dir=tmp_path) for a in args], code=2, T="t")
    assert message in done.stderr, done.stderr
    assert await listed(stack) == before
