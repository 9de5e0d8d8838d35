"""Policies: import, inspect, publish (optimistic), revert, clone, delete, validate and preview.

Policies are addressed by name; every change appends a version; runs freeze the head they started
with, so nothing here can change a run already in flight.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from fastapi import APIRouter, Path
from pydantic import Field

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from api.schemas import _Body
from core.errors import BadRequest, NotFound, Unprocessable
from core.policy import parse_policy
from integrations import documents

router = APIRouter(prefix="/v1/policies", tags=["policies"])

NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")
RESERVED = frozenset({"validate", "preview", "clone"})
BLANK_RULES: dict[str, Any] = {"defaults": {"tool_action": "approve"}, "tools": []}
# Versions are PostgreSQL integers: a larger number is a 400, not a driver overflow (500).
INT4_MAX = 2**31 - 1


class PolicyImport(_Body):
    name: str
    yaml: str = Field(min_length=1, max_length=1024 * 1024)


class PolicyPublish(_Body):
    content: dict[str, Any]
    summary: str = ""
    base_version: int = Field(ge=1, le=INT4_MAX)


class PolicyRevert(_Body):
    version: int = Field(ge=1, le=INT4_MAX)
    base_version: int = Field(ge=1, le=INT4_MAX)


class PolicyClone(_Body):
    name: str
    from_: str | None = Field(default=None, alias="from")
    from_version: int | None = Field(default=None, ge=1, le=INT4_MAX)


class PolicyYaml(_Body):
    yaml: str = Field(min_length=1, max_length=1024 * 1024)


class PolicyPreview(_Body):
    content: dict[str, Any]
    name: str | None = None


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise BadRequest("policy names are 1-64 characters of a-z A-Z 0-9 . _ - and do not start with '.'")
    if name in RESERVED:
        raise BadRequest(f"'{name}' is reserved by the policies API — pick another name")


def load_yaml(text: str) -> dict[str, Any]:
    try:
        doc = documents.load_yaml(text)
    except documents.DocumentError as exc:
        raise Unprocessable(f"bad policy content: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise Unprocessable(f"bad policy content: not valid YAML{where}") from None
    if not isinstance(doc, dict):
        raise Unprocessable("bad policy content: the document must be a mapping")
    return doc


@router.post(
    "",
    summary="Import a policy from YAML",
    response_model=out.PolicyImported,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 409, 422),
)
async def import_policy(body: PolicyImport, op: OperatorDep, ctx: ContextDep) -> out.PolicyImported:
    """Strict parse; creates the policy or appends a version unless the content is byte-equal."""
    check_name(body.name)
    doc = load_yaml(body.yaml)
    if parse_policy(doc).name != body.name:
        raise BadRequest("policy name must match yaml `name`")
    row, appended = await ctx.policies.import_policy(op.tenant_id, doc, body.yaml)
    return out.PolicyImported(policy=out.PolicyMeta.of(row), appended=appended)


@router.get(
    "",
    summary="List policies",
    response_model=out.PolicyList,
    response_model_exclude_unset=True,
    responses=errors(401, 403),
)
async def list_policies(op: OperatorDep, ctx: ContextDep) -> out.PolicyList:
    """Every policy: head version, autonomy summary and how many agents use it."""
    rows = await ctx.policies.list_policies(op.tenant_id)
    return out.PolicyList(policies=[out.PolicySummary.listing(r) for r in rows])


@router.post(
    "/validate",
    summary="Validate a YAML policy without storing it",
    response_model=out.PolicyValid,
    responses=errors(401, 403, 422),
)
async def validate(body: PolicyYaml, op: OperatorDep) -> out.PolicyValid:
    """200 with the policy's name when valid; 422 naming the problem otherwise."""
    policy = parse_policy(load_yaml(body.yaml))
    return out.PolicyValid(valid=True, name=policy.name)


@router.post(
    "/preview",
    summary="What a draft would do to every tool",
    response_model=out.PolicyPreviewOut,
    responses=errors(401, 403, 404, 422),
)
async def preview(body: PolicyPreview, op: OperatorDep, ctx: ContextDep) -> out.PolicyPreviewOut:
    """Strict-parses the draft and returns its per-tool verdict matrix; persists nothing."""
    policy = parse_policy(body.content)
    head = await ctx.policies.policy_head(op.tenant_id, body.name) if body.name is not None else None
    if body.name is not None and head is None:
        raise NotFound()
    # The brokered (mcp__) tools of the agents using it (every agent's, for an unnamed draft), with their
    # access classes: what a run bound now would freeze.
    tools = await ctx.connections.requirement_classes(op.tenant_id, str(head.policy_id) if head else None)
    return out.PolicyPreviewOut.of(policy, tools)


