"""Runs, members and run tokens for the in-process tests of the run routes (sessions, approvals, the runner
plane, usage, deliveries), made the way the API and the operator's tooling make them."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from core.access import LEGACY
from core.digests import document_digest
from core.states import RunStatus
from core.tokens import Audience
from db.connections import NewConnection
from tests.api.conftest import Api


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def make_agent(api: Api, policy: str = "demo", **extra: Any) -> str:
    """A replay agent under ``policy`` (``demo``: Read is allowed, ``curl`` denied, ``./deploy.sh`` waits for a
    human), made over the API."""
    name = unique("agent")
    r = await api.client.post("/v1/agents", json={"name": name, "harness": "replay", "policy": policy, **extra})
    assert r.status_code == 200, r.text
    return name


async def start_run(api: Api, agent: str, token: str | None = None, **extra: Any) -> dict[str, Any]:
    """A run of ``agent`` started over the API (as the operator, or as the holder of ``token``)."""
    body = {"agent": agent, "task": "test task", **extra}
    if token is None:
        r = await api.client.post("/v1/sessions", json=body)
    else:
        async with api.as_token(token) as client:
            r = await client.post("/v1/sessions", json=body)
    assert r.status_code == 200, r.text
    session: dict[str, Any] = r.json()["session"]
    return session


@dataclass
class Member:
    membership_id: str
    user_id: str
    token: str


async def member(api: Api, *roles: str) -> Member:
    """A user of the boot organization with ``roles`` and a PAT, as ``fluidbox users add`` / ``token`` make them."""
    tenant = await api.ctx.identity.boot_tenant()
    row = await api.ctx.identity.add_user(
        tenant, f"{uuid.uuid4().hex[:10]}@example.com", "A Member", roles or ("member",), actor=("system", "test")
    )
    token, _ = await api.ctx.identity.mint_pat(tenant, str(row.id), "tests", None, actor=("system", "test"))
    return Member(str(row.id), str(row.user_id), token)


async def run_token(api: Api, run_id: str, audience: Audience) -> str:
    """One more run-scoped token, as the worker mints the runner's."""
    tenant = await api.ctx.identity.boot_tenant()
    return await api.ctx.tokens.issue_token(tenant, run_id, audience.value, 600, secrets.token_hex(16))


# A server's tools as integrations.mcp_client photographs them.
TOOLS = [{"name": "add", "description": "Add two integers.", "input_schema": {"type": "object"}}]
PHOTO = {"protocol_version": "2025-11-25", "tools": TOOLS, "digest": document_digest(TOOLS)}


async def brokered_agent(api: Api, owner: Member | None = None, policy: str = "unrestricted", **extra: Any) -> str:
    """An agent whose runs broker ``mcp__calc__add`` through an active connection (``owner``'s personal one,
    else the organization's), made as the connection routes make them once the server's tools are read."""
    tenant = await api.ctx.identity.boot_tenant()
    url = f"https://{unique('calc')}.example.com/mcp"
    new = NewConnection(
        provider="mcp_http",
        display_name="Calc",
        base_url=url,
        owner_user_id=owner.user_id if owner else None,
        access=LEGACY,  # a write whose approval the run's policy decides
    )
    await api.ctx.connections.create(tenant, new, PHOTO, (b"sealed", "key-1"))
    requirement = {
        "slot": "calc",
        "connector": {"url": url},
        "required_tools": ["add"],
        "binding_mode": "invoking_user" if owner else "organization",
    }
    return await make_agent(api, policy, connection_requirements=[requirement], **extra)


async def finish_run(
    api: Api, run_id: str, status: RunStatus, summary: str | None = None, diff: str | None = None
) -> None:
    """End the run as its workflow does: finalizing, then the terminal status with its artifacts."""
    artifacts = []
    if diff is not None:
        artifacts.append({"kind": "diff", "name": "changes.patch", "content": diff, "content_type": "text/x-diff"})
    await api.ctx.runs.transition(run_id, RunStatus.FINALIZING)
    await api.ctx.runs.finish(run_id, status, None, summary, status.value, artifacts, [])
