"""The control plane's OAuth client for MCP connections (the MCP authorization spec, OAuth 2.1).

What it does, in the order a connect flow needs it:

1. :meth:`OAuthClient.discover` — ask the MCP server without a token; read the ``resource_metadata`` URL from its
   401 ``WWW-Authenticate`` header (or fall back to the RFC 9728 well-known locations), fetch the protected
   resource metadata, check it names this server, then fetch the authorization server's metadata (RFC 8414, then
   OpenID discovery) and check its ``issuer`` and that it supports PKCE S256.
2. :meth:`OAuthClient.identify` — the client identity, in the order pre-registered ``client_id`` → Client ID
   Metadata Document URL (only when the caller has one, i.e. an https, non-loopback public URL, and the server
   advertises support) → Dynamic Client Registration (RFC 7591). Reusing a stored registration per
   (issuer, redirect URI) is the caller's job: pass it as ``known``.
3. :meth:`OAuthClient.authorization_request` — the browser URL: authorization code, PKCE S256, ``state`` and the
   ``resource`` indicator (RFC 8707). Nothing is sent; the caller keeps the verifier sealed until the callback.
4. :meth:`OAuthClient.exchange_code` — code + ``code_verifier`` + ``resource``; a token set without a refresh
   token is refused (a connection must outlive its first access token).
5. :meth:`OAuthClient.refresh` — ``refresh_token`` + ``resource``; when the server rotates, the new refresh token
   is returned and :attr:`TokenSet.rotated` says so.

The protocol mechanics come from maintained libraries, none is written here: authlib's ``AsyncOAuth2Client``
builds the authorization URL (S256 challenge), the token requests, client authentication and token-error parsing;
the mcp SDK supplies the metadata models and the discovery URL order (SEP-985, RFC 8414 §3.1/§5, OIDC).

Outbound HTTP: every URL (the MCP server, a ``resource_metadata`` URL a server names, every metadata, registration
and token endpoint) passes :class:`~integrations.urls.UrlPolicy` admission and is then fetched through a
:class:`~integrations.pinning.PinnedTransport` for exactly that origin, with redirects off, no proxy from the
environment. A redirect is never followed: for metadata it means "not here", for the token endpoint it is an
error. No token, secret, code or verifier appears in a message, log line or ``repr`` (they are ``SecretStr``).

Errors::

    OAuthClientError            base; messages never carry credentials
    ├── EndpointRefused         a URL failed admission (SSRF policy) — nothing was sent
    ├── EndpointUnreachable     connect/timeout/transport failure talking to a server
    ├── DiscoveryFailed         no usable protected resource or authorization server metadata
    ├── RegistrationFailed      dynamic registration unavailable or refused
    ├── AuthorizationFailed     the browser leg came back with an error, or a state that is not ours
    ├── TokenRequestFailed      the token endpoint refused (``.error``, ``.description``) or answered nonsense
    │   └── InvalidGrant        ``invalid_grant``: the grant was revoked, expired or the refresh token reused
    └── MissingRefreshToken     the code exchange gave no refresh token
"""

from __future__ import annotations

import logging
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx2
from authlib.common.security import generate_token
from authlib.integrations.httpx_client import AsyncOAuth2Client, OAuthError
from authlib.oauth2.client import OAuth2Client
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
    get_client_metadata_scopes,
    issuers_match,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, ProtectedResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from integrations.pinning import PinnedTransport
from integrations.urls import AdmittedUrl, RefusalCategory, UrlPolicy, UrlRefused, classify_address

__all__ = [
    "REFRESH_MARGIN",
    "AuthorizationFailed",
    "AuthorizationRequest",
    "AuthorizationServer",
    "ClientIdentity",
    "ClientSource",
    "Discovery",
    "DiscoveryFailed",
    "EndpointRefused",
    "EndpointUnreachable",
    "InvalidGrant",
    "MissingRefreshToken",
    "OAuthClient",
    "OAuthClientError",
    "RegistrationFailed",
    "TokenRequestFailed",
    "TokenSet",
    "client_metadata_document",
    "client_metadata_document_url",
    "needs_refresh",
    "parse_callback",
]

logger = logging.getLogger(__name__)

