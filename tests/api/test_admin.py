"""The operator's surface for members, in process: list, set roles, and the kill switch (deactivation, after
which the member's PATs are 401 on their very next request). Every accepted change is audited."""

from __future__ import annotations

import re
import uuid

from tests.api.admin_helpers import member_with_token
from tests.api.conftest import Api

Z_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
MEMBERS = "/v1/admin/orgs/default/members"


async def audit(api: Api, target: str) -> list[tuple[str, str]]:
    async with api.ctx.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT actor_kind, action FROM auth_audit_log WHERE target = $1 ORDER BY created_at", target
        )
    return [(r["actor_kind"], r["action"]) for r in rows]


async def test_the_operator_lists_members_and_no_member_token_may(api: Api) -> None:
    owner = await member_with_token(api, ["owner"])
    plain = await member_with_token(api, ["member"])
    r = await api.client.get(MEMBERS)
    assert r.status_code == 200, r.text
    by_id = {m["id"]: m for m in r.json()["members"]}
    shown = by_id[str(owner.member.id)]
    assert shown == {
        "id": str(owner.member.id),
        "tenant_id": str(owner.member.tenant_id),
        "user_id": str(owner.member.user_id),
        "email": owner.member.email,
        "name": "A Member",
        "roles": ["owner"],
        "status": "active",
        "user_status": "active",
        "deactivated_at": None,
        "created_at": shown["created_at"],
        "updated_at": shown["updated_at"],
    }
    assert Z_TIME.match(shown["created_at"]) and Z_TIME.match(shown["updated_at"]), "members answer pydantic's …Z"
    assert [m["email"] for m in r.json()["members"]] == sorted([owner.member.email, plain.member.email])
    async with owner.client as o:
        r = await o.get(MEMBERS)
        assert r.status_code == 403 and "requires the operator (admin) token" in r.json()["error"], r.text
        assert (await o.post(f"{MEMBERS}/{plain.member.id}/deactivate")).status_code == 403
    assert (await api.client.get("/v1/admin/orgs/nope/members")).json() == {"error": "not found", "code": "not_found"}


async def test_roles_are_replaced_in_canonical_order_and_bad_ones_change_nothing(api: Api) -> None:
    held = await member_with_token(api, ["member"])
    mid = str(held.member.id)
    r = await api.client.post(f"{MEMBERS}/{mid}/roles", json={"roles": ["owner", "member", "owner"]})
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"member"} and r.json()["member"]["roles"] == ["member", "owner"]
    for body, status, message in (
        ({"roles": ["root"]}, 400, "unknown role(s) root (roles: member, approver, admin, owner)"),
        ({"roles": []}, 400, "roles must name at least one of member, approver, admin, owner"),
        ({"roles": ["member"], "extra": 1}, 400, "unknown field 'extra'"),
        ({}, 400, "missing field 'roles'"),
    ):
        r = await api.client.post(f"{MEMBERS}/{mid}/roles", json=body)
        assert r.status_code == status and message in r.json()["error"], (body, r.text)
    for path in (
        f"{MEMBERS}/{uuid.uuid4()}/roles",
        f"{MEMBERS}/not-an-id/roles",
        f"/v1/admin/orgs/nope/members/{mid}/roles",
    ):
        r = await api.client.post(path, json={"roles": ["admin"]})
        assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"}), path
    async with held.client as me:
        assert (await me.get("/v1/auth/me")).json()["roles"] == ["member", "owner"]
    assert await audit(api, mid) == [("system", "user.add"), ("operator", "membership.roles")]


async def test_deactivation_is_the_kill_switch_and_a_second_one_is_a_conflict(api: Api) -> None:
    held = await member_with_token(api, ["admin"])
    mid = str(held.member.id)
    async with held.client as me:
        assert (await me.get("/v1/auth/me")).status_code == 200
        r = await api.client.post(f"{MEMBERS}/{mid}/deactivate")
        assert r.status_code == 200, r.text
        member = r.json()["member"]
        assert (member["id"], member["status"], member["user_status"]) == (mid, "deactivated", "active")
        assert Z_TIME.match(member["deactivated_at"])
        # The very next request of the member's PAT.
        r = await me.get("/v1/auth/me")
        assert (r.status_code, r.json()) == (401, {"error": "unauthorized", "code": "unauthorized"})
    again = await api.client.post(f"{MEMBERS}/{mid}/deactivate")
    assert (again.status_code, again.json()) == (
        409,
        {"error": "membership is already deactivated", "code": "conflict"},
    )
    listed = {m["id"]: m for m in (await api.client.get(MEMBERS)).json()["members"]}
    assert listed[mid]["status"] == "deactivated" and listed[mid]["deactivated_at"] == member["deactivated_at"]
    assert await audit(api, mid) == [("system", "user.add"), ("operator", "membership.deactivate")]
