"""Agents and their append-only revisions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import OperatorDep, ServicesDep
from api.schemas import (
    AGENT_FIELDS,
    REVISION_FIELDS,
    AgentCreate,
    ConnectionRequirement,
    RevisionCreate,
    WorkspaceIn,
    pick,
)
from core.errors import BadRequest, NotFound
from core.harnesses import check_harness, check_harness_config
from db.models.agents import AgentRevision

router = APIRouter(prefix="/v1/agents", tags=["agents"])


def workspace_doc(ws: WorkspaceIn | None) -> dict[str, Any] | None:
    """Normalize a workspace input; scratch is stored as null."""
    if ws is None or ws.kind in ("scratch", "none"):
        return None
    if not ws.path or not ws.path.startswith("/"):
        raise BadRequest("a local_copy workspace needs an absolute `path`")
    return {"kind": "local_copy", "path": ws.path}


async def capability_pins(svc: ServicesDep, tenant_id: str, pins: list[str] | None) -> list[dict[str, Any]]:
    """Bundle pins: ``name`` pins the newest version now, ``name@N`` exactly N."""
    seen: set[str] = set()
    out = []
    for pin in pins or []:
        name, _, version = pin.partition("@")
        if name in seen:
            raise BadRequest(f"bundle '{name}' is attached more than once")
        seen.add(name)
        if version and not version.isdigit():
            raise BadRequest(f"unknown capability bundle '{pin}'")
        row = await svc.capabilities.resolve(tenant_id, name, int(version) if version else None)
        if row is None:
            raise BadRequest(f"unknown capability bundle '{pin}'")
        out.append({"id": row["id"], "name": row["name"], "version": row["version"]})
    return out


def requirements_doc(reqs: list[ConnectionRequirement] | None) -> list[dict[str, Any]]:
    return [r.model_dump(exclude_none=True) for r in reqs or []]


async def _policy_id(svc: ServicesDep, tenant_id: str, name: str) -> str:
    head = await svc.store.policy_head(tenant_id, name)
    if head is None:
        raise BadRequest(f"unknown policy '{name}'")
    return str(head.policy_id)


def _revision_out(row: AgentRevision, policy_names: dict[str, str]) -> dict[str, Any]:
    out = pick(row.model_dump(), REVISION_FIELDS)
    out["policy"] = policy_names.get(str(row.policy_id))
    return out


@router.post("", summary="Create an agent with its first revision")
async def create_agent(body: AgentCreate, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """A name that already exists is a 409: revisions are appended with POST /v1/agents/{id}/revisions."""
    model = check_harness(body.harness, body.model)
    fields = {
        "harness": body.harness,
        "model": model,
        "runner_image": body.runner_image,
        "system_prompt": body.system_prompt,
        "policy_id": await _policy_id(svc, op.tenant_id, body.policy),
        "budgets": body.budgets.model_dump() if body.budgets else None,
        "harness_config": body.harness_config.model_dump(exclude_none=True) if body.harness_config else {},
        "default_workspace": workspace_doc(body.default_workspace),
        "capability_bundles": await capability_pins(svc, op.tenant_id, body.capability_bundles),
        "connection_requirements": requirements_doc(body.connection_requirements),
    }
    check_harness_config(body.harness, body.harness_config.model_dump(exclude_none=True) if body.harness_config else {})
    agent, revision = await svc.store.create_agent(op.tenant_id, body.name, body.description, fields)
    names = await svc.store.policy_names(op.tenant_id)
    return {"agent": pick(agent.model_dump(), AGENT_FIELDS), "revision": _revision_out(revision, names)}


@router.get("", summary="List agents")
async def list_agents(op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Every agent of the tenant, by name."""
    return {"agents": [pick(a.model_dump(), AGENT_FIELDS) for a in await svc.store.list_agents(op.tenant_id)]}


@router.get("/{ref}", summary="An agent (by id or name) with its revisions")
async def get_agent(ref: str, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Accepts the agent's id or its name."""
    agent = await svc.store.find_agent(op.tenant_id, ref)
    if agent is None:
        raise NotFound()
    names = await svc.store.policy_names(op.tenant_id)
    revisions = [_revision_out(r, names) for r in await svc.store.revisions(str(agent.id))]
    return {"agent": pick(agent.model_dump(), AGENT_FIELDS), "revisions": revisions}


@router.post("/{ref}/revisions", summary="Append a revision")
async def append_revision(ref: str, body: RevisionCreate, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Omitted fields inherit from the latest revision; earlier revisions never change."""
    agent = await svc.store.find_agent(op.tenant_id, ref)
    if agent is None:
        raise NotFound()
    given = body.model_fields_set
    changes: dict[str, Any] = {}
    latest = (await svc.store.revisions(str(agent.id)))[-1]
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
        changes["policy_id"] = await _policy_id(svc, op.tenant_id, body.policy)
    if "budgets" in given:
        changes["budgets"] = body.budgets.model_dump() if body.budgets else None
    if "default_workspace" in given:
        changes["default_workspace"] = workspace_doc(body.default_workspace)
    if "capability_bundles" in given:  # [] clears
        changes["capability_bundles"] = await capability_pins(svc, op.tenant_id, body.capability_bundles)
    if "connection_requirements" in given:  # [] clears
        changes["connection_requirements"] = requirements_doc(body.connection_requirements)
    if "harness_config" in given:
        changes["harness_config"] = body.harness_config.model_dump(exclude_none=True) if body.harness_config else {}
    check_harness_config(harness, dict(changes.get("harness_config", latest.harness_config) or {}))
    revision = await svc.store.append_revision(op.tenant_id, str(agent.id), changes)
    names = await svc.store.policy_names(op.tenant_id)
    return {"revision": _revision_out(revision, names)}
