"""Connections: one custodied credential for an MCP server, and photographs of its tools.

The credential is sealed at rest and never returned; it is unsealed only by the control plane, at
the moment it photographs the server or executes a brokered call.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from api import responses as out
from api.deps import ContextDep, Principal, PrincipalDep
from api.errors import errors
from api.views import connection_public as public
from api.views import snapshot_public
from core.access import definition, definition_diff, from_catalog, parse_access, with_access
from core.bindings import same_url
from core.errors import BadRequest, Conflict, Forbidden, NotFound, Unprocessable, found
from db.connections import ConnectionRow
from db.models.connections import ConnectionToolChange, ConnectionToolSnapshot
from integrations.oauth import OAuthClientError
from integrations.transports._auth import validate_auth as auth_problem
from integrations.transports.openapi import config_problem as openapi_config_problem
from integrations.transports.stdio import validate_config as stdio_config_problem
from integrations.urls import UrlRefused
from services.connections import READ_ONLY_SIGN_IN, Ownership, unavailable
from services.context import AppContext

router = APIRouter(prefix="/v1/connections", tags=["connections"])

TRANSPORTS = ("mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli", "git")
NO_SANDBOX_CREDENTIAL = (
    "a sandbox_cli connection carries no credential, so it takes no {field}: its tools run inside the sandbox, "
    "which never holds one (a CLI that needs a credential belongs behind a brokered transport)"
)

# RFC 6749 §3.3 scope-token: printable ASCII except space, double quote and backslash.
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
# Only ``…_MCP_TOKEN`` variables, never the control plane's own (FLUIDBOX_*): a connection must not be able to
# send the credential key or the LLM key to a server.
ENV_VAR = r"^[A-Z][A-Z0-9_]{0,100}_MCP_TOKEN$"


def _not_ours(var: str | None) -> str | None:
    if var is not None and var.startswith("FLUIDBOX_"):
        raise ValueError("`credential_env` cannot name a FLUIDBOX_ variable")
    return var


class ConnectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: str | None = None
    # Which provider speaks to the server (docs/api.md "Transports"); ``provider`` may name it too.
    transport: Literal["mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli", "git"] | None = None
    transport_config: dict[str, Any] | None = None
    base_url: str | None = Field(default=None, min_length=1, max_length=2048)
    display_name: str | None = Field(default=None, max_length=200)
    auth_kind: Literal["static", "oauth"] = "static"
    token: SecretStr | None = None
    header_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
    scheme: Literal["Bearer", "Basic", ""] = "Bearer"
    owner: Literal["organization", "personal"] = "organization"
    client_id: str | None = Field(default=None, max_length=2048)
    client_secret: SecretStr | None = None
    scopes: list[str] | None = Field(default=None, min_length=1, max_length=50)
    access: Any = Field(
        default=None,
        description="Which tools read and which write: `{read: {tools: [globs]} | true | false, write: "
        "{tools: [globs], approval: always|policy} | false}`. Omitted: no tool is classified, so none is callable "
        "(an OpenAPI or HTTP operation keeps its method's class).",
    )
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=64)  # a sandbox_cli connection's tools
    credential_env: str | None = Field(
        default=None,
        pattern=ENV_VAR,
        description="Take the static credential from this environment variable of the control plane "
        "(`<PROVIDER>_MCP_TOKEN`) instead of `token`: configuration, never stored; unset → `Missing <VAR>`.",
    )
    _env = field_validator("credential_env")(classmethod(lambda cls, v: _not_ours(v)))


class ConnectionPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    access: Any = Field(description="The new access declaration (replaces the old one; future runs only).")


class CredentialReplace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: SecretStr | None = None
    credential_env: str | None = Field(default=None, pattern=ENV_VAR)
    _env = field_validator("credential_env")(classmethod(lambda cls, v: _not_ours(v)))


async def visible(ctx: AppContext, who: Principal, connection_id: str) -> ConnectionRow:
    """The connection if the caller may see it: someone else's personal connection is 404 for
    everyone, the operator and admins included."""
    row = await ctx.connections.get(who.tenant_id, connection_id)
    if row is None or (row.owner_type == "user" and str(row.owner_user_id) != who.user_id):
        raise NotFound()
    return row


def require_manage(who: Principal, row: ConnectionRow, action: str) -> None:
    """A personal connection is managed by its owner (visibility already proved that); an
    organization connection by the operator, an admin or an owner."""
    if row.owner_type != "user" and not who.mutates_resources:
        raise Forbidden(f"{action} an organization connection requires the admin or owner role")


async def manageable(ctx: AppContext, who: Principal, connection_id: str, action: str) -> ConnectionRow:
    """The connection if the caller may see it (:func:`visible`) and manage it (:func:`require_manage`)."""
    row = await visible(ctx, who, connection_id)
    require_manage(who, row, action)
    return row


@router.post(
    "",
    summary="Connect a server over MCP, OpenAPI, HTTP endpoints or stdio MCP (credential sealed, tools photographed)",
    response_model=out.ConnectionCreated,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 409, 422, 502, 503),
)
async def create_connection(body: ConnectionCreate, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """A rejected credential or a refused photograph stores nothing. ``owner: personal`` makes a
    connection only its creator can see or use (any signed-in user; never the operator). A usable new
    connection wakes every run parked for a connection to its URL, whatever its transport."""
    transport = body.transport or body.provider or "mcp_http"
    if body.transport is not None and body.provider not in (None, body.transport, "mcp_http"):
        raise BadRequest(f"`provider` '{body.provider}' and `transport` '{body.transport}' disagree")
    if transport not in TRANSPORTS:
        raise BadRequest(f"unsupported provider '{transport}' (supported: {', '.join(TRANSPORTS)})")
    access = parse_access(body.access) if body.access is not None else None
    if transport == "git":
        row, snapshot = await _create_git(body, who, ctx)
    elif transport in ("relay", "sandbox_cli"):
        row, snapshot = await _create_device_or_cli(body, transport, who, ctx, access)
    else:
        if body.tools is not None:
            raise BadRequest("`tools` apply to sandbox_cli connections only")
        ctx.connection_service.custody()
        if transport == "mcp_http":
            row, snapshot = await _create_mcp_http(body, who, ctx, access)
        else:
            row, snapshot = await _create_described(body, transport, who, ctx, access)
    if snapshot is None:  # a pending oauth connection: usable after its first sign-in
        return {"connection": public(row), "next": f"/v1/connections/{row.id}/oauth/start"}
    await ctx.run_control.wake_parked(who.tenant_id, row)
    return {"connection": public(row), "snapshot": snapshot_public(snapshot)}


Created = tuple[ConnectionRow, ConnectionToolSnapshot | None]  # the row, and its first snapshot (None: pending oauth)


def _check_owner(body: ConnectionCreate, who: Principal) -> None:
    if body.owner == "personal" and who.is_operator:
        raise BadRequest("a personal connection belongs to a signed-in user; the operator token has none")
    if body.owner == "organization" and not who.mutates_resources:
        raise Forbidden("creating an organization connection requires the admin or owner role")


STDIO_OPERATOR = (
    "a stdio connection runs its command on the control plane's hosts, unsandboxed: only the operator (admin "
    "token) can create one"
)


def _check_env_reader(who: Principal) -> None:
    """``credential_env`` reads the control plane's own environment, which is the operator's."""
    if not who.is_operator:
        raise Forbidden(
            "`credential_env` reads the control plane's environment: only the operator (admin token) may name one"
        )


def _owner_user_id(body: ConnectionCreate, who: Principal) -> str | None:
    return who.user_id if body.owner == "personal" else None


def _made(body: ConnectionCreate, who: Principal, access: dict[str, Any] | None) -> Ownership:
    return Ownership(body.display_name, _owner_user_id(body, who), who.user_id, access)


def _check_oauth_client(body: ConnectionCreate) -> None:
    if body.token is not None:
        raise BadRequest("an oauth connection takes no `token`: it is obtained by signing in")
    if body.client_secret is not None and body.client_id is None:
        raise BadRequest("`client_secret` needs the `client_id` it was issued with")
    if body.scopes is not None and not all(_SCOPE.fullmatch(scope) for scope in body.scopes):
        raise BadRequest("`scopes` must be non-empty OAuth scope tokens (no spaces or quotes)")


def _check_no_oauth_client(body: ConnectionCreate) -> None:
    if body.client_id is not None or body.client_secret is not None or body.scopes is not None:
        raise BadRequest("`client_id`, `client_secret` and `scopes` apply to oauth connections only")


async def _preregistered(ctx: AppContext, who: Principal, body: ConnectionCreate, row: ConnectionRow) -> Created:
    """A pending oauth connection, with the client id (or scopes) it was given registered first; a client id
    the server will not take removes the connection again."""
    if body.client_id is not None or body.scopes:
        try:
            await ctx.connection_service.oauth_connect().preregister(
                who.tenant_id, row, client_id=body.client_id, client_secret=body.client_secret, scopes=body.scopes
            )
        except (OAuthClientError, UrlRefused) as err:
            await ctx.connections.discard_pending_oauth(who.tenant_id, str(row.id))
            raise BadRequest(f"cannot use this client id with this server: {err}") from None
    return row, None


async def _create_mcp_http(
    body: ConnectionCreate, who: Principal, ctx: AppContext, access: dict[str, Any] | None
) -> Created:
    if body.transport_config is not None:
        raise BadRequest("`transport_config` applies to openapi, http, stdio and relay connections only")
    if body.base_url is None:
        raise BadRequest("an mcp_http connection needs a `base_url`")
    _check_owner(body, who)
    if body.auth_kind == "oauth":
        _check_oauth_client(body)
        if body.header_name is not None or body.scheme != "Bearer":
            raise BadRequest(
                "an oauth connection sends `Authorization: Bearer`; `header_name` and `scheme` do not apply"
            )
        row = await ctx.connection_service.connect_oauth(
            who.tenant_id, base_url=body.base_url, made=_made(body, who, access)
        )
        return await _preregistered(ctx, who, body, row)
    _check_no_oauth_client(body)
    if body.credential_env is not None:
        _check_env_reader(who)
        if body.token is not None:
            raise BadRequest("give either `token` or `credential_env`, not both")
        return await ctx.connection_service.connect_env(
            who.tenant_id,
            base_url=body.base_url,
            credential_env=body.credential_env,
            header_name=body.header_name,
            scheme=body.scheme,
            made=_made(body, who, access),
        )
    if body.token is None or not body.token.get_secret_value():
        raise BadRequest("a static connection needs a `token` (or `credential_env`)")
    return await ctx.connection_service.connect_static(
        who.tenant_id,
        base_url=body.base_url,
        token=body.token.get_secret_value(),
        header_name=body.header_name,
        scheme=body.scheme,
        made=_made(body, who, access),
    )


async def _create_git(body: ConnectionCreate, who: Principal, ctx: AppContext) -> Created:
    """A credential for cloning private repositories under ``base_url`` (a ``git_repository`` workspace names
    it): sealed, never photographed (a git server has no tools), never sent to the sandbox."""
    _check_owner(body, who)
    if body.auth_kind != "static" or body.client_id is not None or body.client_secret is not None or body.scopes:
        raise BadRequest("a git connection takes no OAuth settings")
    if body.access is not None or body.tools is not None or body.transport_config:
        raise BadRequest("a git connection has no tools: it takes no `access`, `tools` or `transport_config`")
    if body.header_name is not None or body.credential_env is not None:
        raise BadRequest("a git connection takes a `token` (and `scheme`), no `header_name` or `credential_env`")
    if body.base_url is None:
        raise BadRequest("a git connection needs a `base_url`: the https:// prefix of the repositories it clones")
    if body.token is None or not body.token.get_secret_value():
        raise BadRequest("a git connection needs a `token` (`user:token` with scheme Basic, or a Bearer token)")
    return await ctx.connection_service.connect_git(
        who.tenant_id, base_url=body.base_url, token=body.token.get_secret_value(), scheme=body.scheme,
        made=_made(body, who, None),
    )  # fmt: skip


async def _create_device_or_cli(
    body: ConnectionCreate, transport: str, who: Principal, ctx: AppContext, access: dict[str, Any] | None
) -> Created:
    """A relay (a sealed credential, admitted https URL, bounded timeout) or a sandbox CLI (declared tools, no
    credential at all)."""
    if body.owner == "personal" and who.is_operator:
        raise BadRequest("a personal connection belongs to a signed-in user; the operator token has none")
    if not who.mutates_resources:
        raise Forbidden("creating an organization connection requires the admin or owner role")
    if body.auth_kind != "static" or body.client_id is not None or body.client_secret is not None or body.scopes:
        raise BadRequest(f"a {transport} connection takes no OAuth settings")
    if body.header_name is not None or body.scheme != "Bearer":
        raise BadRequest(f"a {transport} connection sends no custom header or scheme")
    if body.base_url is None:
        raise BadRequest(f"a {transport} connection needs a `base_url`")
    if transport == "sandbox_cli":
        if body.token is not None or body.credential_env is not None:
            raise BadRequest(
                NO_SANDBOX_CREDENTIAL.format(field="`token`" if body.token is not None else "`credential_env`")
            )
        if body.transport_config:
            raise BadRequest("a sandbox_cli connection declares its `tools`; it has no `transport_config`")
        if body.owner == "personal":
            raise BadRequest("a sandbox_cli connection is an organization connection")
        return await ctx.connection_service.connect_sandbox_cli(
            who.tenant_id, base_url=body.base_url, tools=body.tools, made=_made(body, who, access)
        )
    if body.tools is not None:
        raise BadRequest("a relay connection photographs its tools; it takes no `tools`")
    if body.credential_env is not None:
        raise BadRequest("a relay connection's credential is its `token` (sealed); it takes no `credential_env`")
    if body.token is None or not body.token.get_secret_value():
        raise BadRequest("a relay connection needs the relay's `token`")
    return await ctx.connection_service.connect_relay(
        who.tenant_id,
        base_url=body.base_url,
        token=body.token.get_secret_value(),
        config=body.transport_config,
        display_name=body.display_name,
        owner_user_id=_owner_user_id(body, who),
        created_by_user_id=who.user_id,
        access=access,
    )


async def _create_described(
    body: ConnectionCreate, transport: str, who: Principal, ctx: AppContext, access: dict[str, Any] | None
) -> Created:
    """An ``openapi``, ``http`` or ``stdio`` connection: its configuration is checked, its tools photographed
    through its provider, then it is stored like any static connection (the credential sealed). An ``openapi``
    or ``http`` one may sign in with the OAuth connect of MCP connections instead (the API's base URL must
    answer 401 and publish its protected resource metadata, RFC 9728)."""
    config = dict(body.transport_config or {})
    if transport == "stdio":
        # Its command runs on the API and worker hosts, unsandboxed, as their account (root in a root stack),
        # starting with this create's photograph: the host belongs to the operator token, never to an org role.
        if not who.is_operator:
            raise Forbidden(STDIO_OPERATOR)
        _check_owner(body, who)
        problem = stdio_config_problem(config)
        if problem is not None:
            raise Unprocessable(problem)
    else:
        problem = auth_problem(config.get("auth"))
        if problem is not None:
            raise Unprocessable(problem)
        _check_owner(body, who)
    if body.auth_kind == "oauth" and transport == "stdio":
        raise BadRequest("a stdio connection takes its credential through `credential_env`, not OAuth")
    if body.auth_kind != "oauth":
        _check_no_oauth_client(body)
    base_url = body.base_url
    if transport == "stdio":
        name = re.sub(r"[^a-z0-9-]+", "-", (body.display_name or str(config.get("command", ""))).lower()).strip("-")
        base_url = base_url or f"stdio://{name or 'server'}"
        if not base_url.startswith("stdio://"):
            raise Unprocessable("a stdio connection's `base_url` (its name for requirements) must start with stdio://")
    elif transport == "openapi":
        problem = openapi_config_problem(config)
        if problem is not None:
            raise Unprocessable(problem)
        base_url = base_url or await ctx.connection_service.openapi_base_url(config)
    elif transport == "http" and not isinstance(config.get("endpoints"), list):
        raise Unprocessable("an http connection needs `endpoints` (method, path, arguments, access)")
    if base_url is None:
        raise BadRequest(f"an {transport} connection needs a `base_url`")
    if body.auth_kind == "oauth":
        _check_oauth_client(body)
        if config.get("auth", {"type": "oauth"}).get("type") != "oauth":
            raise Unprocessable("an oauth connection's `auth` must be {type: oauth} (or left out)")
        row = await ctx.connection_service.connect_oauth(
            who.tenant_id,
            base_url=base_url,
            made=_made(body, who, access),
            transport=transport,
            transport_config={**config, "auth": {"type": "oauth"}},
        )
        return await _preregistered(ctx, who, body, row)
    auth = config.get("auth") or {}
    token = body.token.get_secret_value() if body.token is not None else ""
    if not token and transport != "stdio" and auth.get("type", "bearer") != "none":
        raise BadRequest(f"this connection's auth ({auth.get('type', 'bearer')}) needs a `token`")
    return await ctx.connection_service.connect_static(
        who.tenant_id,
        base_url=base_url,
        token=token,
        header_name=body.header_name,
        scheme="Basic" if auth.get("type") == "basic" else body.scheme,
        made=_made(body, who, access),
        transport=transport,
        transport_config=config,
    )


@router.get(
    "/authorize",
    summary="Start or poll a connection's authorization",
    response_model=out.ConnectionAuthorize,
    response_model_exclude_none=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def authorize(
    who: PrincipalDep,
    ctx: ContextDep,
    connection: str = Query(min_length=1, max_length=128, description="A connection id or a catalog slug."),
    owner: Literal["organization", "personal"] = "organization",
) -> dict[str, Any]:
    """``connected``; ``authorize`` with the sign-in ``url`` (a pending flow's link is reused, so calling
    again mints no new flow and doubles as a poll); or 409 ``{status: "unavailable", reason}``.

    A read-only token polls only: ``connected`` and ``unavailable`` as for anyone, but 403 where the answer
    would make a connection or hand out a sign-in link (a bearer link: whoever opens it connects the account
    they sign in with), since a GET must not do what the token could not do otherwise."""
    if owner == "personal" and who.user_id is None:
        raise unavailable("a personal connection needs a signed-in user; the operator token has none")
    try:
        uuid.UUID(connection)
    except ValueError:
        row = await _catalog_connection(ctx, who, connection, owner)
    else:
        row = await visible(ctx, who, connection)
    require_manage(who, row, "authorizing")
    return await ctx.connection_service.authorize(who.tenant_id, row, who.user_id, signs_in=not who.read_only)


async def _catalog_connection(ctx: AppContext, who: Principal, slug: str, owner: str) -> ConnectionRow:
    """The connection serving catalog entry ``slug`` for this caller: the newest to its URL (active first), or
    one made now (a pending oauth connection; a static one from its ``credential_env``; never for a read-only
    token)."""
    entry = found(await ctx.catalog.get(who.tenant_id, slug))
    if not entry.url:
        raise unavailable(f"'{slug}' has no URL to connect to (no auth definition)")
    personal = owner == "personal"
    rows = [
        r
        for r in await ctx.connections.all(who.tenant_id, who.user_id)
        if same_url(r.base_url, entry.url) and (r.owner_type == "user") == personal and r.status != "revoked"
    ]
    rows.sort(key=lambda r: r.status != "active")
    if rows:
        return rows[0]
    owner_user_id = who.user_id if personal else None
    if not personal and not who.mutates_resources:  # checked before anything is created
        raise Forbidden("authorizing an organization connection requires the admin or owner role")
    if who.read_only:
        raise Forbidden(READ_ONLY_SIGN_IN)
    made = Ownership(entry.name, owner_user_id, who.user_id, from_catalog(entry.access))
    if entry.auth_mode == "oauth":
        return await ctx.connection_service.connect_oauth(who.tenant_id, base_url=entry.url, made=made)
    hints = entry.auth_hints or {}
    env = hints.get("credential_env")
    if not env:
        raise unavailable(
            f"'{slug}' has no auth definition to start: connect it with a token (POST /v1/catalog/{slug}/connect)"
        )
    row, _ = await ctx.connection_service.connect_env(
        who.tenant_id, base_url=entry.url, credential_env=env, header_name=hints.get("header_name"),
        scheme=hints.get("scheme", "Bearer"), made=made,
    )  # fmt: skip
    return row


@router.put(
    "/{connection_id}/credential",
    summary="Give a static connection a new credential",
    response_model=out.ConnectionCreated,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def replace_credential(
    connection_id: str, body: CredentialReplace, who: PrincipalDep, ctx: ContextDep
) -> dict[str, Any]:
    """Photographed with the new credential first (a rejected one changes nothing), then sealed: the connection
    is active again (also after a revocation) at the next authorization generation, and every run parked on it
    resumes. Runs bound under the old generation that do not park fail closed."""
    if (body.token is None or not body.token.get_secret_value()) == (body.credential_env is None):
        raise BadRequest("give exactly one of `token` or `credential_env`")
    row = await visible(ctx, who, connection_id)
    require_manage(who, row, "changing the credential of")
    if body.credential_env is not None:
        _check_env_reader(who)
    if row.transport == "sandbox_cli":
        raise BadRequest(NO_SANDBOX_CREDENTIAL.format(field="credential"))
    updated, snapshot = await ctx.connection_service.replace_credential(
        who.tenant_id,
        row,
        token=body.token.get_secret_value() if body.token else None,
        credential_env=body.credential_env,
    )
    await ctx.run_control.wake_parked(who.tenant_id, updated)
    return {"connection": public(updated), "snapshot": snapshot_public(snapshot)}


@router.post(
    "/{connection_id}/oauth/start",
    summary="Start (or redo) an OAuth connection's sign-in",
    response_model=out.GoUrl,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def oauth_start(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """A one-time ``go_url`` (600 s) to open in the browser that signs in; reconnecting bumps the generation."""
    ctx.connection_service.oauth_connect()
    row = await manageable(ctx, who, connection_id, "connecting")
    if row.auth_kind != "oauth":
        raise BadRequest("this connection does not use OAuth")
    if row.status == "revoked":
        raise Conflict("connection is revoked")
    return {"go_url": await ctx.connection_service.start_sign_in(who.tenant_id, row, who.user_id)}


@router.get("", summary="List connections", response_model=out.ConnectionList, responses=errors(401))
async def list_connections(who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """Organization connections and the caller's own personal ones; never includes a secret."""
    return {"connections": [public(r) for r in await ctx.connections.all(who.tenant_id, who.user_id)]}


