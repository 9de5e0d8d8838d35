"""Policies: YAML import and listing. (Publishing, preview and revert arrive with the governance work.)"""

from __future__ import annotations

from typing import Any

import yaml
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.deps import OperatorDep, ServicesDep
from core.errors import BadRequest, NotFound, Unprocessable
from core.policy import parse_policy

router = APIRouter(prefix="/v1/policies", tags=["policies"])


class PolicyImport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
    yaml: str = Field(min_length=1, max_length=1024 * 1024)


@router.post("", summary="Import a policy from YAML")
async def import_policy(body: PolicyImport, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Strict parse; appends a version unless the content is byte-equal to the head."""
    try:
        doc = yaml.safe_load(body.yaml)
    except yaml.YAMLError as exc:
        raise Unprocessable(f"bad policy content: not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise Unprocessable("bad policy content: the document must be a mapping")
    policy = parse_policy(doc)
    if policy.name != body.name:
        raise BadRequest("policy name must match yaml `name`")
    row, appended = await svc.store.import_policy(op.tenant_id, doc, body.yaml)
    return {"policy": row, "appended": appended}


@router.get("", summary="List policies")
async def list_policies(op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """Every policy with its head version."""
    rows = await svc.store.list_policies(op.tenant_id)
    return {"policies": [{**r, "updated_at": r["updated_at"].isoformat()} for r in rows]}


@router.get("/{name}", summary="A policy's head version")
async def get_policy(name: str, op: OperatorDep, svc: ServicesDep) -> dict[str, Any]:
    """The head version's content."""
    head = await svc.store.policy_head(op.tenant_id, name)
    if head is None:
        raise NotFound()
    return {
        "policy": {"id": head["policy_id"], "name": head["name"], "version": head["version"]},
        "content": head["content"],
    }
