"""Connecting MCP servers: admit the URL, photograph the tools, seal the credential, store both.

The use cases shared by the connections, catalog and OAuth routers (a static connection, a pending
OAuth connection and its sign-in link, re-photographing) live here, so no router imports another.
The credential is sealed at rest and unsealed only here and by the broker.

The route parses and authorizes who may see a connection; this module holds the rules of making one
(:meth:`ConnectionService.create`): which fields go together is :mod:`core.connection_drafts`, checked
here in order with who may own what:

- an organization connection is made by the operator, an admin or an owner; a personal one by a
  signed-in user (never the operator token, which has no user);
- a stdio connection runs its command on the control plane's hosts, unsandboxed: the operator only;
- a relay or sandbox CLI connection needs the admin or owner role, and a sandbox CLI is an organization
  connection;
- ``credential_env`` reads the control plane's own environment: the operator only.

Revoking (:meth:`ConnectionService.revoke`) destroys our copy first and tells the authorization server after.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pydantic import SecretStr

from core.access import definition, from_catalog, parse_access, with_access
from core.bindings import same_url
from core.connection_drafts import (
    DEVICE_OR_CLI,
    NO_SANDBOX_CREDENTIAL,
    PERSONAL_NEEDS_USER,
    ConnectionDraft,
    check_bearer_only,
    check_brokered,
    check_described,
    check_described_credential,
    check_device_or_cli,
    check_git,
    check_mcp_http,
    check_no_oauth_client,
    check_oauth_client,
    check_static_credential,
    chosen_transport,
    credential_scheme,
)
from core.digests import document_digest
from core.errors import BadRequest, Conflict, Forbidden, NotFound, Unavailable, Unprocessable, UpstreamFailed
from core.runspec import is_loopback_authority
from core.sandbox_cli import check_tools
from db.connections import ConnectionRow, Connections, NewConnection, credential_context
from db.models.catalog import ConnectorCatalogEntry
from db.models.connections import ConnectionToolChange, ConnectionToolSnapshot
from db.parks import Challenges, Parks
from integrations import mcp_client
from integrations.headers import auth_headers, header_credential_problem
from integrations.oauth import OAuthClientError
from integrations.sealing import Sealer, SealingError
from integrations.transports import (
    TransportConnection,
    TransportDeps,
    TransportError,
    TransportProvider,
    Transports,
    openapi,
)
from integrations.transports._auth import credential_problem
from integrations.transports._auth import validate_auth as auth_problem
from integrations.transports.openapi import config_problem as openapi_config_problem
from integrations.transports.relay import RelayConfigError, check_config
from integrations.transports.stdio import validate_config as stdio_config_problem
from integrations.urls import AdmittedUrl, UrlPolicy, UrlRefused
from services.oauth_connect import OAuthConnect
from services.oauth_tokens import AccessTokens, GrantLost

GO_CONTEXT = "connector_oauth_flows.go"
NO_CUSTODY = (
    "credential storage is disabled: set FLUIDBOX_CREDENTIAL_KEY (64 hex characters, e.g. from "
    "`python -c 'import secrets; print(secrets.token_hex(32))'`) and restart the server"
)
NO_OAUTH = "OAuth connections need credential storage: set FLUIDBOX_CREDENTIAL_KEY (64 hex characters) and restart"


def _provider(url_policy: UrlPolicy, transport: str) -> TransportProvider:
    # Photographs need no kept-open state: a fresh provider per use (a stdio photograph's process ends with it).
    return Transports(TransportDeps(url_policy)).provider_for(transport)


@contextmanager
def _photograph_refusals(*, rolled_back: bool) -> Iterator[None]:
    """A photograph's failures as answers: a rejected credential is 400, any other upstream failure 502."""
    try:
        yield
    except mcp_client.AuthRejected as err:
        suffix = " (connection rolled back)" if rolled_back else ""
        raise BadRequest(f"the server rejected this credential{suffix}: {err}") from None
    except mcp_client.UnsendableHeaders as err:
        raise BadRequest(f"{err} (nothing was sent)") from None
    except mcp_client.McpClientError as err:
        raise UpstreamFailed(f"could not photograph the server's tools: {err}") from None


async def transport_photograph(
    url_policy: UrlPolicy, conn: TransportConnection, *, rolled_back: bool
) -> dict[str, Any]:
    """Photograph a non-MCP-over-HTTP connection through its provider (400 for a bad description, 502 upstream)."""
    with _photograph_refusals(rolled_back=rolled_back):
        try:
            photo = await _provider(url_policy, conn.transport).list_tools(conn)
        except TransportError as err:
            suffix = " (nothing was stored)" if rolled_back else ""
            raise BadRequest(f"{err}{suffix}") from None
    return {"protocol_version": photo.protocol_version, "tools": photo.tools, "digest": photo.digest}


