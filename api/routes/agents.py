"""Agents and their append-only revisions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from api.schemas import AgentCreate, ConnectionRequirement, RevisionCreate
from core.errors import BadRequest, NotFound
from core.harnesses import check_harness, check_harness_config
from core.runspec import workspace_doc

router = APIRouter(prefix="/v1/agents", tags=["agents"])


async def capability_pins(ctx: ContextDep, tenant_id: str, pins: list[str] | None) -> list[dict[str, Any]]:
    """Bundle pins: ``name`` pins the newest version now, ``name@N`` exactly N."""
    seen: set[str] = set()
    pinned = []
    for pin in pins or []:
        name, _, version = pin.partition("@")
        if name in seen:
            raise BadRequest(f"bundle '{name}' is attached more than once")
        seen.add(name)
        if version and not version.isdigit():
            raise BadRequest(f"unknown capability bundle '{pin}'")
        row = await ctx.capabilities.resolve(tenant_id, name, int(version) if version else None)
        if row is None:
            raise BadRequest(f"unknown capability bundle '{pin}'")
        pinned.append({"id": str(row.id), "name": row.name, "version": row.version})
    return pinned


def requirements_doc(reqs: list[ConnectionRequirement] | None) -> list[dict[str, Any]]:
    return [r.model_dump(exclude_none=True) for r in reqs or []]


async def _policy_id(ctx: ContextDep, tenant_id: str, name: str) -> str:
    head = await ctx.policies.policy_head(tenant_id, name)
    if head is None:
        raise BadRequest(f"unknown policy '{name}'")
    return str(head.policy_id)


@router.post(
    "",
    summary="Create an agent with its first revision",
    response_model=out.AgentCreated,
    responses=errors(401, 403, 409, 422),
)
async def create_agent(body: AgentCreate, op: OperatorDep, ctx: ContextDep) -> out.AgentCreated:
    """A name that already exists is a 409: revisions are appended with POST /v1/agents/{id}/revisions."""
    model = check_harness(body.harness, body.model)
    fields = {
        "harness": body.harness,
        "model": model,
        "runner_image": body.runner_image,
        "system_prompt": body.system_prompt,
        "policy_id": await _policy_id(ctx, op.tenant_id, body.policy),
        "budgets": body.budgets.model_dump() if body.budgets else None,
        "harness_config": body.harness_config.model_dump(exclude_none=True) if body.harness_config else {},
        "default_workspace": workspace_doc(body.default_workspace),
        "capability_bundles": await capability_pins(ctx, op.tenant_id, body.capability_bundles),
        "connection_requirements": requirements_doc(body.connection_requirements),
        "tool_discovery": body.tool_discovery or "eager",
    }
    check_harness_config(body.harness, body.harness_config.model_dump(exclude_none=True) if body.harness_config else {})
    agent, revision = await ctx.agents.create_agent(op.tenant_id, body.name, body.description, fields)
    names = await ctx.policies.policy_names(op.tenant_id)
    return out.AgentCreated(
        agent=out.AgentPublic.model_validate(agent), revision=out.RevisionPublic.of(revision, names)
    )


@router.get("", summary="List agents", response_model=out.AgentList, responses=errors(401, 403))
async def list_agents(op: OperatorDep, ctx: ContextDep) -> out.AgentList:
    """Every agent of the tenant, by name."""
    return out.AgentList(agents=[out.AgentPublic.model_validate(a) for a in await ctx.agents.list_agents(op.tenant_id)])


@router.get(
    "/{ref}",
    summary="An agent (by id or name) with its revisions",
    response_model=out.AgentDetail,
    responses=errors(401, 403, 404),
)
async def get_agent(ref: str, op: OperatorDep, ctx: ContextDep) -> out.AgentDetail:
    """Accepts the agent's id or its name."""
    agent = await ctx.agents.find_agent(op.tenant_id, ref)
    if agent is None:
        raise NotFound()
    names = await ctx.policies.policy_names(op.tenant_id)
    revisions = [out.RevisionPublic.of(r, names) for r in await ctx.agents.revisions(str(agent.id))]
    return out.AgentDetail(agent=out.AgentPublic.model_validate(agent), revisions=revisions)


@router.post(
    "/{ref}/revisions",
    summary="Append a revision",
    response_model=out.RevisionOut,
    responses=errors(401, 403, 404, 409, 422),
)
async def append_revision(ref: str, body: RevisionCreate, op: OperatorDep, ctx: ContextDep) -> out.RevisionOut:
    """Omitted fields inherit from the latest revision; earlier revisions never change."""
    agent = await ctx.agents.find_agent(op.tenant_id, ref)
    if agent is None:
        raise NotFound()
    given = body.model_fields_set
    changes: dict[str, Any] = {}
    latest = (await ctx.agents.revisions(str(agent.id)))[-1]
    harness = body.harness or latest.harness
    if "harness" in given or "model" in given:
        # A harness change re-defaults the model unless one is named.
        model = body.model if "model" in given else (latest.model if harness == latest.harness else None)
        changes["harness"], changes["model"] = harness, check_harness(harness, model)
    if "system_prompt" in given:
        changes["system_prompt"] = body.system_prompt
    if "runner_image" in given:
        changes["runner_image"] = body.runner_image
    if body.policy is not None:
        changes["policy_id"] = await _policy_id(ctx, op.tenant_id, body.policy)
    if "budgets" in given:
        changes["budgets"] = body.budgets.model_dump() if body.budgets else None
    if "default_workspace" in given:
        changes["default_workspace"] = workspace_doc(body.default_workspace)
    if "capability_bundles" in given:  # [] clears
        changes["capability_bundles"] = await capability_pins(ctx, op.tenant_id, body.capability_bundles)
    if "connection_requirements" in given:  # [] clears
        changes["connection_requirements"] = requirements_doc(body.connection_requirements)
    if body.tool_discovery is not None:
        changes["tool_discovery"] = body.tool_discovery
    if "harness_config" in given:
        changes["harness_config"] = body.harness_config.model_dump(exclude_none=True) if body.harness_config else {}
    check_harness_config(harness, dict(changes.get("harness_config", latest.harness_config) or {}))
    revision = await ctx.agents.append_revision(op.tenant_id, str(agent.id), changes)
    names = await ctx.policies.policy_names(op.tenant_id)
    return out.RevisionOut(revision=out.RevisionPublic.of(revision, names))
