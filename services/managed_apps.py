"""Managed app connections: an embedding product connects its users' apps (``/v1/mcp-oauth/catalog``).

An app is an OAuth entry of the connector catalog that the deployment offers (``FLUIDBOX_MANAGED_APPS``); its
connection is the caller's personal OAuth connection, made and signed in with the connector machinery
(:class:`services.oauth_connect.OAuthConnect`, a second instance whose redirect URI is the managed callback). What
differs is when the grant becomes usable:

- :meth:`ManagedApps.connect` answers ``connected`` for a usable connection, finishes a sign-in that is waiting
  (``PROVISIONING`` if setup still cannot finish), else starts a flow and answers ``redirect``;
- :meth:`ManagedApps.callback` (the provider's redirect) claims the flow once, redeems the code and *holds* the
  grant, sealed; with a ``redirect_url`` it mints a completion proof (stored as a digest) for the client;
- :meth:`ManagedApps.complete` spends that proof (single use, same account, five minutes) and finishes.

Finishing photographs the server's tools with the held grant (refreshing its access token if it is due) and
activates the connection with the same compare-and-swap as a connector sign-in, so a connection that was active
keeps its id (bindings, policy rules) and moves to the next authorization generation. A refresh only ever uses a
grant a sign-in produced: nothing here authorizes an app without one.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import SecretStr

from core.access import from_catalog
from core.errors import BadRequest, Conflict, NotFound, Unavailable, UpstreamFailed
from core.tokens import token_digest
from db.catalog import Catalog
from db.connections import ConnectionRow, Connections, credential_context
from db.managed_apps import AppConnection, HeldGrant, ManagedAppRecords, ManagedFlow
from db.oauth import FlowTarget, OAuthRecords
from integrations import mcp_client
from integrations.oauth import AuthorizationServer, InvalidGrant, OAuthClientError
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy, UrlRefused
from services.oauth_connect import OAuthConnect, Photographer
from services.oauth_tokens import AccessTokens, access_context

__all__ = ["NOT_CONFIGURED", "ManagedApp", "ManagedApps", "Outcome", "allowed_redirect"]

log = logging.getLogger("fluidbox.services.managed_apps")

NOT_CONFIGURED = (
    "managed app connections are not configured on this deployment: set FLUIDBOX_MANAGED_APPS (a JSON list of "
    "OAuth catalog slugs) and FLUIDBOX_MANAGED_APP_REDIRECT_URLS, then restart"
)
# A held access token is used to finish setup while it has this long left; otherwise it is refreshed first.
_USABLE_FOR = timedelta(seconds=30)

Status = Literal["connected", "redirect", "PROVISIONING"]


@dataclass(frozen=True)
class ManagedApp:
    app_id: str
    name: str
    icon: str | None
    description: str | None
    scopes: list[str]
    url: str
    access: dict[str, Any] | None = None  # the catalog entry's reviewed patterns


@dataclass(frozen=True)
class Outcome:
    status: Status
    connection: ConnectionRow | None = None
    authorization_url: str | None = None
    reason: str | None = None
    """Why setup is still finishing (``PROVISIONING``)."""


def allowed_redirect(url: str, allowed: Sequence[str]) -> bool:
    """Whether ``url`` names an allowed callback location: same scheme, host, port and path as one of ``allowed``
    (a query string is kept, a fragment or credentials in the URL are refused)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.fragment or parts.username or parts.password or parts.scheme not in ("http", "https"):
        return False
    for candidate in allowed:
        c = urlsplit(candidate)
        if (c.scheme, c.hostname, c.port, c.path or "/") == (parts.scheme, parts.hostname, port, parts.path or "/"):
            return True
    return False


def _with_query(url: str, params: dict[str, str]) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), *params.items()]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def _now() -> datetime:
    return datetime.now(UTC)


