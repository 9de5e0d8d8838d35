"""integrations.oauth against a real authorization server (npm oidc-provider) and a real OAuth-protected MCP server.

Nothing is mocked: the provider registers clients, enforces PKCE, binds tokens to resources and rotates refresh
tokens itself; the MCP server verifies the JWTs against the provider's JWKS.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from integrations import mcp_client
from integrations.oauth import (
    AuthorizationFailed,
    AuthorizationRequest,
    ClientIdentity,
    Discovery,
    DiscoveryFailed,
    EndpointRefused,
    InvalidGrant,
    MissingRefreshToken,
    OAuthClient,
    TokenSet,
    client_metadata_document,
    client_metadata_document_url,
    needs_refresh,
    parse_callback,
)
from integrations.urls import UrlPolicy
from tests.mcp_servers import McpTestServer, Recorder, RunningServer, basic, serve
from tests.oauth_servers import AuthorizationServer, authorization_server, protected

REDIRECT_URI = "http://127.0.0.1:8787/v1/oauth/callback"


@pytest.fixture(scope="module")
async def auth() -> AsyncIterator[AuthorizationServer]:
    async with authorization_server(access_ttl=60) as server:
        yield server


@pytest.fixture(scope="module")
async def mcp(auth: AuthorizationServer) -> AsyncIterator[RunningServer]:
    async with serve(protected(auth)) as server:
        yield server


@pytest.fixture
def client() -> OAuthClient:
    return OAuthClient(UrlPolicy(allow_loopback=True))


@dataclass
class Connected:
    discovery: Discovery
    identity: ClientIdentity
    request: AuthorizationRequest
    tokens: TokenSet


async def connect(client: OAuthClient, auth: AuthorizationServer, mcp_url: str) -> Connected:
    """The whole connect flow: discover, register, authorize in the 'browser', exchange the code."""
    discovery = await client.discover(mcp_url)
    identity = await client.identify(discovery, REDIRECT_URI)
    request = client.authorization_request(discovery, identity)
    landed = await auth.sign_in(request.url)
    code = parse_callback(dict(parse_qsl(urlsplit(landed).query)), request.state.get_secret_value())
    tokens = await client.exchange_code(
        discovery.authorization_server, identity, code, request.code_verifier, discovery.resource
    )
    return Connected(discovery, identity, request, tokens)


def bearer(tokens: TokenSet) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens.access_token.get_secret_value()}"}


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


# --------------------------------------------------------------------------------------------------------------------
# Discovery and client identity


async def test_discovery_follows_the_servers_401_to_resource_and_authorization_server_metadata(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    d = await client.discover(mcp.url)
    assert d.resource == mcp.url
    assert d.resource_metadata_url == mcp.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    server = d.authorization_server
    assert server.issuer == auth.issuer
    assert server.authorization_endpoint == auth.metadata["authorization_endpoint"]
    assert server.token_endpoint == auth.metadata["token_endpoint"]
    assert server.registration_endpoint == auth.metadata["registration_endpoint"]
    assert server.revocation_endpoint == auth.metadata["revocation_endpoint"]
    assert d.scope is not None and set(d.scope.split()) == {"mcp:tools", "offline_access"}


async def test_discovery_refuses_a_server_that_asks_for_no_authorization(client: OAuthClient) -> None:
    async with serve(basic()) as open_server:
        with pytest.raises(DiscoveryFailed, match="does not ask for OAuth"):
            await client.discover(open_server.url)


async def test_loopback_servers_are_refused_unless_the_policy_allows_loopback(mcp: RunningServer) -> None:
    with pytest.raises(EndpointRefused, match="loopback"):
        await OAuthClient(UrlPolicy()).discover(mcp.url)


async def test_dynamic_registration_makes_a_public_client_and_a_known_registration_is_reused(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    d = await client.discover(mcp.url)
    identity = await client.identify(d, REDIRECT_URI)
    assert identity.source == "dcr"
    assert identity.issuer == auth.issuer and identity.redirect_uri == REDIRECT_URI
    assert identity.token_endpoint_auth_method == "none" and identity.client_secret is None

    again = await client.identify(d, REDIRECT_URI, known=identity)
    assert again == identity
    other_redirect = await client.identify(d, "http://127.0.0.1:8787/v1/other", known=identity)
    assert other_redirect.source == "dcr" and other_redirect.client_id != identity.client_id


async def test_identity_prefers_a_preregistered_client_and_uses_cimd_only_where_supported(
    client: OAuthClient, mcp: RunningServer
) -> None:
    d = await client.discover(mcp.url)
    pre = await client.identify(d, REDIRECT_URI, preregistered=("my-client", SecretStr("s3cret")))
    assert (pre.source, pre.client_id, pre.token_endpoint_auth_method) == (
        "preregistered",
        "my-client",
        "client_secret_basic",
    )
    assert "s3cret" not in repr(pre)
    # oidc-provider does not advertise Client ID Metadata Documents, so the document URL is not used.
    cimd = await client.identify(d, REDIRECT_URI, metadata_document_url="https://fluidbox.example/x.json")
    assert cimd.source == "dcr"


def test_the_client_metadata_document_url_exists_only_for_public_https_deployments() -> None:
    assert (
        client_metadata_document_url("https://fluidbox.example.com")
        == "https://fluidbox.example.com/.well-known/fluidbox-client.json"
    )
    assert client_metadata_document_url("http://fluidbox.example.com") is None
    assert client_metadata_document_url("https://127.0.0.1:8787") is None
    assert client_metadata_document_url("https://localhost") is None
    assert client_metadata_document_url("https://[::1]:8787") is None
    doc = client_metadata_document("https://fluidbox.example.com/")
    assert doc["client_id"] == "https://fluidbox.example.com/.well-known/fluidbox-client.json"
    assert doc["redirect_uris"] == [
        "https://fluidbox.example.com/v1/oauth/callback",
        "https://fluidbox.example.com/v1/mcp-oauth/catalog/callback",
    ]
    assert doc["token_endpoint_auth_method"] == "none"
    with pytest.raises(ValueError, match="https"):
        client_metadata_document("http://127.0.0.1:8787")


# --------------------------------------------------------------------------------------------------------------------
# The code flow


async def test_pkce_s256_and_the_resource_indicator_reach_the_provider_on_both_legs(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    await auth.clear_requests()
    c = await connect(client, auth, mcp.url)
    seen = await auth.requests()
    authorize = [r["params"] for r in seen if r["route"] == "authorization"]
    token = [r["params"] for r in seen if r["route"] == "token"]
    assert len(authorize) == 1 and len(token) == 1, seen
    verifier = c.request.code_verifier.get_secret_value()
    assert authorize[0]["code_challenge_method"] == "S256"
    assert authorize[0]["code_challenge"] == s256(verifier)
    assert authorize[0]["resource"] == mcp.url
    assert authorize[0]["state"] == c.request.state.get_secret_value()
    assert authorize[0]["client_id"] == c.identity.client_id
    assert token[0]["grant_type"] == "authorization_code"
    assert token[0]["code_verifier"] == verifier
    assert token[0]["resource"] == mcp.url


async def test_the_access_token_opens_the_mcp_server_and_nothing_else_does(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    c = await connect(client, auth, mcp.url)
    assert c.tokens.refresh_token is not None
    assert c.tokens.expires_at is not None and c.tokens.scope is not None and "mcp:tools" in c.tokens.scope

    photo = await mcp_client.photograph(mcp.url, bearer(c.tokens))
    assert [t["name"] for t in photo.tools] == ["add", "echo"]
    outcome = await mcp_client.call_tool(
        mcp.url, bearer(c.tokens), "add", {"a": 2, "b": 3}, expected_protocol=photo.protocol_version
    )
    assert outcome.outcome == "succeeded"

    with pytest.raises(mcp_client.AuthRejected) as no_token:
        await mcp_client.photograph(mcp.url, {})
    assert no_token.value.status == 401
    with pytest.raises(mcp_client.AuthRejected):
        await mcp_client.photograph(mcp.url, {"Authorization": "Bearer not-a-token"})


async def test_a_token_for_another_resource_is_refused(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    async with serve(protected(auth)) as other:
        c = await connect(client, auth, other.url)
        assert (await mcp_client.photograph(other.url, bearer(c.tokens))).tools
        with pytest.raises(mcp_client.AuthRejected):
            await mcp_client.photograph(mcp.url, bearer(c.tokens))


async def test_a_denied_consent_comes_back_as_the_providers_error(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    d = await client.discover(mcp.url)
    identity = await client.identify(d, REDIRECT_URI)
    request = client.authorization_request(d, identity)
    landed = await auth.sign_in(request.url, approve=False)
    with pytest.raises(AuthorizationFailed, match="the user refused") as denied:
        parse_callback(dict(parse_qsl(urlsplit(landed).query)), request.state.get_secret_value())
    assert denied.value.error == "access_denied"


async def test_a_callback_with_someone_elses_state_is_refused(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    d = await client.discover(mcp.url)
    identity = await client.identify(d, REDIRECT_URI)
    mine = client.authorization_request(d, identity)
    theirs = client.authorization_request(d, identity)
    landed = await auth.sign_in(theirs.url)
    with pytest.raises(AuthorizationFailed, match="state mismatch"):
        parse_callback(dict(parse_qsl(urlsplit(landed).query)), mine.state.get_secret_value())


async def test_a_server_that_issues_no_refresh_token_is_refused(client: OAuthClient) -> None:
    async with authorization_server(issue_refresh=False) as stingy, serve(protected(stingy)) as server:
        with pytest.raises(MissingRefreshToken, match="no refresh token"):
            await connect(client, stingy, server.url)


# --------------------------------------------------------------------------------------------------------------------
# Refresh


async def test_refresh_rotates_the_refresh_token_and_the_old_one_is_refused(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    c = await connect(client, auth, mcp.url)
    # The provider's access tokens live 60 s, well inside the 300 s refresh margin: due at once.
    assert needs_refresh(c.tokens, datetime.now(UTC))
    old = c.tokens.refresh_token
    assert old is not None

    await auth.clear_requests()
    fresh = await client.refresh(c.discovery.authorization_server, c.identity, old, c.discovery.resource)
    assert fresh.rotated and fresh.refresh_token is not None
    assert fresh.refresh_token.get_secret_value() != old.get_secret_value()
    assert fresh.access_token.get_secret_value() != c.tokens.access_token.get_secret_value()
    sent = [r["params"] for r in await auth.requests() if r["route"] == "token"]
    assert sent and sent[0]["grant_type"] == "refresh_token" and sent[0]["resource"] == mcp.url
    assert (await mcp_client.photograph(mcp.url, bearer(fresh))).tools

    with pytest.raises(InvalidGrant) as reused:
        await client.refresh(c.discovery.authorization_server, c.identity, old, c.discovery.resource)
    assert reused.value.error == "invalid_grant" and reused.value.reason
    assert old.get_secret_value() not in str(reused.value)


async def test_a_revoked_grant_makes_refresh_fail_with_the_providers_reason(
    client: OAuthClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    c = await connect(client, auth, mcp.url)
    refresh_token = c.tokens.refresh_token
    assert refresh_token is not None
    await client.revoke(c.discovery.authorization_server, c.identity, refresh_token)
    with pytest.raises(InvalidGrant) as revoked:
        await client.refresh(c.discovery.authorization_server, c.identity, refresh_token, c.discovery.resource)
    assert revoked.value.reason and revoked.value.reason in str(revoked.value)
    assert refresh_token.get_secret_value() not in str(revoked.value)


def test_needs_refresh_uses_the_margin() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    tokens = TokenSet(access_token=SecretStr("a"), refresh_token=None, expires_at=now + timedelta(seconds=301))
    assert not needs_refresh(tokens, now)
    assert needs_refresh(tokens, now + timedelta(seconds=2))
    assert not needs_refresh(tokens.model_copy(update={"expires_at": None}), now)
    assert "a'" not in repr(tokens) and "**" in repr(tokens)


# --------------------------------------------------------------------------------------------------------------------
# Misbehaving servers: what discovery refuses, and that it never follows a redirect


def misbehaving(
    *, prm: Callable[[str], Response], as_metadata: Callable[[str], Response] | None = None
) -> McpTestServer:
    """A resource server (and, at the same origin, an authorization server's metadata) answering what the test
    says. ``prm(url)`` / ``as_metadata(origin)`` build the answers from the server's own URL."""

    def build_at(recorder: Recorder, url: str) -> ASGIApp:
        origin = url.removesuffix("/mcp")

        async def mcp_endpoint(request: Request) -> Response:
            header = f'Bearer resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"'
            return JSONResponse({"error": "invalid_token"}, status_code=401, headers={"WWW-Authenticate": header})

        async def prm_endpoint(request: Request) -> Response:
            return prm(url)

        async def as_endpoint(request: Request) -> Response:
            return as_metadata(origin) if as_metadata else JSONResponse({}, status_code=404)

        return Starlette(
            routes=[
                Route("/mcp", mcp_endpoint, methods=["GET", "POST"]),
                Route("/.well-known/oauth-protected-resource/mcp", prm_endpoint),
                Route("/.well-known/oauth-authorization-server", as_endpoint),
            ]
        )

    def no_url(recorder: Recorder) -> ASGIApp:
        raise RuntimeError("built with its URL")

    return McpTestServer("misbehaving", no_url, build_at=build_at)


def as_document(origin: str, **overrides: object) -> JSONResponse:
    doc: dict[str, object] = {
        "issuer": origin,
        "authorization_endpoint": f"{origin}/auth",
        "token_endpoint": f"{origin}/token",
        "code_challenge_methods_supported": ["S256"],
    }
    return JSONResponse(doc | overrides)


async def test_a_metadata_redirect_to_another_origin_is_never_followed(client: OAuthClient, mcp: RunningServer) -> None:
    # The redirect target is the real protected server's metadata: following it would succeed.
    target = mcp.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    async with serve(misbehaving(prm=lambda url: RedirectResponse(target, status_code=302))) as server:
        before = len(mcp.spec.recorder.http_requests)
        with pytest.raises(DiscoveryFailed, match="publishes no protected resource metadata"):
            await client.discover(server.url)
        assert len(mcp.spec.recorder.http_requests) == before


async def test_a_resource_metadata_url_on_a_private_address_is_refused_before_any_request(
    client: OAuthClient,
) -> None:
    def build_at(recorder: Recorder, url: str) -> ASGIApp:
        async def mcp_endpoint(request: Request) -> Response:
            header = 'Bearer resource_metadata="http://10.0.0.7/.well-known/oauth-protected-resource"'
            return JSONResponse({}, status_code=401, headers={"WWW-Authenticate": header})

        return Starlette(routes=[Route("/mcp", mcp_endpoint, methods=["POST"])])

    async with serve(McpTestServer("ssrf", lambda rec: Starlette(), build_at=build_at)) as server:
        with pytest.raises(EndpointRefused, match=r"10\.0\.0\.7"):
            await client.discover(server.url)


async def test_metadata_naming_another_resource_is_refused(client: OAuthClient) -> None:
    def prm(url: str) -> Response:
        return JSONResponse({"resource": "https://elsewhere.example.com/mcp", "authorization_servers": [url]})

    async with serve(misbehaving(prm=prm)) as server:
        with pytest.raises(DiscoveryFailed, match="does not cover"):
            await client.discover(server.url)


async def test_authorization_server_metadata_for_another_issuer_is_refused(client: OAuthClient) -> None:
    def prm(url: str) -> Response:
        return JSONResponse({"resource": url, "authorization_servers": [url.removesuffix("/mcp")]})

    impostor = misbehaving(prm=prm, as_metadata=lambda origin: as_document(origin, issuer="https://evil.example.com"))
    async with serve(impostor) as server:
        with pytest.raises(DiscoveryFailed, match="describes issuer"):
            await client.discover(server.url)


async def test_an_authorization_server_without_pkce_s256_is_refused(client: OAuthClient) -> None:
    def prm(url: str) -> Response:
        return JSONResponse({"resource": url, "authorization_servers": [url.removesuffix("/mcp")]})

    plain = misbehaving(
        prm=prm, as_metadata=lambda origin: as_document(origin, code_challenge_methods_supported=["plain"])
    )
    async with serve(plain) as server:
        with pytest.raises(DiscoveryFailed, match="S256"):
            await client.discover(server.url)


def sign_in_page_at(endpoint: str) -> McpTestServer:
    def prm(url: str) -> Response:
        return JSONResponse({"resource": url, "authorization_servers": [url.removesuffix("/mcp")]})

    return misbehaving(prm=prm, as_metadata=lambda origin: as_document(origin, authorization_endpoint=endpoint))


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("http://10.0.0.8/authorize", r"10\.0\.0\.8 is a private address"),
        ("https://169.254.169.254/authorize", "a cloud metadata address"),
        ("http://auth.example.com/authorize", "a sign-in page must be https"),
    ],
)
async def test_an_authorization_endpoint_our_admission_refuses_fails_discovery(endpoint: str, why: str) -> None:
    """We redirect browsers there from our own origin: it is admitted like any outbound URL, and must be https
    (plain http only on loopback, when loopback is allowed)."""
    public = OAuthClient(UrlPolicy(allow_loopback=True, resolver=lambda host, port: ["93.184.216.34"]))
    async with serve(sign_in_page_at(endpoint)) as server:
        with pytest.raises(EndpointRefused, match=f"refusing to send a browser to .*{why}"):
            await public.discover(server.url)


async def test_an_https_sign_in_page_on_a_public_address_is_admitted() -> None:
    public = OAuthClient(UrlPolicy(allow_loopback=True, resolver=lambda host, port: ["93.184.216.34"]))
    async with serve(sign_in_page_at("https://auth.example.com/authorize")) as server:
        found = await public.discover(server.url)
    assert found.authorization_server.authorization_endpoint == "https://auth.example.com/authorize"
    admitted = await public.admit_sign_in_page(f"{found.authorization_server.authorization_endpoint}?state=x")
    assert admitted.addresses == (ipaddress.ip_address("93.184.216.34"),)
