"""Who am I, and my personal access tokens, in process: what ``/v1/auth`` answers the operator and a member,
and that no token of either kind can mint or revoke tokens (that needs a browser session)."""

from __future__ import annotations

import re
import secrets

from tests.api.admin_helpers import member_with_token
from tests.api.conftest import Api

Z_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
PAT_CANNOT_MANAGE = "a personal access token cannot mint, extend, or revoke tokens — use a browser session"
OPERATOR_HAS_NO_TOKENS = "personal access tokens belong to a membership; the operator token has none"


async def test_me_is_the_operator_or_the_member_behind_the_pat(api: Api) -> None:
    r = await api.client.get("/v1/auth/me")
    assert (r.status_code, r.text) == (200, '{"operator":true}'), "nothing but the flag: absent, not null"
    held = await member_with_token(api, ["approver", "member"])
    async with held.client as me:
        r = await me.get("/v1/auth/me")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "user_id": str(held.member.user_id),
        "membership_id": str(held.member.id),
        "org": {"slug": "default", "display_name": "default"},
        "user": {"email": held.member.email, "name": "A Member"},
        "roles": ["approver", "member"],
        "auth_kind": "pat",
    }
    assert "operator" not in r.json()


async def test_a_member_lists_their_tokens_without_the_tokens_themselves(api: Api) -> None:
    held = await member_with_token(api, ["member"])
    other = await member_with_token(api, ["member"])
    async with held.client as me, other.client:
        await me.get("/v1/auth/me")  # a use, so last_used_at is set
        listed = await me.get("/v1/auth/tokens")
    assert listed.status_code == 200, listed.text
    [row] = listed.json()["tokens"]
    assert set(row) == {"id", "name", "display_prefix", "expires_at", "last_used_at", "revoked_at", "created_at"}
    assert row["name"] == "laptop" and held.token.startswith(row["display_prefix"]) and row["revoked_at"] is None
    assert all(Z_TIME.match(row[k]) for k in ("expires_at", "last_used_at", "created_at")), row
    assert held.token[len(row["display_prefix"]) :] not in listed.text
    assert other.token[: len(row["display_prefix"])] not in listed.text, "only the caller's own tokens"


async def test_no_token_can_mint_or_revoke_tokens_and_the_operator_has_none_to_list(api: Api) -> None:
    held = await member_with_token(api, ["owner"])
    async with held.client as me:
        [row] = (await me.get("/v1/auth/tokens")).json()["tokens"]
        for r in (
            await me.post("/v1/auth/tokens", json={"name": "more"}),
            await me.delete(f"/v1/auth/tokens/{row['id']}"),
        ):
            assert (r.status_code, r.json()) == (403, {"error": PAT_CANNOT_MANAGE, "code": "forbidden"})
    for r in (
        await api.client.get("/v1/auth/tokens"),
        await api.client.post("/v1/auth/tokens", json={"name": "x"}),
        await api.client.delete(f"/v1/auth/tokens/{row['id']}"),
    ):
        assert (r.status_code, r.json()) == (403, {"error": OPERATOR_HAS_NO_TOKENS, "code": "forbidden"})
    async with api.as_token(held.token) as me:
        assert (await me.get("/v1/auth/me")).status_code == 200, "the refused revoke revoked nothing"
        assert len((await me.get("/v1/auth/tokens")).json()["tokens"]) == 1, "the refused mint minted nothing"


async def test_a_missing_unknown_or_malformed_credential_is_401_with_code_unauthorized(api: Api) -> None:
    """The 401 half of tests/integration/test_api_errors.py's credential tests (the stack keeps the readiness one)."""
    unauthorized = {"error": "unauthorized", "code": "unauthorized"}
    for token in (None, "fbx_admin_wrong", "fbx_pat_" + secrets.token_hex(32), "fbx_trig_" + secrets.token_hex(32)):
        async with api.as_token(token) as client:
            for path in ("/v1/auth/me", "/v1/agents", "/v1/policies", "/v1/triggers", "/v1/admin/orgs/default/members"):
                r = await client.get(path)
                assert (r.status_code, r.json()) == (401, unauthorized), (token, path, r.text)
    async with api.as_token(None) as anon:
        r = await anon.get("/v1/agents", headers={"authorization": "Basic abc"})
        assert (r.status_code, r.json()) == (401, unauthorized)
        assert (await anon.get("/v1/health")).json() == {"status": "ok"}