async def take_photograph(
    url: str, headers: dict[str, str], *, rolled_back: bool, pin: AdmittedUrl | None = None
) -> dict[str, Any]:
    with _photograph_refusals(rolled_back=rolled_back):
        photo = await mcp_client.photograph(url, headers, pin=pin)
    return {"protocol_version": photo.protocol_version, "tools": photo.tools, "digest": photo.digest}


Connected = tuple[ConnectionRow, ConnectionToolSnapshot]  # a new connection and its first snapshot


@dataclass(frozen=True)
class Ownership:
    """Whose a new connection is and what it is called: ``owner_user_id`` makes it that user's personal
    connection; ``access`` is its declaration (None: no tool is classified, so none is callable)."""

    display_name: str | None = None
    owner_user_id: str | None = None
    created_by_user_id: str | None = None
    access: dict[str, Any] | None = None

    def new(self, provider: str, base_url: str, **fields: Any) -> NewConnection:
        """The new connection to ``base_url`` (its name when it was given none), with these ``fields``."""
        return NewConnection(
            provider=provider, base_url=base_url, display_name=self.display_name or base_url,
            owner_user_id=self.owner_user_id, created_by_user_id=self.created_by_user_id, access=self.access,
            **fields,
        )  # fmt: skip


Created = tuple[ConnectionRow, ConnectionToolSnapshot | None]  # the row, and its first snapshot (None: pending oauth)

STDIO_OPERATOR = (
    "a stdio connection runs its command on the control plane's hosts, unsandboxed: only the operator (admin "
    "token) can create one"
)
ENV_OPERATOR = "`credential_env` reads the control plane's environment: only the operator (admin token) may name one"
ORG_ROLE = "creating an organization connection requires the admin or owner role"


class Caller(Protocol):
    """Who asks (``api.deps.Principal`` is one): the operator, or a signed-in member and its roles."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def user_id(self) -> str | None: ...

    @property
    def is_operator(self) -> bool: ...

    @property
    def mutates_resources(self) -> bool:
        """The operator, an admin or an owner: who manages the organization's resources."""
        ...

    @property
    def read_only(self) -> bool: ...


def may_own(caller: Caller, draft: ConnectionDraft) -> None:
    """A personal connection is a signed-in user's; an organization one needs the admin or owner role."""
    if draft.personal and caller.is_operator:
        raise BadRequest(PERSONAL_NEEDS_USER)
    if not draft.personal and not caller.mutates_resources:
        raise Forbidden(ORG_ROLE)


def may_read_env(caller: Caller) -> None:
    """``credential_env`` reads the control plane's own environment, which is the operator's."""
    if not caller.is_operator:
        raise Forbidden(ENV_OPERATOR)


def _made(caller: Caller, draft: ConnectionDraft, access: dict[str, Any] | None) -> Ownership:
    owner_user_id = caller.user_id if draft.personal else None
    return Ownership(draft.display_name, owner_user_id, caller.user_id, access)


@dataclass(frozen=True)
class ToolReview:
    """A photographed tool under its connection's declaration: its access class, whether a write asks a human
    every time, and whether new runs may bind it (``approved``) or it waits for an admin (``pending``)."""

    access: str | None
    approval: str | None
    review: str