REFRESH_MARGIN = timedelta(seconds=300)
"""Refresh an access token once less than this is left (api-surface §10)."""

DEFAULT_TIMEOUT = 10.0
_ERROR_TEXT_LIMIT = 300
_MCP_PROBE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "fluidbox-oauth-discovery", "version": "0.1.0"},
    },
}

ClientSource = Literal["preregistered", "cimd", "dcr"]


# --------------------------------------------------------------------------------------------------------------------
# Errors


class OAuthClientError(Exception):
    """An OAuth step failed (base class; messages never contain credentials)."""


class EndpointRefused(OAuthClientError):
    """A URL we were about to contact failed admission; nothing was sent."""


class EndpointUnreachable(OAuthClientError):
    """A server could not be reached or did not answer in time."""


class DiscoveryFailed(OAuthClientError):
    """No usable protected resource metadata or authorization server metadata was found."""


class RegistrationFailed(OAuthClientError):
    """Dynamic client registration is not offered or was refused."""


class AuthorizationFailed(OAuthClientError):
    """The authorization leg came back with an error (``.error``) or without a usable code."""

    def __init__(self, message: str, error: str = "invalid_request") -> None:
        super().__init__(message)
        self.error = error


class TokenRequestFailed(OAuthClientError):
    """The token endpoint refused the request; ``.error`` / ``.description`` are the server's words."""

    def __init__(self, message: str, error: str, description: str | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.description = description


class InvalidGrant(TokenRequestFailed):
    """``invalid_grant``: the code or refresh token is no longer good; ``.reason`` is the server's explanation."""

    @property
    def reason(self) -> str:
        return self.description or self.error


class MissingRefreshToken(OAuthClientError):
    """The authorization server issued no refresh token, so the connection could not outlive one access token."""


# --------------------------------------------------------------------------------------------------------------------
# Models


class AuthorizationServer(BaseModel):
    """The parts of an authorization server's metadata the flows use (persisted with the connection)."""

    model_config = ConfigDict(frozen=True)

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str | None = None
    revocation_endpoint: str | None = None
    scopes_supported: list[str] | None = None
    client_id_metadata_document_supported: bool = False
    authorization_response_iss_parameter_supported: bool = False


class Discovery(BaseModel):
    """What discovery established about one MCP server: its resource identifier, its authorization server, and
    the scope to request."""

    model_config = ConfigDict(frozen=True)

    server_url: str
    resource: str
    """The RFC 8707 resource indicator sent on both legs (the PRM ``resource``)."""
    resource_metadata_url: str
    authorization_server: AuthorizationServer
    scope: str | None
    """Space-separated scopes to request (WWW-Authenticate, else PRM, else AS; plus ``offline_access`` if offered)."""


class ClientIdentity(BaseModel):
    """Who we are at one authorization server. ``client_secret`` only for confidential registrations."""

    model_config = ConfigDict(frozen=True)

    issuer: str
    client_id: str
    client_secret: SecretStr | None = None
    token_endpoint_auth_method: str = "none"
    source: ClientSource
    redirect_uri: str
    registration_access_token: SecretStr | None = None
    registration_client_uri: str | None = None


class AuthorizationRequest(BaseModel):
    """A prepared browser leg. Keep ``code_verifier`` sealed and ``state`` hashed until the callback."""

    model_config = ConfigDict(frozen=True)

    url: str
    state: SecretStr
    code_verifier: SecretStr
    resource: str
    redirect_uri: str


class TokenSet(BaseModel):
    """Tokens from one token-endpoint answer. ``expires_at`` is absolute (UTC), computed on receipt."""

    model_config = ConfigDict(frozen=True)

    access_token: SecretStr
    refresh_token: SecretStr | None
    token_type: str = "Bearer"
    expires_at: datetime | None
    scope: str | None = None
    rotated: bool = False
    """On a refresh: the server issued a new refresh token (the old one is dead from now on)."""


def needs_refresh(tokens: TokenSet, now: datetime, margin: timedelta = REFRESH_MARGIN) -> bool:
    """Whether ``tokens``' access token has less than ``margin`` left at ``now`` (no expiry → never)."""
    return tokens.expires_at is not None and tokens.expires_at - now < margin


def client_metadata_document_url(public_url: str) -> str | None:
    """Our Client ID Metadata Document URL, or ``None`` when CIMD cannot work for this deployment.

    An authorization server fetches the document itself, so it must be reachable over https at a public name:
    ``http`` and loopback public URLs get ``None`` (the caller falls back to dynamic registration).
    """
    parts = urlsplit(public_url)
    host = (parts.hostname or "").lower()
    if parts.scheme != "https" or not host or host == "localhost" or host.endswith(".localhost"):
        return None
    if host == "::1" or host.startswith("127."):
        return None
    return f"https://{parts.netloc}{parts.path.rstrip('/')}/.well-known/fluidbox-client.json"


def client_metadata_document(public_url: str, client_name: str = "fluidbox") -> dict[str, Any]:
    """The Client ID Metadata Document served at :func:`client_metadata_document_url` (its own URL is the
    ``client_id``): a public client using PKCE and refresh tokens, redirecting to ``/v1/oauth/callback``
    (connections) or ``/v1/mcp-oauth/catalog/callback`` (managed apps)."""
    client_id = client_metadata_document_url(public_url)
    if client_id is None:
        raise ValueError("a Client ID Metadata Document needs an https, non-loopback public URL")
    base = public_url.rstrip("/")
    return {
        "client_id": client_id,
        "client_name": client_name,
        "client_uri": base,
        "redirect_uris": [f"{base}/v1/oauth/callback", f"{base}/v1/mcp-oauth/catalog/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        "application_type": "web",
    }


def parse_callback(query: Mapping[str, str], expected_state: str) -> str:
    """The authorization code from a redirect's query, after checking ``state`` (constant time).

    Raises :class:`AuthorizationFailed` for an ``error`` answer (with the server's ``error_description``), a
    missing or foreign ``state``, or a missing code.
    """
    state = query.get("state")
    if state is None or not secrets.compare_digest(state.encode(), expected_state.encode()):
        raise AuthorizationFailed("the authorization response does not belong to this flow (state mismatch)")
    error = query.get("error")
    if error:
        description = query.get("error_description")
        detail = f": {_clip(description)}" if description else ""
        raise AuthorizationFailed(f"the authorization server answered {_clip(error)}{detail}", error=error)
    code = query.get("code")
    if not code:
        raise AuthorizationFailed("the authorization response carries no code")
    return code


# --------------------------------------------------------------------------------------------------------------------
# The client


Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_LIMIT else text[: _ERROR_TEXT_LIMIT - 1] + "…"


def _show(url: str) -> str:
    """``scheme://host[:port]/path`` for messages: no userinfo or query (either may carry secrets)."""
    try:
        parts = urlsplit(url)
        if not parts.scheme or not parts.netloc:
            return "<invalid url>"
        return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
    except ValueError:
        return "<invalid url>"


class OAuthClient:
    """OAuth for MCP connections, over admitted and pinned HTTP only. Stateless: safe to share."""

    def __init__(
        self,
        policy: UrlPolicy,
        *,
        client_name: str = "fluidbox",
        timeout: float = DEFAULT_TIMEOUT,
        verify: ssl.SSLContext | bool = True,
        clock: Clock = _utcnow,
    ) -> None:
        """Configure the client.

        Args:
            policy: outbound URL admission; loopback servers need ``UrlPolicy(allow_loopback=True)``.
            client_name: ``client_name`` sent on dynamic registration.
            timeout: seconds for each HTTP exchange (connect, write, read).
            verify: TLS verification for https endpoints.
            clock: the time source for ``expires_at`` (UTC).
        """
        self._policy = policy
        self._client_name = client_name
        self._timeout = timeout
        self._verify = verify
        self._clock = clock

    # ---------------------------------------------------------------------------------------------------------- http

    @asynccontextmanager
    async def _http(self, url: str) -> AsyncIterator[httpx2.AsyncClient]:
        admitted = await self._admit(url)
        client = httpx2.AsyncClient(
            transport=PinnedTransport(admitted, verify=self._verify),
            follow_redirects=False,
            trust_env=False,
            timeout=self._timeout,
        )
        async with client:
            yield client

    async def _admit(self, url: str) -> AdmittedUrl:
        try:
            return await self._policy.admit(url)
        except UrlRefused as exc:
            raise EndpointRefused(f"refusing to contact {_show(url)}: {exc}") from None

    async def admit_sign_in_page(self, url: str) -> AdmittedUrl:
        """Admit an authorization endpoint (or an authorization URL) before a browser is sent there from our
        origin: our redirect is a link people trust, so it passes the admission every outbound URL does (no
        private, link-local or metadata address) and must be https, plain http only on an admitted loopback
        address (development, ``allow_loopback``). Raises :class:`EndpointRefused`."""
        try:
            parts = urlsplit(url)
            # The query (state, PKCE challenge, a long scope list) is ours: the endpoint is what is judged.
            admitted = await self._policy.admit(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")))
        except (UrlRefused, ValueError) as exc:
            raise EndpointRefused(f"refusing to send a browser to {_show(url)}: {exc}") from None
        loopback = all(classify_address(ip) is RefusalCategory.LOOPBACK for ip in admitted.addresses)
        if admitted.scheme != "https" and not loopback:
            raise EndpointRefused(f"refusing to send a browser to {_show(url)}: a sign-in page must be https")
        return admitted

    async def _send(
        self, url: str, request: Callable[[httpx2.AsyncClient], Awaitable[httpx2.Response]]
    ) -> httpx2.Response:
        async with self._http(url) as client:
            try:
                response = await request(client)
                await response.aread()
                return response
            except httpx2.HTTPError as exc:
                raise EndpointUnreachable(
                    f"{_show(url)} did not answer: {_clip(str(exc)) or type(exc).__name__}"
                ) from None

    async def _get_json_document(self, url: str) -> tuple[int, Any]:
        """GET ``url`` → (status, parsed JSON or None). Redirects and non-JSON bodies read as "nothing here"."""
        response = await self._send(url, lambda c: c.get(url, headers={"Accept": "application/json"}))
        if response.status_code != 200:
            return response.status_code, None
        try:
            return 200, response.json()
        except ValueError:
            return 200, None

    # ----------------------------------------------------------------------------------------------------- discovery

    async def discover(self, server_url: str) -> Discovery:
        """Find the authorization server protecting the MCP server at ``server_url``.

        Raises :class:`DiscoveryFailed`, :class:`EndpointRefused` or :class:`EndpointUnreachable`.
        """
        probe = await self._send(
            server_url,
            lambda c: c.post(
                server_url,
                json=_MCP_PROBE,
                headers={"Accept": "application/json, text/event-stream"},
            ),
        )
        if probe.status_code != 401:
            raise DiscoveryFailed(
                f"{_show(server_url)} answered HTTP {probe.status_code} without a token, not 401: "
                "it does not ask for OAuth authorization"
            )
        challenge_url = extract_resource_metadata_from_www_auth(probe)
        challenge_scope = extract_scope_from_www_auth(probe)

        prm: ProtectedResourceMetadata | None = None
        prm_url = ""
        for candidate in build_protected_resource_metadata_discovery_urls(challenge_url, server_url):
            status, body = await self._get_json_document(candidate)
            if status == 200 and body is not None:
                try:
                    prm = ProtectedResourceMetadata.model_validate(body)
                except ValidationError:
                    raise DiscoveryFailed(f"{_show(candidate)} is not valid protected resource metadata") from None
                prm_url = candidate
                break
        if prm is None:
            raise DiscoveryFailed(f"{_show(server_url)} publishes no protected resource metadata (RFC 9728)")

        resource = str(prm.resource)
        if not check_resource_allowed(
            requested_resource=resource_url_from_server_url(server_url), configured_resource=resource
        ):
            raise DiscoveryFailed(
                f"the protected resource metadata names {_show(resource)}, which does not cover {_show(server_url)}"
            )
        issuer = str(prm.authorization_servers[0])
        metadata = await self._authorization_server_metadata(issuer, server_url)
        if "S256" not in (metadata.code_challenge_methods_supported or []):
            raise DiscoveryFailed(
                f"the authorization server {_show(issuer)} does not advertise PKCE S256 "
                "(code_challenge_methods_supported); refusing to use it"
            )
        scope = get_client_metadata_scopes(
            challenge_scope, prm, metadata, client_grant_types=["authorization_code", "refresh_token"]
        )
        await self.admit_sign_in_page(str(metadata.authorization_endpoint))
        logger.info("%s is protected by %s (resource %s)", _show(server_url), _show(issuer), _show(resource))
        return Discovery(
            server_url=server_url,
            resource=resource,
            resource_metadata_url=prm_url,
            authorization_server=AuthorizationServer(
                issuer=str(metadata.issuer),
                authorization_endpoint=str(metadata.authorization_endpoint),
                token_endpoint=str(metadata.token_endpoint),
                registration_endpoint=_opt(metadata.registration_endpoint),
                revocation_endpoint=_opt(metadata.revocation_endpoint),
                scopes_supported=metadata.scopes_supported,
                client_id_metadata_document_supported=bool(metadata.client_id_metadata_document_supported),
                authorization_response_iss_parameter_supported=bool(
                    metadata.authorization_response_iss_parameter_supported
                ),
            ),
            scope=scope,
        )

    async def _authorization_server_metadata(self, issuer: str, server_url: str) -> OAuthMetadata:
        for candidate in build_oauth_authorization_server_metadata_discovery_urls(issuer, server_url):
            status, body = await self._get_json_document(candidate)
            if status >= 500:
                raise DiscoveryFailed(f"{_show(candidate)} answered HTTP {status}")
            if status != 200 or body is None:
                continue
            try:
                metadata = OAuthMetadata.model_validate(body)
            except ValidationError:
                raise DiscoveryFailed(f"{_show(candidate)} is not valid authorization server metadata") from None
            # RFC 8414 §3.3: metadata for another issuer is an attack or a misconfiguration, never a fallback.
            if not issuers_match(str(metadata.issuer), issuer):
                raise DiscoveryFailed(
                    f"{_show(candidate)} describes issuer {_show(str(metadata.issuer))}, not {_show(issuer)}"
                )
            return metadata
        raise DiscoveryFailed(f"the authorization server {_show(issuer)} publishes no metadata (RFC 8414 / OpenID)")

    # ------------------------------------------------------------------------------------------------------ identity

    async def identify(
        self,
        discovery: Discovery,
        redirect_uri: str,
        *,
        preregistered: tuple[str, SecretStr | None] | None = None,
        metadata_document_url: str | None = None,
        known: ClientIdentity | None = None,
    ) -> ClientIdentity:
        """Our client identity at ``discovery``'s authorization server.

        Order: ``preregistered`` (client_id, optional secret) → ``known`` (a stored registration for this issuer
        and redirect URI) → ``metadata_document_url`` when the server supports Client ID Metadata Documents →
        dynamic registration. Raises :class:`RegistrationFailed` when nothing applies or registration is refused.
        """
        server = discovery.authorization_server
        if preregistered is not None:
            client_id, secret = preregistered
            return ClientIdentity(
                issuer=server.issuer,
                client_id=client_id,
                client_secret=secret,
                token_endpoint_auth_method="client_secret_basic" if secret is not None else "none",
                source="preregistered",
                redirect_uri=redirect_uri,
            )
        if known is not None and issuers_match(known.issuer, server.issuer) and known.redirect_uri == redirect_uri:
            return known
        if metadata_document_url is not None and server.client_id_metadata_document_supported:
            return ClientIdentity(
                issuer=server.issuer,
                client_id=metadata_document_url,
                source="cimd",
                redirect_uri=redirect_uri,
            )
        return await self.register(discovery, redirect_uri)

    async def register(self, discovery: Discovery, redirect_uri: str) -> ClientIdentity:
        """Dynamic Client Registration (RFC 7591) as a public web client using PKCE and refresh tokens."""
        server = discovery.authorization_server
        endpoint = server.registration_endpoint
        if endpoint is None:
            raise RegistrationFailed(
                f"the authorization server {_show(server.issuer)} offers no dynamic client registration; "
                "register a client there and supply its client_id"
            )
        request: dict[str, Any] = {
            "client_name": self._client_name,
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            "application_type": "web",
        }
        if discovery.scope:
            request["scope"] = discovery.scope
        response = await self._send(endpoint, lambda c: c.post(endpoint, json=request))
        if response.status_code not in (200, 201):
            raise RegistrationFailed(
                f"dynamic client registration at {_show(endpoint)} was refused (HTTP {response.status_code}): "
                f"{_oauth_error_text(response)}"
            )
        try:
            info = OAuthClientInformationFull.model_validate(response.json())
        except (ValueError, ValidationError):
            raise RegistrationFailed(f"{_show(endpoint)} answered the registration with an invalid document") from None
        method = info.token_endpoint_auth_method or "client_secret_basic"
        if method not in ("none", "client_secret_basic", "client_secret_post"):
            raise RegistrationFailed(f"the server registered us for unsupported token authentication {method!r}")
        if method != "none" and info.client_secret is None:
            raise RegistrationFailed(f"the server registered us for {method!r} but issued no client_secret")
        body = response.json()
        access = body.get("registration_access_token") if isinstance(body, dict) else None
        client_uri = body.get("registration_client_uri") if isinstance(body, dict) else None
        return ClientIdentity(
            issuer=server.issuer,
            client_id=info.client_id,
            client_secret=SecretStr(info.client_secret) if info.client_secret else None,
            token_endpoint_auth_method=method,
            source="dcr",
            redirect_uri=redirect_uri,
            registration_access_token=SecretStr(access) if isinstance(access, str) else None,
            registration_client_uri=client_uri if isinstance(client_uri, str) else None,
        )

    # ------------------------------------------------------------------------------------------------ browser leg

    def authorization_request(self, discovery: Discovery, client: ClientIdentity) -> AuthorizationRequest:
        """The authorization URL (code + PKCE S256 + state + resource). Sends nothing."""
        # The protocol half of authlib's client: builds the URL and the S256 challenge, needs no HTTP session.
        oauth = OAuth2Client(
            None,
            client_id=client.client_id,
            redirect_uri=client.redirect_uri,
            code_challenge_method="S256",
        )
        verifier = generate_token(64)  # RFC 7636 §4.1: 43..128 unreserved characters
        params: dict[str, str] = {"resource": discovery.resource}
        if discovery.scope:
            params["scope"] = discovery.scope
            # OpenID Core §11: offline_access (our refresh token) is only honoured with an explicit consent prompt.
            if "offline_access" in discovery.scope.split():
                params["prompt"] = "consent"
        url, state = oauth.create_authorization_url(
            discovery.authorization_server.authorization_endpoint,
            state=generate_token(43),
            code_verifier=verifier,
            **params,
        )
        return AuthorizationRequest(
            url=url,
            state=SecretStr(state),
            code_verifier=SecretStr(verifier),
            resource=discovery.resource,
            redirect_uri=client.redirect_uri,
        )

    # ------------------------------------------------------------------------------------------------ token legs

    async def exchange_code(
        self,
        server: AuthorizationServer,
        client: ClientIdentity,
        code: str,
        code_verifier: SecretStr,
        resource: str,
    ) -> TokenSet:
        """Redeem an authorization code (with ``code_verifier`` and ``resource``); requires a refresh token."""
        token = await self._token_call(
            server,
            client,
            lambda oauth: oauth.fetch_token(
                server.token_endpoint,
                grant_type="authorization_code",
                code=code,
                code_verifier=code_verifier.get_secret_value(),
                redirect_uri=client.redirect_uri,
                resource=resource,
            ),
        )
        tokens = self._token_set(token, previous_refresh=None)
        if tokens.refresh_token is None:
            raise MissingRefreshToken(
                f"the authorization server {_show(server.issuer)} issued no refresh token; the connection "
                "would stop working when its first access token expires"
            )
        return tokens

    async def refresh(
        self,
        server: AuthorizationServer,
        client: ClientIdentity,
        refresh_token: SecretStr,
        resource: str,
    ) -> TokenSet:
        """Exchange a refresh token for new tokens. When the server rotates, the result carries the new refresh
        token (``rotated=True``) and the old one must be discarded. Raises :class:`InvalidGrant` when the grant
        is gone (revoked, expired, a rotated token reused), with the server's reason."""
        old = refresh_token.get_secret_value()
        token = await self._token_call(
            server,
            client,
            lambda oauth: oauth.refresh_token(server.token_endpoint, refresh_token=old, resource=resource),
        )
        return self._token_set(token, previous_refresh=old)

    async def revoke(self, server: AuthorizationServer, client: ClientIdentity, token: SecretStr) -> None:
        """Revoke a token at the server's RFC 7009 endpoint (no-op when it has none)."""
        endpoint = server.revocation_endpoint
        if endpoint is None:
            return
        response: httpx2.Response = await self._token_call(
            server,
            client,
            lambda oauth: oauth.revoke_token(endpoint, token=token.get_secret_value()),
            url=endpoint,
        )
        if response.status_code != 200:
            raise TokenRequestFailed(
                f"revocation at {_show(endpoint)} failed (HTTP {response.status_code}): {_oauth_error_text(response)}",
                error=str(response.status_code),
            )

    async def _token_call(
        self,
        server: AuthorizationServer,
        client: ClientIdentity,
        call: Callable[[AsyncOAuth2Client], Awaitable[Any]],
        *,
        url: str | None = None,
    ) -> Any:
        endpoint = url or server.token_endpoint
        admitted = await self._admit(endpoint)
        oauth = AsyncOAuth2Client(
            client_id=client.client_id,
            client_secret=client.client_secret.get_secret_value() if client.client_secret else None,
            token_endpoint_auth_method=client.token_endpoint_auth_method,
            revocation_endpoint_auth_method=client.token_endpoint_auth_method,
            redirect_uri=client.redirect_uri,
            transport=PinnedTransport(admitted, verify=self._verify),
            follow_redirects=False,
            trust_env=False,
            timeout=self._timeout,
        )
        async with oauth:
            try:
                return await call(oauth)
            except OAuthError as exc:
                error = str(exc.error or "invalid_request")
                description = _clip(exc.description) if exc.description else None
                detail = f": {description}" if description else ""
                message = f"the authorization server {_show(server.issuer)} refused the token request ({error}{detail})"
                cls = InvalidGrant if error == "invalid_grant" else TokenRequestFailed
                raise cls(message, error=error, description=description) from None
            except httpx2.HTTPStatusError as exc:
                status = exc.response.status_code
                raise TokenRequestFailed(
                    f"the token endpoint {_show(endpoint)} answered HTTP {status} without an OAuth error",
                    error=f"http_{status}",
                ) from None
            except httpx2.HTTPError as exc:
                raise EndpointUnreachable(
                    f"{_show(endpoint)} did not answer: {_clip(str(exc)) or type(exc).__name__}"
                ) from None
            except ValueError as exc:
                raise TokenRequestFailed(
                    f"the token endpoint {_show(endpoint)} answered with an unreadable body ({_clip(str(exc))})",
                    error="invalid_response",
                ) from None

    def _token_set(self, token: Mapping[str, Any], previous_refresh: str | None) -> TokenSet:
        access = token.get("access_token")
        if not isinstance(access, str) or not access:
            raise TokenRequestFailed("the token response carries no access_token", error="invalid_response")
        token_type = str(token.get("token_type") or "Bearer")
        if token_type.lower() != "bearer":
            raise TokenRequestFailed(f"unsupported token type {_clip(token_type)!r}", error="invalid_response")
        expires_at: datetime | None = None
        expires_in = token.get("expires_in")
        if expires_in is not None:
            try:
                expires_at = self._clock() + timedelta(seconds=int(expires_in))
            except (TypeError, ValueError):
                raise TokenRequestFailed(
                    "the token response has a non-numeric expires_in", error="invalid_response"
                ) from None
        new_refresh = token.get("refresh_token")
        refresh = new_refresh if isinstance(new_refresh, str) and new_refresh else previous_refresh
        scope = token.get("scope")
        return TokenSet(
            access_token=SecretStr(access),
            refresh_token=SecretStr(refresh) if refresh else None,
            token_type="Bearer",
            expires_at=expires_at,
            scope=scope if isinstance(scope, str) else None,
            rotated=previous_refresh is not None and refresh is not None and refresh != previous_refresh,
        )


def _opt(value: object | None) -> str | None:
    return None if value is None else str(value)


def _oauth_error_text(response: httpx2.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return "no OAuth error in the answer"
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        description = body.get("error_description")
        return _clip(f"{body['error']}: {description}" if isinstance(description, str) else body["error"])
    return "no OAuth error in the answer"
