"""Catalog entries are checked per transport: the shipped file passes, and each broken entry is refused with one
sentence naming the entry and what is wrong (a broken shipped file stops the API at boot with that sentence)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from integrations.catalog import CatalogEntryError, check_entries, check_entry

SHIPPED = Path(__file__).resolve().parents[2] / "catalog" / "connectors.yaml"
ECHO = {
    "name": "echo_args",
    "command": "printf",
    "args": ["[%s]\\n", "{text}"],
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False},
}


def test_the_shipped_catalog_names_every_kind_of_entry_and_passes() -> None:
    entries = check_entries(yaml.safe_load(SHIPPED.read_text()))
    by_slug = {e["slug"]: e for e in entries}
    git = by_slug["git"]
    assert (git["transport"], git["auth_mode"], git["url"]) == ("sandbox_cli", "none", "sandbox-cli://git")
    tools = {t["name"]: t for t in git["transport_config"]["tools"]}
    reads, writes = set(git["access"]["read"]["tools"]), set(git["access"]["write"]["tools"])
    assert reads | writes == set(tools) and not reads & writes, "every git tool is reviewed as read or write"
    assert writes == {"git_add", "git_commit"} and git["access"]["write"]["approval"] == "always"
    assert all(t["command"] == "git" for t in tools.values())


def test_the_shipped_catalog_seeds_the_reference_entries_as_the_reference_describes_them() -> None:
    by_slug = {e["slug"]: e for e in check_entries(yaml.safe_load(SHIPPED.read_text()))}
    assert {"github", "stripe", "linear", "sentry", "atlassian", "notion", "workspace-info"} <= set(by_slug)
    shape = {slug: (by_slug[slug].get("url"), by_slug[slug]["auth_mode"]) for slug in ("github", "atlassian", "linear")}
    assert shape == {
        "github": ("https://api.githubcopilot.com/mcp/", "api_key"),
        "atlassian": ("https://mcp.atlassian.com/v1/mcp/authv2", "oauth"),
        "linear": ("https://mcp.linear.app/mcp", "oauth"),
    }
    assert by_slug["github"]["auth_hints"]["scheme"] == "Bearer"
    assert by_slug["sentry"]["auth_hints"]["header_name"] == "Sentry-Bearer"
    assert by_slug["notion"]["auth_mode"] == "oauth"
    for slug in ("github", "atlassian"):  # reviewed patterns: reads, and writes that always need a human
        access = by_slug[slug]["access"]
        assert access["read"]["tools"] and access["write"]["tools"] and access["write"]["approval"] == "always"


def test_a_relay_entry_is_normalized_with_its_bounded_timeout() -> None:
    entry = {"slug": "dev", "transport": "relay", "url": "https://relay.example.net/mcp", "auth_mode": "api_key"}
    assert check_entry(entry)["transport_config"] == {"timeout_s": 30.0}
    timed = check_entry({**entry, "transport_config": {"timeout_s": 5}})
    assert timed["transport_config"] == {"timeout_s": 5.0}


BAD: list[tuple[dict[str, Any], str]] = [
    ({"transport": "ftp"}, "catalog entry 'e' (ftp): unknown transport"),
    ({"transport": "relay", "url": "https://r.example/mcp", "auth_mode": "oauth"},
     "catalog entry 'e' (relay): a relay entry needs `auth_mode: api_key`: the relay's credential is given as `token`"),
    ({"transport": "relay", "url": "https://r.example/mcp", "transport_config": {"timeout_s": 500}},
     "catalog entry 'e' (relay): relay timeout_s must be a number of seconds in (0, 120]"),
    ({"transport": "relay", "url": "https://r.example/mcp",
      "transport_config": {"ca_pem": "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----"}},
     "no private key"),
    ({"transport": "sandbox_cli", "url": "sandbox-cli://x", "transport_config": {"tools": [ECHO]}},
     "catalog entry 'e' (sandbox_cli): a sandbox_cli entry needs `auth_mode: none`"),
    ({"transport": "sandbox_cli", "url": "sandbox-cli://", "auth_mode": "none", "transport_config": {"tools": [ECHO]}},
     "needs a `url` of the form sandbox-cli://<name>"),
    ({"transport": "sandbox_cli", "url": "sandbox-cli://x", "auth_mode": "none",
      "transport_config": {"tools": [ECHO], "env": {"A": "b"}}}, "unknown sandbox_cli setting(s): env"),
    ({"transport": "sandbox_cli", "url": "sandbox-cli://x", "auth_mode": "none",
      "transport_config": {"tools": [{**ECHO, "command": "sh -c"}]}},
     "sandbox_cli tool 'echo_args': `command` is one program name or absolute path"),
    ({"transport": "stdio", "auth_mode": "none", "transport_config": {"args": ["x"]}},
     "catalog entry 'e' (stdio): a stdio connection needs a `command`"),
    ({"transport": "http", "url": "https://api.example", "transport_config": {}},
     "catalog entry 'e' (http): needs `transport_config.endpoints`"),
    ({"transport": "openapi", "url": "https://api.example"}, "needs `transport_config` (document_url or document"),
    ({"transport": "mcp_http", "url": "https://m.example/mcp", "sandbox_launch": {"command": "x"}},
     "`sandbox_launch` applies to stdio entries only"),
]  # fmt: skip


@pytest.mark.parametrize(("entry", "message"), BAD)
def test_a_broken_entry_is_refused_naming_the_entry_and_the_problem(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(CatalogEntryError) as refused:
        check_entry({"slug": "e", **entry})
    assert message in str(refused.value) and len(str(refused.value).splitlines()) == 1


def test_a_catalog_file_with_a_repeated_slug_is_refused() -> None:
    entry = {"slug": "twice", "url": "https://m.example/mcp"}
    with pytest.raises(CatalogEntryError, match="catalog entry 'twice' appears twice"):
        check_entries([entry, entry])
