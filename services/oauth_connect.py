"""OAuth connect for MCP connections: the three legs the HTTP routes will call, with no FastAPI in sight.

- :meth:`OAuthConnect.start` (behind ``POST /v1/connections/{id}/oauth/start``): discover the server's
  authorization server, settle our client identity (reusing the tenant's registration for this issuer and
  redirect URI, or registering and keeping whichever concurrent registration won), prepare the authorization
  request and record the one-time flow (state digest, sealed verifier, the connection's current generation).
  Returns the authorization URL for the route to carry, sealed, in the ``go_url``.
- :meth:`OAuthConnect.open` (behind ``GET /v1/oauth/go``): bind the flow to the browser's cookie digest.
- :meth:`OAuthConnect.complete` (behind ``GET /v1/oauth/callback``): claim the flow exactly once from that
  browser, redeem the code (verifier + resource), require and seal the refresh token, photograph the server's tools
  with the new access token, and activate the connection by compare-and-swap.

Errors: the integration's (:mod:`integrations.oauth`, :mod:`integrations.mcp_client`) and the repository's
(:mod:`core.errors`) pass through; the route maps them to its answer. Nothing here logs a token.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import SecretStr

from core.errors import BadRequest, Conflict, NotFound
from core.tokens import token_digest
from db.connections import ConnectionRow, Connections, credential_context
from db.models.connections import ConnectionToolSnapshot
from db.models.oauth import OAuthClientRegistration
from db.oauth import ClaimedFlow, OAuthFlow, OAuthRecords, flow_verifier_context, registration_secret_context
from integrations import mcp_client
from integrations.oauth import (
    AuthorizationServer,
    ClientIdentity,
    Discovery,
    OAuthClient,
    OAuthClientError,
    TokenSet,
    parse_callback,
)
from integrations.sealing import Sealer
from integrations.transports import TransportConnection, TransportDeps, Transports
from integrations.urls import AdmittedUrl, UrlPolicy
from services.oauth_tokens import access_context

__all__ = ["Activated", "OAuthConnect", "Photographer", "Redeemed", "StartedFlow"]

log = logging.getLogger("fluidbox.services.oauth_connect")

Photographer = Callable[..., Awaitable[mcp_client.Photograph]]


@dataclass(frozen=True)
class StartedFlow:
    flow_id: str
    authorization_url: str
    """Carries ``state``: hand it to the browser only through the sealed ``go_url``."""
    expires_at: datetime


@dataclass(frozen=True)
class Redeemed:
    """A claimed flow whose code was exchanged: the tokens are not stored anywhere yet."""

    flow: ClaimedFlow
    connection: ConnectionRow
    tokens: TokenSet
    grant: dict[str, Any]
    """The non-secret grant description the connection will record (issuer, endpoints, resource, scope)."""


@dataclass(frozen=True)
class Activated:
    connection: ConnectionRow
    snapshot: ConnectionToolSnapshot
    tokens: TokenSet
    """The fresh access token is usable at once (the broker may cache it); the refresh token is already sealed."""


class OAuthConnect:
    def __init__(
        self,
        records: OAuthRecords,
        connections: Connections,
        sealer: Sealer,
        client: OAuthClient,
        policy: UrlPolicy,
        *,
        redirect_uri: str,
        metadata_document_url: str | None = None,
        photographer: Photographer = mcp_client.photograph,
    ) -> None:
        """Wire the legs.

        Args:
            redirect_uri: ``<public URL>/v1/oauth/callback``.
            metadata_document_url: our Client ID Metadata Document URL, when the deployment has one
                (``integrations.oauth.client_metadata_document_url``).
            photographer: ``integrations.mcp_client.photograph`` (the tools are photographed under the new grant).
        """
        self.records = records
        self.connections = connections
        self.sealer = sealer
        self.client = client
        self.policy = policy
        self.redirect_uri = redirect_uri
        self.metadata_document_url = metadata_document_url
        self.photographer = photographer

    # ---- start ---------------------------------------------------------------------------------

    async def start(
        self,
        tenant_id: str,
        connection: ConnectionRow,
        *,
        actor_user_id: str | None = None,
        purpose: str = "connection",
    ) -> StartedFlow:
        """Prepare a browser leg for ``connection`` (an ``oauth`` connection that is not revoked). ``purpose``
        names the callback that may finish it (``managed_app``: :mod:`services.managed_apps`)."""
        if connection.auth_kind != "oauth":
            raise BadRequest("this connection does not use OAuth")
        if connection.status == "revoked":
            raise Conflict("connection is revoked")
        settings = await self.records.connection_settings(tenant_id, str(connection.id))
        discovery = await self.client.discover(connection.base_url)
        requested = (settings.oauth or {}).get("requested_scope")
        if requested:
            scopes = requested.split()
            # A connection lives on its refresh token: keep asking for one when the server offers the scope.
            if "offline_access" in (discovery.authorization_server.scopes_supported or []) and (
                "offline_access" not in scopes
            ):
                scopes.append("offline_access")
            discovery = discovery.model_copy(update={"scope": " ".join(scopes)})
        own = await self._preregistered(tenant_id, settings.registration_id, discovery)
        identity, registration_id = own if own is not None else await self._identity(tenant_id, discovery)
        request = self.client.authorization_request(discovery, identity)
        verifier = self.sealer.seal(request.code_verifier.get_secret_value(), context=flow_verifier_context(tenant_id))
        flow = await self.records.start_flow(
            tenant_id,
            str(connection.id),
            registration_id,
            state_hash=token_digest(request.state.get_secret_value()),
            verifier=(verifier, self.sealer.key_id),
            resource=discovery.resource,
            discovery=discovery.model_dump(mode="json"),
            expected_generation=int(connection.authorization_generation),
            created_by_user_id=actor_user_id,
            purpose=purpose,
        )
        log.info(
            "oauth flow %s started for connection %s at %s",
            flow.id,
            str(connection.id),
            discovery.authorization_server.issuer,
        )
        return StartedFlow(str(flow.id), request.url, flow.expires_at)

    async def preregister(
        self,
        tenant_id: str,
        connection: ConnectionRow,
        *,
        client_id: str | None,
        client_secret: SecretStr | None,
        scopes: list[str] | None,
    ) -> None:
        """Settle a pending connection's own client identity (a ``client_id`` registered out of band, with its
        secret sealed) and the scopes to request instead of the advertised ones. A client id needs the server's
        issuer, so discovery runs now; its failures pass through."""
        document: dict[str, Any] = {}
        if scopes:
            document["requested_scope"] = " ".join(scopes)
        registration_id: str | None = None
        if client_id is not None:
            discovery = await self.client.discover(connection.base_url)
            identity = await self.client.identify(
                discovery, self.redirect_uri, preregistered=(client_id, client_secret)
            )
            row, _ = await self.records.save_registration(
                tenant_id,
                {
                    "issuer": identity.issuer,
                    "redirect_uri": identity.redirect_uri,
                    "source": identity.source,
                    "client_id": identity.client_id,
                    "token_endpoint_auth_method": identity.token_endpoint_auth_method,
                },
                client_secret=self._seal(tenant_id, "client_secret", client_secret),
            )
            registration_id = str(row.id)
        await self.records.configure_pending(
            tenant_id, str(connection.id), oauth=document, registration_id=registration_id
        )

    async def _preregistered(
        self, tenant_id: str, registration_id: uuid.UUID | None, discovery: Discovery
    ) -> tuple[ClientIdentity, str] | None:
        """The connection's own pre-registered identity, if it has one at this authorization server."""
        if registration_id is None:
            return None
        row = await self.records.registration(tenant_id, str(registration_id))
        if row is None or row.source != "preregistered":
            return None
        if row.issuer != discovery.authorization_server.issuer:
            raise BadRequest("the server's authorization server changed since its client id was registered")
        return self.identity_of(tenant_id, row), str(row.id)

    async def _identity(self, tenant_id: str, discovery: Discovery) -> tuple[ClientIdentity, str]:
        issuer = discovery.authorization_server.issuer
        known_row = await self.records.reusable_registration(tenant_id, issuer, self.redirect_uri)
        known = self.identity_of(tenant_id, known_row) if known_row else None
        identity = await self.client.identify(
            discovery, self.redirect_uri, metadata_document_url=self.metadata_document_url, known=known
        )
        if known is not None and identity == known and known_row is not None:
            return identity, str(known_row.id)
        secret = identity.client_secret
        access = identity.registration_access_token
        row, created = await self.records.save_registration(
            tenant_id,
            {
                "issuer": identity.issuer,
                "redirect_uri": identity.redirect_uri,
                "source": identity.source,
                "client_id": identity.client_id,
                "token_endpoint_auth_method": identity.token_endpoint_auth_method,
                "registration_client_uri": identity.registration_client_uri,
            },
            client_secret=self._seal(tenant_id, "client_secret", secret),
            registration_access_token=self._seal(tenant_id, "registration_access_token", access),
        )
        if not created:  # a concurrent flow registered first: use its identity, ours is never used
            return self.identity_of(tenant_id, row), str(row.id)
        return identity, str(row.id)

    def _seal(self, tenant_id: str, column: str, secret: SecretStr | None) -> tuple[bytes, str] | None:
        if secret is None:
            return None
        context = registration_secret_context(tenant_id, column)
        return self.sealer.seal(secret.get_secret_value(), context=context), self.sealer.key_id

    def identity_of(self, tenant_id: str, row: OAuthClientRegistration) -> ClientIdentity:
        """A stored registration as a client identity (its secrets unsealed)."""

        def unseal(column: str, blob: bytes | None) -> SecretStr | None:
            if blob is None:
                return None
            context = registration_secret_context(tenant_id, column)
            return SecretStr(self.sealer.open(bytes(blob), context=context).decode())

        return ClientIdentity(
            issuer=row.issuer,
            client_id=row.client_id,
            client_secret=unseal("client_secret", row.client_secret_sealed),
            token_endpoint_auth_method=row.token_endpoint_auth_method,
            source=row.source,
            redirect_uri=row.redirect_uri,
            registration_access_token=unseal("registration_access_token", row.registration_access_token_sealed),
            registration_client_uri=row.registration_client_uri,
        )

    # ---- revoke --------------------------------------------------------------------------------

    async def revocation(self, tenant_id: str, connection_id: str) -> Callable[[], Awaitable[bool]] | None:
        """Read what revoking the connection's grant at its authorization server needs (call it *before* the
        connection's credential is destroyed); returns the revocation to run afterwards, or None (no grant)."""
        material = await self.records.grant_material(tenant_id, connection_id)
        if material is None:
            return None
        oauth = material.oauth or {}
        registration = await self.records.registration(tenant_id, str(material.registration_id))
        if registration is None or not oauth.get("revocation_endpoint"):
            return None
        identity = self.identity_of(tenant_id, registration)
        server = AuthorizationServer(
            issuer=oauth["issuer"],
            authorization_endpoint=oauth["authorization_endpoint"],
            token_endpoint=oauth["token_endpoint"],
            revocation_endpoint=oauth["revocation_endpoint"],
        )
        refresh = SecretStr(
            self.sealer.open(bytes(material.credential_sealed), context=credential_context(tenant_id)).decode()
        )

        async def revoke() -> bool:
            """RFC 7009, best effort: the connection is revoked here whatever the provider answers."""
            try:
                await self.client.revoke(server, identity, refresh)
            except OAuthClientError as err:
                log.warning("could not revoke connection %s's grant at %s: %s", connection_id, server.issuer, err)
                return False
            log.info("revoked connection %s's grant at %s", connection_id, server.issuer)
            return True

        return revoke

    # ---- go ------------------------------------------------------------------------------------

    async def open(self, flow_id: str, browser_hash: str) -> OAuthFlow:
        """The browser opened the sign-in link: bind the flow to its cookie digest."""
        return await self.records.bind_browser(flow_id, browser_hash)

    # ---- callback ------------------------------------------------------------------------------

    async def redeem(
        self, query: Mapping[str, str], browser_hash: str | None, *, purpose: str = "connection"
    ) -> Redeemed:
        """Claim the flow named by the callback's ``state`` (once) and redeem its code; activates nothing."""
        state = query.get("state")
        if not state:
            raise BadRequest("the authorization response carries no state")
        flow = await self.records.claim_flow(token_digest(state), browser_hash, purpose=purpose)
        tenant_id = str(flow.tenant_id)
        code = parse_callback(query, state)
        registration = await self.records.registration(tenant_id, str(flow.registration_id))
        connection = await self._connection(tenant_id, str(flow.connection_id))
        requested = (await self.records.connection_settings(tenant_id, str(flow.connection_id))).oauth or {}
        if registration is None:
            raise NotFound("the client registration of this sign-in is gone; start again")
        identity = self.identity_of(tenant_id, registration)
        discovery = Discovery.model_validate(flow.discovery)
        verifier = self.sealer.open(bytes(flow.pkce_verifier_sealed), context=flow_verifier_context(tenant_id))
        tokens = await self.client.exchange_code(
            discovery.authorization_server, identity, code, SecretStr(verifier.decode()), discovery.resource
        )
        assert tokens.refresh_token is not None  # exchange_code refuses an answer without one
        grant = _grant_document(discovery, identity, tokens, requested.get("requested_scope"))
        return Redeemed(flow, connection, tokens, grant)

    async def complete(self, query: Mapping[str, str], browser_hash: str | None) -> Activated:
        """Finish the flow named by the callback's ``state``; see the module docstring."""
        redeemed = await self.redeem(query, browser_hash)
        flow, connection, tokens = redeemed.flow, redeemed.connection, redeemed.tokens
        tenant_id = str(flow.tenant_id)
        assert tokens.refresh_token is not None
        transport = connection.transport or "mcp_http"
        if transport == "mcp_http":
            pin = await self._admit(connection.base_url)
            photo = await self.photographer(
                connection.base_url,
                {"Authorization": f"Bearer {tokens.access_token.get_secret_value()}"},
                pin=pin,
            )
        else:  # an OpenAPI / HTTP API signed in with OAuth: its provider photographs it (issue 17)
            photo = await Transports(TransportDeps(self.policy)).provider_for(transport).list_tools(
                TransportConnection(
                    id=str(str(connection.id)), transport=transport, base_url=connection.base_url,
                    config=dict(connection.transport_config or {}),
                    credential=tokens.access_token.get_secret_value(), auth_kind="oauth",
                )
            )  # fmt: skip
        sealed = self.sealer.seal(tokens.refresh_token.get_secret_value(), context=credential_context(tenant_id))
        access = self.sealer.seal(tokens.access_token.get_secret_value(), context=access_context(tenant_id))
        row, snapshot = await self.records.activate(
            tenant_id,
            flow,
            credential=(sealed, self.sealer.key_id),
            access=(access, self.sealer.key_id, tokens.expires_at),
            oauth=redeemed.grant,
            photo={"protocol_version": photo.protocol_version, "tools": photo.tools, "digest": photo.digest},
        )
        log.info("oauth connection %s active at generation %s", row.id, row.authorization_generation)
        return Activated(row, snapshot, tokens)

    async def _connection(self, tenant_id: str, connection_id: str) -> ConnectionRow:
        row = await self.connections.get(tenant_id, connection_id)
        if row is None:
            raise NotFound()
        return row

    async def _admit(self, url: str) -> AdmittedUrl:
        return await self.policy.admit(url)


def _grant_document(
    discovery: Discovery, identity: ClientIdentity, tokens: TokenSet, requested_scope: str | None = None
) -> dict[str, Any]:
    """What the connection records about its grant: enough for the broker to refresh, nothing secret (and the
    scopes the creator asked for, so a reconnect asks for them again)."""
    server = discovery.authorization_server
    return {
        "requested_scope": requested_scope,
        "issuer": server.issuer,
        "authorization_endpoint": server.authorization_endpoint,
        "token_endpoint": server.token_endpoint,
        "revocation_endpoint": server.revocation_endpoint,
        "resource": discovery.resource,
        "resource_metadata_url": discovery.resource_metadata_url,
        "client_id": identity.client_id,
        "client_source": identity.source,
        "scope": tokens.scope or discovery.scope,
    }
