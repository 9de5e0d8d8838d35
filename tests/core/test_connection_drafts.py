"""The shape rules of a connection draft, without a database: one rule, two front doors' words."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from core.connection_drafts import (
    ConnectionDraft,
    check_described,
    check_described_credential,
    check_device_or_cli,
    check_oauth_client,
    chosen_transport,
    credential_scheme,
    needs_token,
)
from core.errors import BadRequest, DomainError, Unprocessable


def refusal(check: object, *args: object) -> DomainError:
    with pytest.raises(DomainError) as caught:
        check(*args)  # type: ignore[operator]
    return caught.value


def test_a_relay_without_its_token_is_refused_in_each_front_doors_words() -> None:
    direct = ConnectionDraft(transport="relay", base_url="https://relay.example.com")
    listed = ConnectionDraft(transport="relay", base_url="https://relay.example.com", entry="laptop")
    assert refusal(check_device_or_cli, direct, "relay").message == "a relay connection needs the relay's `token`"
    assert refusal(check_device_or_cli, listed, "relay").message == (
        "'laptop' is a relay: it needs the relay's credential as `token`"
    )
    check_device_or_cli(ConnectionDraft(base_url="https://relay.example.com", token=SecretStr("t")), "relay")


def test_the_first_rule_broken_is_the_one_answered() -> None:
    draft = ConnectionDraft(transport="relay", client_id="c", header_name="X-Key")  # three problems
    assert refusal(check_device_or_cli, draft, "relay").message == "a relay connection takes no OAuth settings"
    assert isinstance(refusal(chosen_transport, ConnectionDraft(provider="smtp")), BadRequest)
    assert chosen_transport(ConnectionDraft(provider="mcp_http", transport="openapi")) == "openapi"


def test_a_catalog_entry_is_not_held_to_the_scope_token_rule() -> None:
    scopes = ["has space"]
    assert "scope tokens" in refusal(check_oauth_client, ConnectionDraft(scopes=scopes)).message
    check_oauth_client(ConnectionDraft(scopes=scopes, entry="linear"))


def test_a_described_connections_url_and_credential() -> None:
    stdio = ConnectionDraft(transport="stdio", display_name="My Tools!")
    assert check_described(stdio, "stdio", {"command": "python3"}) == "stdio://my-tools"
    assert check_described(ConnectionDraft(), "stdio", {"command": "/usr/bin/Lint"}) == "stdio://usr-bin-lint"
    assert isinstance(refusal(check_described, ConnectionDraft(), "http", {}), Unprocessable)
    assert check_described(ConnectionDraft(), "openapi", {}) is None  # read from the document
    assert (needs_token("stdio", {}), needs_token("http", {"auth": {"type": "none"}}), needs_token("http", {})) == (
        False, False, True
    )  # fmt: skip
    assert (credential_scheme({"auth": {"type": "basic"}}, "Bearer"), credential_scheme({}, "")) == ("Basic", "")
    refused = refusal(check_described_credential, ConnectionDraft(entry="api"), "http", {"auth": {"type": "header"}})
    assert refused.message == "'api' needs a `token`"