@dataclass
class ConnectionService:
    connections: Connections
    parks: Parks
    challenges: Challenges
    url_policy: UrlPolicy
    sealer: Sealer | None
    oauth: OAuthConnect | None
    access_tokens: AccessTokens | None
    public_base: str

    def custody(self) -> Sealer:
        """The sealer, or 503 when credential storage is off."""
        if self.sealer is None:
            raise Unavailable(NO_CUSTODY)
        return self.sealer

    def oauth_connect(self) -> OAuthConnect:
        """OAuth connect, or 503 when credential storage is off."""
        if self.oauth is None or self.sealer is None:
            raise Unavailable(NO_OAUTH)
        return self.oauth

    async def admit(self, url: str) -> AdmittedUrl:
        try:
            return await self.url_policy.admit(url)
        except UrlRefused as err:
            raise BadRequest(str(err)) from None

    async def connect_static(
        self,
        tenant_id: str,
        *,
        base_url: str,
        token: str,
        header_name: str | None,
        scheme: str,
        made: Ownership,
        transport: str = "mcp_http",
        transport_config: dict[str, Any] | None = None,
    ) -> Connected:
        """Admit the URL, photograph with the credential, then seal and store both in one transaction.
        Any refusal before the insert stores nothing. Returns the connection and its first snapshot.
        ``transport`` other than ``mcp_http`` photographs through its provider (:mod:`integrations.transports`);
        a ``stdio`` connection has no URL to admit (its ``base_url`` is its ``stdio://name``)."""
        sealer = self.custody()
        if scheme == "Basic" and ":" not in token:
            raise BadRequest("a Basic credential must be `email:api_token`")
        as_sent = TransportConnection(
            id="new", transport=transport, base_url=base_url, config=transport_config or {}, credential=token,
            header_name=header_name, scheme=scheme,
        )  # fmt: skip
        sendable(
            header_credential_problem(token, header_name=header_name, scheme=scheme)
            if transport == "mcp_http"
            else credential_problem(as_sent)
        )
        if transport == "mcp_http":
            admitted = await self.admit(base_url)
            url = admitted.url
            headers = auth_headers(token, header_name=header_name, scheme=scheme)
            photo = await take_photograph(admitted.url, headers, rolled_back=True, pin=admitted)
        else:
            url = base_url if transport == "stdio" else (await self.admit(base_url)).url
            conn = TransportConnection(
                id="new", transport=transport, base_url=url, config=transport_config or {}, credential=token,
                header_name=header_name, scheme=scheme,
            )  # fmt: skip
            photo = await transport_photograph(self.url_policy, conn, rolled_back=True)
        new = made.new(
            transport, url, transport=transport, transport_config=transport_config or {}, header_name=header_name,
            scheme=scheme,
        )  # fmt: skip
        return await self._store(tenant_id, new, photo, sealer.seal(token, context=credential_context(tenant_id)))

    async def _store(
        self, tenant_id: str, new: NewConnection, photo: dict[str, Any], sealed: bytes | None = None
    ) -> Connected:
        """Insert a photographed connection (with its sealed credential, if any) and its first snapshot."""
        credential = (sealed, self.custody().key_id) if sealed is not None else None
        row, snapshot = await self.connections.create(tenant_id, new, photo, credential)
        assert snapshot is not None
        return row, snapshot

    async def connect_relay(
        self,
        tenant_id: str,
        *,
        base_url: str,
        token: str,
        config: dict[str, Any] | None,
        display_name: str | None,
        owner_user_id: str | None = None,
        created_by_user_id: str | None = None,
        access: dict[str, Any] | None = None,
    ) -> Connected:
        """A device relay (``transport: relay``): admitted like any URL, photographed through the registered
        ``relay`` provider (the one brokered calls use) with its credential and bounded timeout, then the
        credential sealed. Any refusal stores nothing."""
        sealer = self.custody()
        sendable(header_credential_problem(token, header_name=None, scheme="Bearer"))
        try:
            settings = check_config(base_url, config)
        except RelayConfigError as err:
            raise BadRequest(str(err)) from None
        admitted = await self.admit(base_url)
        conn = TransportConnection(
            id="new", transport="relay", base_url=admitted.url, config=settings, credential=token
        )
        provider = _provider(self.url_policy, "relay")
        try:
            photo = await provider.list_tools(conn)
        except TransportError as err:
            raise BadRequest(f"{err} (nothing was stored)") from None
        except mcp_client.AuthRejected as err:
            raise BadRequest(f"the relay rejected this credential (connection rolled back): {err}") from None
        except mcp_client.McpClientError as err:
            raise UpstreamFailed(f"could not photograph the tools behind the relay: {err}") from None
        finally:
            await provider.close()
        photo_doc = {"protocol_version": photo.protocol_version, "tools": photo.tools, "digest": photo.digest}
        sealed = sealer.seal(token, context=credential_context(tenant_id))
        fields: dict[str, Any] = {
            "provider": "relay",
            "transport": "relay",
            "transport_config": settings,
            "display_name": display_name or admitted.url,
            "base_url": admitted.url,
            "header_name": None,
            "scheme": "Bearer",
            "owner_user_id": owner_user_id,
            "created_by_user_id": created_by_user_id,
            "access": access,
        }
        return await self._store(tenant_id, NewConnection(**fields), photo_doc, sealed)

    async def connect_sandbox_cli(
        self,
        tenant_id: str,
        *,
        base_url: str,
        tools: Any,
        made: Ownership,
    ) -> Connected:
        """Reviewed CLI tools of the sandbox image (``transport: sandbox_cli``): the declarations are the
        photograph. No credential, ever: these tools run inside the sandbox."""
        if not base_url.startswith("sandbox-cli://") or not base_url[len("sandbox-cli://") :].strip("/"):
            raise BadRequest("a sandbox_cli connection is named by a `base_url` of the form sandbox-cli://<name>")
        declared = check_tools(tools)
        photo = {"protocol_version": "sandbox_cli", "tools": declared, "digest": document_digest(declared)}
        made = replace(made, display_name=made.display_name or base_url, owner_user_id=None)
        new = made.new("sandbox_cli", base_url.rstrip("/"), transport="sandbox_cli", auth_kind="none", scheme="")
        row, snapshot = await self.connections.create(tenant_id, new, photo)
        assert snapshot is not None
        return row, snapshot

    async def connect_git(
        self, tenant_id: str, *, base_url: str, token: str, scheme: str, made: Ownership
    ) -> Connected:
        """A credential for cloning private repositories (``transport: git``): no tools; ``base_url`` is the
        https prefix of the repositories it may be sent to. Sealed like every connection credential; only the
        control plane's clone ever opens it."""
        sealer = self.custody()
        problem = git_base_problem(base_url)
        if problem is not None:
            raise BadRequest(problem)
        if scheme not in ("Basic", "Bearer"):
            raise BadRequest("a git connection's `scheme` is Basic (`user:token`) or Bearer")
        if scheme == "Basic" and ":" not in token:
            raise BadRequest("a Basic git credential must be `user:token`")
        if any(ch in token for ch in "\r\n\0"):
            raise BadRequest("a git credential is one line")
        photo = {"protocol_version": "git", "tools": [], "digest": document_digest([])}
        new = replace(made, access=None).new("git", base_url.rstrip("/"), transport="git", scheme=scheme)
        return await self._store(tenant_id, new, photo, sealer.seal(token, context=credential_context(tenant_id)))

    async def openapi_base_url(self, config: dict[str, Any]) -> str:
        """The API's base URL from the document's first ``servers`` entry (400 when it names none)."""
        provider = openapi.OpenApiProvider(TransportDeps(self.url_policy))
        try:
            url = openapi.server_url(await provider.document(config))
        except TransportError as err:
            raise BadRequest(str(err)) from None
        if url is None:
            raise BadRequest("the OpenAPI document names no absolute server URL: give `base_url`")
        return url

    async def connect_oauth(
        self,
        tenant_id: str,
        *,
        base_url: str,
        made: Ownership,
        transport: str = "mcp_http",
        transport_config: dict[str, Any] | None = None,
    ) -> ConnectionRow:
        """A ``pending`` oauth connection (the row); it becomes usable after its first sign-in. An ``openapi`` or
        ``http`` one is photographed through its provider with the first access token."""
        self.oauth_connect()
        admitted = await self.admit(base_url)
        new = made.new(
            transport, admitted.url, transport=transport, transport_config=transport_config or {}, auth_kind="oauth"
        )
        row, _ = await self.connections.create(tenant_id, new, None)
        return row

    async def start_sign_in(self, tenant_id: str, connection: ConnectionRow, actor_user_id: str | None) -> str:
        """Record a one-time flow for ``connection`` (an OAuth one, not revoked); returns its ``go_url``."""
        oauth = self.oauth_connect()
        if connection.auth_kind != "oauth":
            raise BadRequest("this connection does not use OAuth")
        if connection.status == "revoked":
            raise Conflict("connection is revoked")
        try:
            started = await oauth.start(tenant_id, connection, actor_user_id=actor_user_id)
        except (OAuthClientError, UrlRefused) as err:
            raise BadRequest(f"cannot start OAuth with this server: {err}") from None
        assert self.sealer is not None
        sealed = self.sealer.seal(
            json.dumps({"f": started.flow_id, "u": started.authorization_url}), context=GO_CONTEXT
        )
        go_url = f"{self.public_base}/v1/oauth/go?f={base64.urlsafe_b64encode(sealed).decode().rstrip('=')}"
        await self.challenges.save(str(started.flow_id), go_url)
        return go_url

    async def connect_env(
        self,
        tenant_id: str,
        *,
        base_url: str,
        credential_env: str,
        header_name: str | None,
        scheme: str,
        made: Ownership,
    ) -> Connected:
        """A static connection whose credential is the environment variable ``credential_env`` (configuration,
        read by each process when it uses it); ``Missing <VAR>`` (409) when this process does not have it."""
        token = env_credential(credential_env)
        sendable(header_credential_problem(token, header_name=header_name, scheme=scheme))
        admitted = await self.admit(base_url)
        headers = auth_headers(token, header_name=header_name, scheme=scheme)
        photo = await take_photograph(admitted.url, headers, rolled_back=True, pin=admitted)
        new = made.new("mcp_http", admitted.url, header_name=header_name, scheme=scheme, credential_env=credential_env)
        row, snapshot = await self.connections.create(tenant_id, new, photo)
        assert snapshot is not None
        return row, snapshot

    async def replace_credential(
        self, caller: Caller, row: ConnectionRow, *, token: str | None, credential_env: str | None
    ) -> Connected:
        """A static connection's new credential: photographed first (a rejected one changes nothing), then
        sealed (or taken from ``credential_env``, the operator's to name) and made active at the next
        generation. A sandbox CLI connection has no credential to replace."""
        tenant_id = caller.tenant_id
        if credential_env is not None:
            may_read_env(caller)
        if row.transport == "sandbox_cli":
            raise BadRequest(NO_SANDBOX_CREDENTIAL.format(field="credential"))
        sealer = self.custody()
        if row.auth_kind != "static":
            raise BadRequest("an oauth connection's credential is obtained by signing in (oauth/start)")
        secret = env_credential(credential_env) if credential_env else token
        assert secret is not None
        if row.scheme == "Basic" and ":" not in secret:
            raise BadRequest("a Basic credential must be `email:api_token`")
        if row.transport == "git":
            if credential_env:
                raise BadRequest("a git connection's credential is sealed: give a `token`")
            photo: dict[str, Any] = {"protocol_version": "git", "tools": [], "digest": document_digest([])}
        else:
            sendable(header_credential_problem(secret, header_name=row.header_name, scheme=row.scheme))
            admitted = await self.admit(row.base_url)
            headers = auth_headers(secret, header_name=row.header_name, scheme=row.scheme)
            photo = await take_photograph(admitted.url, headers, rolled_back=True, pin=admitted)
        sealed = None if credential_env else (sealer.seal(secret, context=credential_context(tenant_id)), sealer.key_id)
        updated = await self.connections.replace_credential(tenant_id, str(row.id), sealed, credential_env, photo)
        snapshot = await self.connections.latest_snapshot(str(row.id))
        assert snapshot is not None
        return updated, snapshot

    async def authorize(
        self, tenant_id: str, row: ConnectionRow, actor_user_id: str | None, *, signs_in: bool = True
    ) -> dict[str, Any]:
        """Start or poll authorization of one connection: ``connected``; ``authorize`` with the sign-in link
        (a pending flow's link is reused, so asking again mints nothing); or :class:`Conflict` with
        ``status: unavailable`` and the reason (a missing environment credential named exactly). Without
        ``signs_in`` (a read-only caller), :class:`Forbidden` instead of any sign-in link."""
        env = await self.parks.connection_env(str(row.id))
        missing = f"Missing {env}" if env and not os.environ.get(env) else None
        if row.status == "active":
            if missing:
                raise unavailable(missing)
            return {"status": "connected", "connection_id": str(row.id)}
        if row.auth_kind != "oauth":
            if missing:
                raise unavailable(missing)
            raise unavailable(
                f"the connection is {row.status} and has no sign-in to start: give it a new credential "
                f"(PUT /v1/connections/{row.id}/credential)"
            )
        if row.status == "revoked":
            raise unavailable("the connection is revoked: create a new one")
        if not signs_in:
            raise Forbidden(READ_ONLY_SIGN_IN)
        url = await self.challenges.pending(str(row.id), int(row.authorization_generation))
        if url is None:
            url = await self.start_sign_in(tenant_id, row, actor_user_id)
        return {"status": "authorize", "url": url, "connection_id": str(row.id)}

    def open_sign_in_link(self, f: str) -> tuple[str, str]:
        """The flow id and the authorization URL sealed into a ``go_url``; 400 when it was tampered with."""
        assert self.sealer is not None
        try:
            blob = base64.urlsafe_b64decode(f + "=" * (-len(f) % 4))
            doc = json.loads(self.sealer.open(blob, context=GO_CONTEXT))
            return str(doc["f"]), str(doc["u"])
        except (ValueError, SealingError, KeyError, TypeError):
            raise BadRequest("this sign-in link is not valid") from None

    async def refresh(self, tenant_id: str, row: ConnectionRow) -> ConnectionToolSnapshot:
        """Photograph an active connection again: appends snapshot v+1 for future runs."""
        sealer = self.custody()
        if row.status != "active":
            raise BadRequest(f"connection is {row.status}")
        if row.transport == "sandbox_cli":
            raise BadRequest(
                "a sandbox_cli connection's tools are its declarations: create a new connection to change them"
            )
        if row.transport == "git":
            raise BadRequest("a git connection has no tools to photograph")
        transport = row.transport or "mcp_http"
        if transport != "mcp_http" and row.auth_kind == "oauth":
            return await self.connections.refresh(
                str(row.id), row.authorization_generation, await self.oauth_photograph(tenant_id, row, None)
            )
        if transport != "mcp_http":
            blob, _ = await self.connections.credential(str(row.id))
            conn = TransportConnection(
                id=str(row.id), transport=transport, base_url=row.base_url,
                config=dict(row.transport_config or {}),
                credential=sealer.open(blob, context=credential_context(tenant_id)).decode(),
                header_name=row.header_name, scheme=row.scheme,
                generation=int(row.authorization_generation),
            )  # fmt: skip
            photo = await transport_photograph(self.url_policy, conn, rolled_back=False)
            return await self.connections.refresh(str(row.id), row.authorization_generation, photo)
        admitted = await self.admit(row.base_url)  # it may resolve elsewhere by now
        if row.auth_kind == "oauth":
            photo = await self.oauth_photograph(tenant_id, row, admitted)
        elif env := await self.parks.connection_env(str(row.id)):
            token = env_credential(env)
            headers = auth_headers(token, header_name=row.header_name, scheme=row.scheme)
            photo = await take_photograph(admitted.url, headers, rolled_back=False, pin=admitted)
        else:
            blob, _ = await self.connections.credential(str(row.id))
            token = sealer.open(blob, context=credential_context(tenant_id)).decode()
            headers = auth_headers(token, header_name=row.header_name, scheme=row.scheme)
            photo = await take_photograph(admitted.url, headers, rolled_back=False, pin=admitted)
        return await self.connections.refresh(str(row.id), row.authorization_generation, photo)

    async def oauth_photograph(
        self, tenant_id: str, row: ConnectionRow, admitted: AdmittedUrl | None
    ) -> dict[str, Any]:
        """Photograph with the connection's access token; after a 401, once more with a refreshed one.
        ``admitted`` is None for a transport other than ``mcp_http`` (its provider admits what it connects to)."""
        tokens = self.access_tokens
        if tokens is None:
            raise Unavailable("OAuth connections need credential storage (FLUIDBOX_CREDENTIAL_KEY)")
        generation = int(row.authorization_generation)
        rejected: SecretStr | None = None
        for _ in range(2):
            try:
                token = await tokens.get(tenant_id, str(row.id), generation, rejected=rejected)
            except GrantLost as lost:
                raise BadRequest(f"the connection is now in error: {lost.reason} (reconnect it)") from None
            except OAuthClientError as err:
                raise UpstreamFailed(f"could not obtain an access token: {err}") from None
            headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
            try:
                if admitted is None:
                    conn = TransportConnection(
                        id=str(row.id), transport=row.transport, base_url=row.base_url,
                        config=dict(row.transport_config or {}), credential=token.get_secret_value(),
                        auth_kind="oauth", generation=generation,
                    )  # fmt: skip
                    return await transport_photograph(self.url_policy, conn, rolled_back=False)
                return await take_photograph(admitted.url, headers, rolled_back=False, pin=admitted)
            except BadRequest:
                if rejected is not None:
                    raise
                rejected = token
        raise AssertionError("unreachable")

    def evict_token(self, connection_id: str) -> None:
        if self.access_tokens is not None:
            self.access_tokens.evict(connection_id)

    async def create(self, caller: Caller, draft: ConnectionDraft) -> Created:
        """``POST /v1/connections``: the draft's rules (:mod:`core.connection_drafts`) and who may own it, in the
        order they have always been answered; then admitted, photographed and stored (nothing when any step
        refuses). A pending oauth connection has no snapshot yet (usable after its first sign-in)."""
        transport = chosen_transport(draft)
        access = parse_access(draft.access) if draft.access is not None else None
        if transport == "git":
            may_own(caller, draft)
            check_git(draft)
            assert draft.base_url is not None and draft.token is not None
            return await self.connect_git(
                caller.tenant_id, base_url=draft.base_url, token=draft.token.get_secret_value(), scheme=draft.scheme,
                made=_made(caller, draft, None),
            )  # fmt: skip
        if transport in DEVICE_OR_CLI:
            return await self._create_device_or_cli(caller, draft, transport, access)
        check_brokered(draft)
        self.custody()
        if transport == "mcp_http":
            return await self._create_mcp_http(caller, draft, access)
        return await self._create_described(caller, draft, transport, access)

    async def _create_mcp_http(self, caller: Caller, draft: ConnectionDraft, access: dict[str, Any] | None) -> Created:
        check_mcp_http(draft)
        assert draft.base_url is not None
        may_own(caller, draft)
        made = _made(caller, draft, access)
        if draft.oauth:
            check_oauth_client(draft)
            check_bearer_only(draft)
            row = await self.connect_oauth(caller.tenant_id, base_url=draft.base_url, made=made)
            return await self._preregistered(caller.tenant_id, draft, row)
        check_no_oauth_client(draft)
        if draft.credential_env is not None:
            may_read_env(caller)
        check_static_credential(draft)
        if draft.credential_env is not None:
            return await self.connect_env(
                caller.tenant_id, base_url=draft.base_url, credential_env=draft.credential_env,
                header_name=draft.header_name, scheme=draft.scheme, made=made,
            )  # fmt: skip
        assert draft.token is not None
        return await self.connect_static(
            caller.tenant_id, base_url=draft.base_url, token=draft.token.get_secret_value(),
            header_name=draft.header_name, scheme=draft.scheme, made=made,
        )  # fmt: skip

    async def _create_device_or_cli(
        self, caller: Caller, draft: ConnectionDraft, transport: str, access: dict[str, Any] | None
    ) -> Created:
        """A relay (a sealed credential, admitted https URL, bounded timeout) or a sandbox CLI (declared tools, no
        credential at all)."""
        if draft.personal and caller.is_operator:
            raise BadRequest(PERSONAL_NEEDS_USER)
        if not caller.mutates_resources:
            raise Forbidden(ORG_ROLE)
        check_device_or_cli(draft, transport)
        assert draft.base_url is not None
        if transport == "sandbox_cli":
            return await self.connect_sandbox_cli(
                caller.tenant_id, base_url=draft.base_url, tools=draft.tools, made=_made(caller, draft, access)
            )
        assert draft.token is not None
        return await self.connect_relay(
            caller.tenant_id, base_url=draft.base_url, token=draft.token.get_secret_value(),
            config=draft.transport_config, display_name=draft.display_name,
            owner_user_id=caller.user_id if draft.personal else None, created_by_user_id=caller.user_id,
            access=access,
        )  # fmt: skip

    async def _create_described(
        self, caller: Caller, draft: ConnectionDraft, transport: str, access: dict[str, Any] | None
    ) -> Created:
        """An ``openapi``, ``http`` or ``stdio`` connection: its configuration is checked, its tools photographed
        through its provider, then it is stored like any static connection (the credential sealed). An ``openapi``
        or ``http`` one may sign in with the OAuth connect of MCP connections instead (the API's base URL must
        answer 401 and publish its protected resource metadata, RFC 9728)."""
        config = dict(draft.transport_config or {})
        if transport == "stdio":
            # Its command runs on the API and worker hosts, unsandboxed, as their account (root in a root stack),
            # starting with this create's photograph: the host belongs to the operator token, never to an org role.
            if not caller.is_operator:
                raise Forbidden(STDIO_OPERATOR)
            may_own(caller, draft)
            unusable(stdio_config_problem(config))
        else:
            unusable(auth_problem(config.get("auth")))
            may_own(caller, draft)
        base_url = check_described(draft, transport, config)
        if transport == "openapi":
            unusable(openapi_config_problem(config))
            base_url = base_url or await self.openapi_base_url(config)
        assert base_url is not None
        check_described_credential(draft, transport, config)
        made = _made(caller, draft, access)
        if draft.oauth:
            row = await self.connect_oauth(
                caller.tenant_id, base_url=base_url, made=made, transport=transport,
                transport_config={**config, "auth": {"type": "oauth"}},
            )  # fmt: skip
            return await self._preregistered(caller.tenant_id, draft, row)
        return await self.connect_static(
            caller.tenant_id, base_url=base_url, token=draft.token.get_secret_value() if draft.token else "",
            header_name=draft.header_name, scheme=credential_scheme(config, draft.scheme), made=made,
            transport=transport, transport_config=config,
        )  # fmt: skip

    async def _preregistered(self, tenant_id: str, draft: ConnectionDraft, row: ConnectionRow) -> Created:
        """A pending oauth connection, with the client id (or scopes) it was given registered first; a client id
        the server will not take removes the connection again."""
        if draft.client_id is not None or draft.scopes:
            try:
                await self.oauth_connect().preregister(
                    tenant_id, row, client_id=draft.client_id, client_secret=draft.client_secret, scopes=draft.scopes
                )
            except (OAuthClientError, UrlRefused) as err:
                await self.connections.discard_pending_oauth(tenant_id, str(row.id))
                raise BadRequest(f"cannot use this client id with this server: {err}") from None
        return row, None

    async def for_catalog_entry(self, caller: Caller, entry: ConnectorCatalogEntry, owner: str) -> ConnectionRow:
        """The connection serving catalog ``entry`` for this caller: the newest to its URL (active first), or one
        made now (a pending oauth connection; a static one from its ``credential_env``; never for a read-only
        token)."""
        if not entry.url:
            raise unavailable(f"'{entry.slug}' has no URL to connect to (no auth definition)")
        personal = owner == "personal"
        rows = [
            r
            for r in await self.connections.all(caller.tenant_id, caller.user_id)
            if same_url(r.base_url, entry.url) and (r.owner_type == "user") == personal and r.status != "revoked"
        ]
        rows.sort(key=lambda r: r.status != "active")
        if rows:
            return rows[0]
        if not personal and not caller.mutates_resources:  # checked before anything is created
            raise Forbidden("authorizing an organization connection requires the admin or owner role")
        if caller.read_only:
            raise Forbidden(READ_ONLY_SIGN_IN)
        owner_user_id = caller.user_id if personal else None
        made = Ownership(entry.name, owner_user_id, caller.user_id, from_catalog(entry.access))
        if entry.auth_mode == "oauth":
            return await self.connect_oauth(caller.tenant_id, base_url=entry.url, made=made)
        hints = entry.auth_hints or {}
        env = hints.get("credential_env")
        if not env:
            raise unavailable(
                f"'{entry.slug}' has no auth definition to start: connect it with a token "
                f"(POST /v1/catalog/{entry.slug}/connect)"
            )
        row, _ = await self.connect_env(
            caller.tenant_id, base_url=entry.url, credential_env=env, header_name=hints.get("header_name"),
            scheme=hints.get("scheme", "Bearer"), made=made,
        )  # fmt: skip
        return row

    async def revoke(self, tenant_id: str, connection_id: str) -> ConnectionRow:
        """Destroy the sealed credential (and forget any cached access token); an OAuth grant is then also
        revoked at its authorization server (RFC 7009), best effort, after ours is gone."""
        upstream = await self.oauth.revocation(tenant_id, connection_id) if self.oauth is not None else None
        revoked = await self.connections.revoke(tenant_id, connection_id)
        self.evict_token(connection_id)
        if upstream is not None:
            await upstream()
        return revoked

    async def decide_tool_change(
        self, caller: Caller, connection_id: str, change_id: str, decision: str
    ) -> ConnectionToolChange:
        """Approve or reject one of the connection's tool changes, recorded with who decided (404 when the
        connection has no such change, 409 when it is no longer pending)."""
        if await self.connections.tool_change(connection_id, change_id) is None:
            raise NotFound("no such tool change on this connection")
        actor = ("operator", None) if caller.is_operator else ("user", caller.user_id)
        return await self.connections.decide_tool_change(caller.tenant_id, connection_id, change_id, decision, actor)

    async def tool_reviews(self, row: ConnectionRow, snapshot: ConnectionToolSnapshot) -> dict[str, ToolReview]:
        """Each photographed tool's class under the connection's declaration, and whether its definition is the
        one an admin approved (new runs bind only those)."""
        approved = {a.tool_name: a.definition for a in await self.connections.approved_tools(str(row.id))}
        reviews: dict[str, ToolReview] = {}
        for tool in snapshot.tools_json:
            classed = with_access(row.access, tool)
            review = "approved" if approved.get(tool["name"]) == definition(tool) else "pending"
            reviews[tool["name"]] = ToolReview(classed["access"], classed["approval"], review)
        return reviews


