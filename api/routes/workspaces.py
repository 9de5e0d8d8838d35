"""The runner plane for sandboxes off the worker's host: the bootstrap exchange and the workspace archives.

A Kubernetes sandbox holds no run token at start, only a one-time bootstrap credential (a Secret mount):
``POST /internal/sessions/{id}/bootstrap`` spends it and answers the run's tokens, which the runner keeps
in memory. With its ``workspace``-audience token it then downloads the prepared tree
(``GET …/workspace``, the digest in ``X-Fluidbox-Sha256`` and in its spec) and, before its result,
uploads the final state (``PUT …/workspace``); the control plane computes the diff from the two.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Request, Response

from api.deps import ContextDep, bearer, run_token
from api.errors import RunnerErrorBody, errors, json_errors
from core.contract import WORKSPACE_DIGEST_HEADER, BootstrapTokens, WorkspaceStored
from core.digests import sha256_hex
from core.errors import BadRequest, Conflict, NotFound, Unauthorized
from core.states import is_terminal
from core.tokens import RUN_AUDIENCES, Audience

router = APIRouter(prefix="/internal", tags=["internal"])
ARCHIVE_TYPE = "application/gzip"
BINARY = {"type": "string", "format": "binary"}


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """No or unknown token (401), the wrong audience (403), a token of another run (404), and ``statuses``."""
    return errors(401, 403, 404, *statuses, model=RunnerErrorBody)


@router.post(
    "/sessions/{run_id}/bootstrap",
    summary="Trade the one-time bootstrap credential for the run's tokens",
    response_model=BootstrapTokens,
    responses=errors(401, 404, 409, model=RunnerErrorBody),
)
async def bootstrap(run_id: str, request: Request, ctx: ContextDep) -> BootstrapTokens:
    """Spends the credential (a second exchange is 401) and mints the run's tokens afresh, revoking any
    earlier set: the Pod's credential is worth one set of tokens, held in the runner's memory only."""
    token = bearer(request)
    if token is None:
        raise Unauthorized()
    grant = await ctx.tokens.burn_bootstrap(token)
    if grant is None:
        raise Unauthorized("unauthorized: the bootstrap credential is unknown, expired or already spent")
    if str(grant.session_id) != run_id.lower():
        raise NotFound()
    if is_terminal(grant.status):
        raise Conflict(f"the run is {grant.status}: no tokens for it", session_status=grant.status)
    randoms = {aud.value: secrets.token_hex(16) for aud in RUN_AUDIENCES}
    tokens = await ctx.tokens.mint_tokens(str(grant.tenant_id), run_id, ctx.settings.token_ttl_secs, randoms)
    return BootstrapTokens(
        control=tokens["control"], tool=tokens["tool"], llm=tokens.get("llm"), workspace=tokens["workspace"]
    )


@router.get(
    "/sessions/{run_id}/workspace",
    summary="Download the prepared workspace (a gzip'd tar; its sha256 in X-Fluidbox-Sha256)",
    response_class=Response,
    responses={
        200: {"content": {ARCHIVE_TYPE: {"schema": BINARY}}, "description": "the archive"},
        **json_errors(401, 403, 404),
    },
)
async def download(run_id: str, request: Request, ctx: ContextDep) -> Response:
    """The tree the worker prepared; the runner checks its digest against its spec before unpacking it."""
    await run_token(request, ctx, run_id, Audience.WORKSPACE)
    archive = await ctx.archives.get(run_id, "initial")
    if archive is None:
        raise NotFound("this run has no prepared workspace archive (its sandbox binds the workspace)")
    return Response(archive.data, media_type=ARCHIVE_TYPE, headers={WORKSPACE_DIGEST_HEADER: archive.sha256})


@router.put(
    "/sessions/{run_id}/workspace",
    summary="Upload the final workspace (a gzip'd tar) before the result",
    response_model=WorkspaceStored,
    responses=refusals(400, 409, 413, 415),
    # Documented as octet-stream, which generic clients can send; application/gzip is accepted as well.
    openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {"schema": BINARY}}}},
)
async def upload(run_id: str, request: Request, ctx: ContextDep) -> WorkspaceStored:
    """Stored as sent once its digest checks out; the worker that finalizes the run unpacks it (safely)
    and diffs it against the prepared tree. A re-sent upload replaces the earlier one."""
    principal = await run_token(request, ctx, run_id, Audience.WORKSPACE)
    if is_terminal(principal.status):
        raise Conflict("session is not active: its changes are already recorded", session_status=principal.status)
    claimed = (request.headers.get(WORKSPACE_DIGEST_HEADER) or "").lower()
    if not claimed:
        raise BadRequest(f"missing {WORKSPACE_DIGEST_HEADER}: the archive's sha256")
    data = await request.body()
    if not data:
        raise BadRequest("empty workspace archive")
    actual = sha256_hex(data)
    if actual != claimed:
        raise BadRequest(f"{WORKSPACE_DIGEST_HEADER} does not match the archive (got {actual})")
    stored = await ctx.archives.put(run_id, "final", data)
    return WorkspaceStored(sha256=stored.sha256, size=stored.size)