@router.post(
    "/clone",
    summary="Create a policy from another one, or blank",
    response_model=out.PolicyOut,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 409, 422),
)
async def clone(body: PolicyClone, op: OperatorDep, ctx: ContextDep) -> out.PolicyOut:
    """A blank policy is fail-safe: no rules, so every tool asks a human."""
    check_name(body.name)
    if body.from_version is not None and body.from_ is None:
        raise BadRequest("`from_version` needs `from` — a blank policy has no source version")
    if body.from_ is None:
        content = {"name": body.name, **BLANK_RULES}
        summary = "created blank"
    else:
        detail = await ctx.policies.policy_detail(op.tenant_id, body.from_)
        if detail is None:
            raise BadRequest(f"unknown source policy '{body.from_}'")
        wanted = body.from_version or detail.versions[0].version
        source = next((v for v in detail.versions if v.version == wanted), None)
        if source is None:
            raise BadRequest(f"source policy '{body.from_}' has no v{wanted}")
        content = {**source.content, "name": body.name}
        summary = f"cloned from '{body.from_}' v{wanted}"
    parse_policy(content)
    row = await ctx.policies.create_policy(op.tenant_id, content, summary, "api")
    return out.PolicyOut(policy=out.PolicyMeta.of(row))


@router.get(
    "/{name}",
    summary="A policy: head content, versions, users and its matrix",
    response_model=out.PolicyDetail,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404),
)
async def get_policy(name: str, op: OperatorDep, ctx: ContextDep) -> out.PolicyDetail:
    """Versions are newest first; the matrix shows what the head does to every tool."""
    detail = await ctx.policies.policy_detail(op.tenant_id, name)
    if detail is None:
        raise NotFound()
    return out.PolicyDetail.of(detail, await ctx.connections.requirement_classes(op.tenant_id, str(detail.policy.id)))


@router.get(
    "/{name}/versions/{version}",
    summary="One version, as JSON and as YAML",
    response_model=out.PolicyVersionOut,
    responses=errors(401, 403, 404),
)
async def get_version(
    name: str, op: OperatorDep, ctx: ContextDep, version: int = Path(ge=1, le=INT4_MAX)
) -> out.PolicyVersionOut:
    """``yaml`` is the imported source when there is one, otherwise generated from the content."""
    row = await ctx.policies.policy_version(op.tenant_id, name, version)
    if row is None:
        raise NotFound()
    return out.PolicyVersionOut.of(row)


@router.post(
    "/{name}/publish",
    summary="Publish a new version (optimistic concurrency)",
    response_model=out.PolicyOut,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409, 422),
)
async def publish(name: str, body: PolicyPublish, op: OperatorDep, ctx: ContextDep) -> out.PolicyOut:
    """409 when the head moved since ``base_version``: a retried publish can never create two versions."""
    policy = parse_policy(body.content)
    if policy.name != name:
        raise BadRequest("the content's `name` must equal the policy being published")
    summary = body.summary.strip()
    if not summary or len(summary) > 500:
        raise BadRequest("a publish needs a non-empty summary — say what changed and why")
    row = await ctx.policies.append_policy_version(
        op.tenant_id, name, body.content, base_version=body.base_version, summary=summary, author="api"
    )
    return out.PolicyOut(policy=out.PolicyMeta.of(row))


@router.post(
    "/{name}/revert",
    summary="Make an old version the head again",
    response_model=out.PolicyOut,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409),
)
async def revert(name: str, body: PolicyRevert, op: OperatorDep, ctx: ContextDep) -> out.PolicyOut:
    """Moves forward: appends the old version's content as a new head."""
    old = await ctx.policies.policy_version(op.tenant_id, name, body.version)
    if old is None:
        raise NotFound()
    row = await ctx.policies.append_policy_version(
        op.tenant_id,
        name,
        old.content,
        base_version=body.base_version,
        summary=f"revert to v{body.version}",
        author="api",
        yaml_source=old.yaml_source,
    )
    return out.PolicyOut(policy=out.PolicyMeta.of(row))


@router.delete(
    "/{name}",
    summary="Delete a policy no agent revision names",
    response_model=out.PolicyDeleted,
    responses=errors(401, 403, 404, 409),
)
async def delete(name: str, op: OperatorDep, ctx: ContextDep) -> out.PolicyDeleted:
    """409 while any agent revision, historical ones included, names it."""
    deleted = await ctx.policies.delete_policy(op.tenant_id, name)
    return out.PolicyDeleted(deleted=out.PolicyRef.model_validate(deleted))