def git_base_problem(base_url: str) -> str | None:
    """Why ``base_url`` cannot scope a git credential (None: it can)."""
    scheme, sep, rest = base_url.partition("://")
    authority = rest.split("/", 1)[0]
    if not sep or scheme not in ("https", "http") or not authority:
        return "a git connection's `base_url` is the https:// prefix of the repositories it may clone"
    if scheme == "http" and not is_loopback_authority(authority):
        return "a git connection's `base_url` is https:// (plain http only for a loopback test server)"
    if "@" in authority or "?" in rest or "#" in rest:
        return "a git connection's `base_url` carries no user, query or fragment: the credential is the `token`"
    return None


READ_ONLY_SIGN_IN = "this token is read-only; starting or handing out a sign-in needs a token that may write"


def sendable(problem: str | None) -> None:
    """400 for a credential no request could carry (checked before anything is contacted or stored)."""
    if problem is not None:
        raise BadRequest(f"{problem} (nothing was stored)")


def env_credential(var: str) -> str:
    """The credential configured as the environment variable ``var``; ``Missing <VAR>`` (409) when unset."""
    value = os.environ.get(var, "")
    if not value:
        raise unavailable(f"Missing {var}")
    return value


def unusable(problem: str | None) -> None:
    """422 for a transport configuration its provider cannot use."""
    if problem is not None:
        raise Unprocessable(problem)


def unavailable(reason: str) -> Conflict:
    """409 ``{status: "unavailable", reason}`` (and the usual ``error``/``code``)."""
    return Conflict(reason, status="unavailable", reason=reason)


__all__ = [
    "GO_CONTEXT",
    "Caller",
    "ConnectionService",
    "Created",
    "Ownership",
    "ToolReview",
    "env_credential",
    "take_photograph",
    "transport_photograph",
    "unavailable",
]