@router.get("/{connection_id}", summary="A connection", response_model=out.ConnectionOut, responses=errors(401, 404))
async def get_connection(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """404 when unknown or not visible."""
    return {"connection": public(await visible(ctx, who, connection_id))}


@router.patch(
    "/{connection_id}",
    summary="Edit a connection's tool access classes",
    response_model=out.ConnectionOut,
    responses=errors(401, 403, 404, 422),
)
async def edit_connection(
    connection_id: str, body: ConnectionPatch, who: PrincipalDep, ctx: ContextDep
) -> dict[str, Any]:
    """Replaces ``access`` (422 naming the problem when malformed); runs already bound keep the classes
    they froze. Enabling writes on a catalog connection is this explicit edit."""
    row = await visible(ctx, who, connection_id)
    require_manage(who, row, "editing")
    access = parse_access(body.access)
    return {"connection": public(await ctx.connections.set_access(who.tenant_id, connection_id, access))}


@router.post(
    "/{connection_id}/revoke",
    summary="Revoke a connection",
    response_model=out.ConnectionOut,
    responses=errors(401, 403, 404, 409),
)
async def revoke(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """The sealed credential is destroyed; in-flight runs fail closed on their next brokered call."""
    await manageable(ctx, who, connection_id, "revoking")
    # An OAuth grant is also revoked at its authorization server (RFC 7009), best effort, after ours is gone.
    upstream = await ctx.oauth.revocation(who.tenant_id, connection_id) if ctx.oauth is not None else None
    revoked = await ctx.connections.revoke(who.tenant_id, connection_id)
    ctx.connection_service.evict_token(connection_id)
    if upstream is not None:
        await upstream()
    return {"connection": public(revoked)}


@router.get(
    "/{connection_id}/tools",
    summary="The latest tool snapshot",
    response_model=out.SnapshotOut,
    responses=errors(401, 404),
)
async def tools(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """Names and descriptions of the photographed tools, with the snapshot's version and digest; each
    tool with its access class under the connection's declaration and whether new runs may bind it
    (``review: approved``) or it is quarantined until an admin approves its change (``pending``)."""
    row = await visible(ctx, who, connection_id)
    snapshot = found(await ctx.connections.latest_snapshot(connection_id))
    return {"snapshot": await _classified(ctx, row, snapshot)}


async def _classified(ctx: AppContext, row: ConnectionRow, snapshot: ConnectionToolSnapshot) -> dict[str, Any]:
    approved = {a.tool_name: a.definition for a in await ctx.connections.approved_tools(str(row.id))}
    view = snapshot_public(snapshot)
    by_name = {t["name"]: t for t in snapshot.tools_json}
    for tool in view["tools"]:
        classed = with_access(row.access, by_name[tool["name"]])
        access, approval = classed["access"], classed["approval"]
        review = "approved" if approved.get(tool["name"]) == definition(by_name[tool["name"]]) else "pending"
        tool.update(access=access, approval=approval, review=review)
    return view


@router.post(
    "/{connection_id}/tools/refresh",
    summary="Re-photograph the server's tools",
    response_model=out.SnapshotOut,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def refresh(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """Appends snapshot v+1 for future runs; runs in flight keep the snapshot they froze."""
    ctx.connection_service.custody()
    row = await manageable(ctx, who, connection_id, "refreshing")
    snapshot = await ctx.connection_service.refresh(who.tenant_id, row)
    return {"snapshot": await _classified(ctx, row, snapshot)}


def change_public(change: ConnectionToolChange) -> dict[str, Any]:
    fields, diff = definition_diff(change.previous, change.proposed)
    return {
        "id": str(change.id),
        "connection_id": str(change.connection_id),
        "tool": change.tool_name,
        "kind": change.kind,
        "snapshot_version": change.snapshot_version,
        "status": change.status,
        "changed_fields": fields,
        "diff": diff,
        "previous": change.previous,
        "proposed": change.proposed,
        "decided_by": change.decided_by,
        "decided_at": change.decided_at,
        "created_at": change.created_at,
    }


@router.get(
    "/{connection_id}/tools/changes",
    summary="Tool definitions awaiting review (and past reviews)",
    response_model=out.ToolChangeList,
    responses=errors(401, 404, 422),
)
async def tool_changes(
    connection_id: str,
    who: PrincipalDep,
    ctx: ContextDep,
    status: Literal["pending", "approved", "rejected", "superseded"] | None = None,
) -> dict[str, Any]:
    """A refresh that photographs a new tool, or a changed description or input schema, quarantines that
    tool (new runs do not bind it) until an admin approves its change here. Newest first, each with a
    unified diff of the approved and the proposed definition."""
    await visible(ctx, who, connection_id)
    return {"changes": [change_public(c) for c in await ctx.connections.tool_changes(connection_id, status)]}


async def _decide_change(
    connection_id: str, change_id: str, decision: str, who: Principal, ctx: AppContext
) -> dict[str, Any]:
    row = await visible(ctx, who, connection_id)
    require_manage(who, row, "reviewing tool changes of")
    if await ctx.connections.tool_change(connection_id, change_id) is None:
        raise NotFound("no such tool change on this connection")
    actor = ("operator", None) if who.is_operator else ("user", who.user_id)
    change = await ctx.connections.decide_tool_change(who.tenant_id, connection_id, change_id, decision, actor)
    return {"change": change_public(change)}


@router.post(
    "/{connection_id}/tools/changes/{change_id}/approve",
    summary="Approve a tool's new definition (new runs bind it again)",
    response_model=out.ToolChangeOut,
    responses=errors(401, 403, 404, 409),
)
async def approve_change(connection_id: str, change_id: str, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """Recorded with who and when (and in the audit log); 409 when the change is no longer pending
    (decided already, or superseded by a newer refresh)."""
    return await _decide_change(connection_id, change_id, "approved", who, ctx)


@router.post(
    "/{connection_id}/tools/changes/{change_id}/reject",
    summary="Reject a tool's new definition (it stays quarantined)",
    response_model=out.ToolChangeOut,
    responses=errors(401, 403, 404, 409),
)
async def reject_change(connection_id: str, change_id: str, who: PrincipalDep, ctx: ContextDep) -> dict[str, Any]:
    """Recorded with who and when; the tool stays out of new runs until the server lists its approved
    definition again or a later change is approved."""
    return await _decide_change(connection_id, change_id, "rejected", who, ctx)