class ManagedApps:
    def __init__(
        self,
        records: ManagedAppRecords,
        oauth_records: OAuthRecords,
        connections: Connections,
        sealer: Sealer,
        catalog: Catalog,
        connect: OAuthConnect,
        policy: UrlPolicy,
        *,
        app_ids: Sequence[str],
        redirect_urls: Sequence[str],
        access_tokens: AccessTokens | None = None,
        photographer: Photographer = mcp_client.photograph,
    ) -> None:
        """Wire the surface.

        Args:
            connect: the OAuth connect legs, built with ``<public URL>/v1/mcp-oauth/catalog/callback`` as the
                redirect URI.
            app_ids: the catalog slugs offered (``FLUIDBOX_MANAGED_APPS``); empty means not configured (503).
            redirect_urls: the allowed callback locations for a client's ``redirect_url``.
            access_tokens: the process's token cache, evicted when a connection gets a new grant.
        """
        self.records = records
        self.oauth_records = oauth_records
        self.connections = connections
        self.sealer = sealer
        self.catalog = catalog
        self.connect_legs = connect
        self.policy = policy
        self.app_ids = list(app_ids)
        self.redirect_urls = list(redirect_urls)
        self.access_tokens = access_tokens
        self.photographer = photographer

    # ---- the offer -----------------------------------------------------------------------------

    def require_configured(self) -> None:
        if not self.app_ids:
            raise Unavailable(NOT_CONFIGURED)

    async def apps(self, tenant_id: str) -> list[ManagedApp]:
        """The offered apps this tenant's catalog can connect (an unknown or non-OAuth slug is skipped, logged)."""
        self.require_configured()
        out = []
        for app_id in self.app_ids:
            row = await self.catalog.get(tenant_id, app_id)
            if row is None or row.auth_mode != "oauth" or not row.url:
                log.warning("managed app %r is not an OAuth catalog entry with a URL; not offered", app_id)
                continue
            out.append(
                ManagedApp(app_id, row.name, row.icon, row.description, list(row.scopes or []), row.url, row.access)
            )
        return out

    async def app(self, tenant_id: str, app_id: str) -> ManagedApp:
        for app in await self.apps(tenant_id):
            if app.app_id == app_id:
                return app
        raise NotFound(f"unknown app '{app_id}' (GET /v1/mcp-oauth/catalog lists the apps offered)")

    async def statuses(self, tenant_id: str, user_id: str) -> list[tuple[AppConnection, str]]:
        """The account's app connections as stored, each with its status (connected | PROVISIONING | pending |
        error | revoked); reads only, repairs nothing."""
        self.require_configured()
        return [(row, _status_of(row)) for row in await self.records.accounts_connections(tenant_id, user_id)]

    # ---- connect -------------------------------------------------------------------------------

    async def connect(self, tenant_id: str, user_id: str, app_id: str, redirect_url: str | None) -> Outcome:
        """Idempotent: see the module docstring. ``redirect_url`` must be an allowed callback location (400)."""
        self.require_configured()
        if redirect_url is not None and not allowed_redirect(redirect_url, self.redirect_urls):
            raise BadRequest(
                "`redirect_url` is not an allowed callback location for this deployment "
                "(FLUIDBOX_MANAGED_APP_REDIRECT_URLS)"
            )
        app = await self.app(tenant_id, app_id)
        try:
            admitted = await self.policy.admit(app.url)
        except UrlRefused as err:
            raise BadRequest(f"the app's server URL is refused: {err}") from None
        connection, managed_id = await self.records.connection_for(
            tenant_id,
            user_id,
            app_id,
            {"display_name": app.name, "base_url": admitted.url, "access": from_catalog(app.access)},
        )
        if connection.status == "active":
            return Outcome("connected", connection)
        held = await self.records.waiting(tenant_id, managed_id, str(connection.id))
        if held is not None:
            return await self.finish(tenant_id, held)
        if connection.status == "pending" and app.scopes:
            await self.connect_legs.preregister(tenant_id, connection, client_id=None, client_secret=None,
                                                scopes=app.scopes)  # fmt: skip
        try:
            started = await self.connect_legs.start(tenant_id, connection, actor_user_id=user_id, purpose="managed_app")
        except (OAuthClientError, UrlRefused) as err:
            raise UpstreamFailed(f"cannot start signing in to '{app_id}': {err}") from None
        await self.records.record_flow(tenant_id, started.flow_id, managed_id, user_id, redirect_url)
        return Outcome("redirect", connection, authorization_url=started.authorization_url)

    # ---- the provider's redirect ---------------------------------------------------------------

    async def callback(self, query: dict[str, str]) -> tuple[str | None, ManagedFlow]:
        """Claim the flow named by ``state`` once, redeem its code and hold the grant. Returns the client's
        ``redirect_url`` carrying ``app_id`` and ``completion_proof`` (``None`` when the flow named none) and the
        managed flow (``app_id``, …)."""
        self.require_configured()
        redeemed = await self.connect_legs.redeem(query, None, purpose="managed_app")
        flow = await self.records.flow(str(redeemed.flow.id))
        if flow is None:  # purpose managed_app flows are always recorded before their URL is handed out
            raise NotFound("this sign-in is unknown; connect the app again")
        tenant_id, tokens = str(flow.tenant_id), redeemed.tokens
        assert tokens.refresh_token is not None
        refresh = self.sealer.seal(tokens.refresh_token.get_secret_value(), context=credential_context(tenant_id))
        access = self.sealer.seal(tokens.access_token.get_secret_value(), context=access_context(tenant_id))
        proof = secrets.token_urlsafe(32) if flow.redirect_url else None
        await self.records.hold(
            str(flow.flow_id),
            credential=(refresh, self.sealer.key_id),
            access=(access, self.sealer.key_id, tokens.expires_at),
            oauth=redeemed.grant,
            proof_hash=token_digest(proof) if proof else None,
        )
        log.info("managed app %s: sign-in held for connection %s", flow.app_id, flow.connection_id)
        if proof is None or flow.redirect_url is None:
            return None, flow
        return _with_query(flow.redirect_url, {"app_id": flow.app_id, "completion_proof": proof}), flow

    # ---- completion ----------------------------------------------------------------------------

    async def complete(self, tenant_id: str, user_id: str, proof: str, expected_server_id: str | None) -> Outcome:
        """Spend a completion proof and finish its sign-in (see :meth:`ManagedAppRecords.take_proof`)."""
        self.require_configured()
        held = await self.records.take_proof(tenant_id, user_id, token_digest(proof), expected_server_id)
        return await self.finish(tenant_id, held)

    async def finish(self, tenant_id: str, held: HeldGrant) -> Outcome:
        """Photograph with the held grant and activate the connection; ``PROVISIONING`` while the server cannot be
        photographed (the grant stays held for the next call)."""
        connection = await self.connections.get(tenant_id, str(held.connection_id))
        if connection is None:
            raise NotFound()
        token, held = await self._access(tenant_id, held)
        try:
            admitted = await self.policy.admit(connection.base_url)
            photo = await self.photographer(
                admitted.url, {"Authorization": f"Bearer {token.get_secret_value()}"}, pin=admitted
            )
        except (mcp_client.McpClientError, UrlRefused) as err:
            log.warning("managed connection %s still provisioning: %s", connection.id, err)
            return Outcome("PROVISIONING", connection, reason=f"the app's server could not be set up yet: {err}")
        flow = FlowTarget(
            connection_id=held.connection_id,
            expected_generation=held.expected_generation,
            created_at=held.flow_created_at,
            registration_id=held.registration_id,
        )
        assert held.credential_sealed is not None and held.credential_key_id is not None
        assert held.access_token_sealed is not None and held.access_token_key_id is not None
        try:
            row, _ = await self.oauth_records.activate(
                tenant_id,
                flow,
                credential=(bytes(held.credential_sealed), held.credential_key_id),
                access=(bytes(held.access_token_sealed), held.access_token_key_id, held.access_expires_at),
                oauth=held.oauth or {},
                photo={"protocol_version": photo.protocol_version, "tools": photo.tools, "digest": photo.digest},
            )
        except Conflict:
            await self.records.finish(str(held.flow_id))  # a newer sign-in won (or the connection was revoked)
            current = await self.connections.get(tenant_id, str(held.connection_id))
            if current is not None and current.status == "active":
                return Outcome("connected", current)
            raise
        await self.records.finish(str(held.flow_id))
        if self.access_tokens is not None:
            self.access_tokens.evict(str(row.id))
        log.info("managed connection %s active at generation %s", row.id, row.authorization_generation)
        return Outcome("connected", row)

    async def _access(self, tenant_id: str, held: HeldGrant) -> tuple[SecretStr, HeldGrant]:
        """The held grant's access token, refreshed first when it is (nearly) expired (rotation stored); and the
        grant as it is now stored."""
        expires = held.access_expires_at
        if held.access_token_sealed is not None and (expires is None or expires - _now() > _USABLE_FOR):
            token = self.sealer.open(bytes(held.access_token_sealed), context=access_context(tenant_id)).decode()
            return SecretStr(token), held
        oauth: dict[str, Any] = held.oauth or {}
        registration = await self.oauth_records.registration(tenant_id, str(held.registration_id))
        if registration is None:
            raise NotFound("the client registration of this sign-in is gone; connect the app again")
        identity = self.connect_legs.identity_of(tenant_id, registration)
        server = AuthorizationServer(
            issuer=oauth["issuer"],
            authorization_endpoint=oauth["authorization_endpoint"],
            token_endpoint=oauth["token_endpoint"],
            revocation_endpoint=oauth.get("revocation_endpoint"),
        )
        assert held.credential_sealed is not None
        refresh = self.sealer.open(bytes(held.credential_sealed), context=credential_context(tenant_id)).decode()
        try:
            tokens = await self.connect_legs.client.refresh(server, identity, SecretStr(refresh), oauth["resource"])
        except InvalidGrant as err:
            await self.records.finish(str(held.flow_id))
            raise Conflict(f"the provider refused this sign-in's grant ({err.reason}); connect the app again") from None
        except OAuthClientError as err:
            raise UpstreamFailed(f"could not refresh this sign-in's access token: {err}") from None
        access = (
            self.sealer.seal(tokens.access_token.get_secret_value(), context=access_context(tenant_id)),
            self.sealer.key_id,
            tokens.expires_at,
        )
        rotated = None
        if tokens.rotated and tokens.refresh_token is not None:
            blob = self.sealer.seal(tokens.refresh_token.get_secret_value(), context=credential_context(tenant_id))
            rotated = (blob, self.sealer.key_id)
        await self.records.refreshed(str(held.flow_id), access, rotated)
        held = held.model_copy(update={
            "access_token_sealed": access[0], "access_token_key_id": access[1], "access_expires_at": access[2],
            **({"credential_sealed": rotated[0], "credential_key_id": rotated[1]} if rotated else {}),
        })  # fmt: skip
        return tokens.access_token, held


def _status_of(row: AppConnection) -> str:
    status = row.connection.status
    if status == "active":
        return "connected"
    if row.provisioning and status != "revoked":
        return "PROVISIONING"
    return status
