"""What the agents, policies, triggers, auth and admin tests make through the API or in process: agents,
policies, and members holding a personal access token (as ``fluidbox users add`` and ``users token`` do)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import yaml

from db.identity import Member
from tests.api.conftest import Api


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def make_policy(client: httpx.AsyncClient, doc: dict[str, Any]) -> str:
    name = unique("pol")
    r = await client.post("/v1/policies", json={"name": name, "yaml": yaml.safe_dump({**doc, "name": name})})
    assert r.status_code == 200, r.text
    return name


async def make_agent(
    client: httpx.AsyncClient, script: list[dict[str, Any]] | None = None, policy: str = "demo", **extra: Any
) -> str:
    name = unique("agent")
    body: dict[str, Any] = {"name": name, "harness": "replay", "policy": policy, **extra}
    if script is not None:
        body["harness_config"] = {"script": script}
    r = await client.post("/v1/agents", json=body)
    assert r.status_code == 200, r.text
    return name


@dataclass
class MemberWithToken:
    member: Member
    token: str
    client: httpx.AsyncClient


async def member_with_token(api: Api, roles: list[str], *, read_only: bool = False) -> MemberWithToken:
    """A user of the boot org with ``roles`` and a fresh PAT, and a client holding it (the caller closes it)."""
    identity = api.ctx.identity
    tenant = await identity.boot_tenant()
    email = f"{unique('user')}@example.com"
    member = await identity.add_user(tenant, email, "A Member", roles, actor=("system", "test"))
    token, _ = await identity.mint_pat(
        tenant, str(member.id), "laptop", None, actor=("system", "test"), read_only=read_only
    )
    return MemberWithToken(member, token, api.as_token(token))
