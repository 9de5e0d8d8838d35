"""A real OAuth authorization server and a real OAuth-protected MCP server, for tests.

The authorization server is the npm package ``oidc-provider`` (installed into ``.node/`` by ``make install``),
configured by ``tests/oauth_provider.mjs``: dynamic client registration, PKCE S256 required, resource indicators
with JWT access tokens, refresh-token rotation, short access-token lifetimes, revocation. It runs as a node child
process on a free loopback port::

    async with authorization_server(access_ttl=60) as auth:
        auth.issuer                                 # "http://127.0.0.1:<port>"
        callback = await auth.sign_in(url)          # completes login + consent over HTTP; the redirect it ends on
        await auth.requests()                       # what reached /auth and /token, as the provider parsed it

The MCP server is the ``mcp`` SDK's ``MCPServer`` with its own resource-server support: it publishes protected
resource metadata (RFC 9728) naming that issuer, answers 401 with ``WWW-Authenticate: Bearer …
resource_metadata="…"`` to a request without a valid token, and accepts only JWT access tokens whose signature
verifies against the provider's JWKS, whose issuer is the provider and whose audience is this server::

    async with serve(protected(auth)) as mcp:       # tests.mcp_servers.serve
        mcp.url                                     # "http://127.0.0.1:<port>/mcp"
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import jwt
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp

from tests.mcp_servers import McpTestServer, Recorder, _Gate

__all__ = ["AuthorizationServer", "JwksTokenVerifier", "authorization_server", "protected"]

ROOT = Path(__file__).resolve().parents[1]
PROVIDER_SCRIPT = ROOT / "tests" / "oauth_provider.mjs"
PROVIDER_MODULE = ROOT / ".node" / "node_modules" / "oidc-provider" / "lib" / "index.js"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
RESOURCE_SCOPE = "mcp:tools"
_MAX_INTERACTION_STEPS = 10


@dataclass
class AuthorizationServer:
    """A running oidc-provider: its issuer, metadata, and test helpers."""

    issuer: str
    metadata: dict[str, Any]
    process: asyncio.subprocess.Process

    @property
    def jwks_uri(self) -> str:
        return str(self.metadata["jwks_uri"])

    async def requests(self) -> list[dict[str, Any]]:
        """Every request that reached the authorization or token endpoint: ``{route, status, params}``."""
        async with httpx.AsyncClient(trust_env=False) as http:
            r = await http.get(f"{self.issuer}/__test/requests")
            r.raise_for_status()
            return list(r.json())

    async def clear_requests(self) -> None:
        async with httpx.AsyncClient(trust_env=False) as http:
            (await http.delete(f"{self.issuer}/__test/requests")).raise_for_status()

    async def sign_in(self, authorization_url: str, *, login: str = "alice", approve: bool = True) -> str:
        """Play the browser: open ``authorization_url``, sign in as ``login``, approve (or deny) the consent.

        Returns the URL the provider finally redirects to outside itself (the client's redirect URI with
        ``code``/``state``, or ``error``). Nothing listens there; the redirect is only read.
        """
        async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as browser:
            response = await browser.get(authorization_url)
            for _ in range(_MAX_INTERACTION_STEPS):
                if response.is_redirect:
                    target = urljoin(str(response.url), response.headers["location"])
                    if not _same_origin(target, self.issuer):
                        return target
                    response = await browser.get(target)
                elif response.status_code == 200 and urlsplit(str(response.url)).path.startswith("/interaction/"):
                    form = {"login": login, "decision": "approve" if approve else "deny"}
                    response = await browser.post(str(response.url), data=form)
                else:
                    raise AssertionError(f"unexpected answer from the provider: {response.status_code} {response.text}")
        raise AssertionError(f"the sign-in did not finish within {_MAX_INTERACTION_STEPS} steps")


def _same_origin(a: str, b: str) -> bool:
    x, y = urlsplit(a), urlsplit(b)
    return (x.scheme, x.netloc) == (y.scheme, y.netloc)


@contextlib.asynccontextmanager
async def authorization_server(
    *, access_ttl: int = 60, issue_refresh: bool = True
) -> AsyncIterator[AuthorizationServer]:
    """Start ``oidc-provider`` on a free loopback port; stop it afterwards.

    ``access_ttl``: access-token lifetime in seconds. ``issue_refresh=False``: the provider never issues refresh
    tokens.
    """
    node = shutil.which("node")
    if node is None or not PROVIDER_MODULE.is_file():
        missing = "node is not on PATH" if node is None else f"no {PROVIDER_MODULE}"
        raise RuntimeError(f"oidc-provider cannot run ({missing}): install Node.js 20+ and run `make install`")
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "FBX_TEST_OIDC_PROVIDER_MODULE": str(PROVIDER_MODULE),
        "FBX_TEST_AS_ACCESS_TTL": str(access_ttl),
        "FBX_TEST_AS_ISSUE_REFRESH": "1" if issue_refresh else "0",
    }
    proc = await asyncio.create_subprocess_exec(
        node,
        str(PROVIDER_SCRIPT),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            line = b""
        if not line:
            await _stop(proc)
            err = await proc.stderr.read()
            raise RuntimeError(f"oidc-provider did not start: {err.decode(errors='replace')}")
        issuer = str(json.loads(line)["issuer"])
        async with httpx.AsyncClient(trust_env=False) as http:
            metadata = (await http.get(f"{issuer}/.well-known/openid-configuration")).json()
        yield AuthorizationServer(issuer=issuer, metadata=metadata, process=proc)
    finally:
        await _stop(proc)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


class JwksTokenVerifier:
    """The SDK's ``TokenVerifier``: a JWT access token signed by the issuer's JWKS, for this exact audience."""

    def __init__(self, issuer: str, jwks_uri: str, audience: str) -> None:
        self._issuer = issuer
        self._audience = audience
        self._jwks = jwt.PyJWKClient(jwks_uri, cache_keys=True)
        self.accepted = 0
        self.refused = 0

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            claims = await asyncio.to_thread(self._decode, token)
        except jwt.PyJWTError:
            self.refused += 1
            return None
        self.accepted += 1
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id", "")),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=int(claims["exp"]),
            resource=self._audience,
            subject=str(claims.get("sub")) if claims.get("sub") is not None else None,
            claims={"iss": claims["iss"]},
        )

    def _decode(self, token: str) -> dict[str, Any]:
        key = self._jwks.get_signing_key_from_jwt(token)
        return dict(
            jwt.decode(
                token,
                key.key,
                algorithms=["RS256", "PS256", "ES256", "EdDSA"],
                audience=self._audience,
                issuer=self._issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
        )


def _protected_app(recorder: Recorder, url: str, auth: AuthorizationServer) -> ASGIApp:
    verifier = JwksTokenVerifier(auth.issuer, auth.jwks_uri, url)
    srv = MCPServer(
        "fluidbox-test-protected",
        version="0.1",
        token_verifier=verifier,
        auth=AuthSettings(
            issuer_url=auth.issuer,  # type: ignore[arg-type]
            resource_server_url=url,  # type: ignore[arg-type]
            required_scopes=[RESOURCE_SCOPE],
            validate_token_resource=True,
        ),
    )

    @srv.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        recorder.record_execution("add")
        return a + b

    @srv.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        recorder.record_execution("echo")
        return text

    return _Gate(srv.streamable_http_app(), recorder)


def protected(auth: AuthorizationServer) -> McpTestServer:
    """Tools ``add`` and ``echo`` behind OAuth: only access tokens ``auth`` issued for this server's URL."""

    def needs_url(recorder: Recorder) -> ASGIApp:
        raise RuntimeError("the protected server must be built with its URL (tests.mcp_servers.serve does)")

    return McpTestServer("protected", needs_url, build_at=lambda rec, url: _protected_app(rec, url, auth))
