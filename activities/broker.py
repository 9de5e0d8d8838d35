"""Brokered MCP calls, executed in the control plane with the sealed credential.

Order for every call: binding re-check against live state → unseal (static) or an access token from
:class:`services.oauth_tokens.AccessTokens` (oauth) → claim CAS → one call through the connection's transport
provider (:mod:`integrations.transports`: MCP over HTTP, OpenAPI, HTTP, stdio MCP) → settle the claim and write
the single ``tool.brokered`` event. The agent never sees the credential.

For an OAuth connection the sealed credential is the refresh token: it never goes upstream. A server that answers
401 (nothing ran) gets one more call with a token refreshed past the rejected one; a refresh the authorization
server refuses leaves the connection in ``error`` and fails the call closed with the provider's reason. A static
credential the server answers 401 to (rotated or revoked upstream) puts the connection in ``error`` and parks the
call until an admin supplies a new credential, as a revoked one does (when its requirement parks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import SecretStr
from temporalio import activity

from contracts import temporal as c
from core import events as ev
from core.access import access_of
from core.digests import document_digest
from core.errors import Conflict, GrantLost, NotFound
from core.redaction import MARK
from core.states import accepts_work
from core.tools import split_mcp
from db.connections import Connections, DispatchView, credential_context
from db.parks import Parks
from db.runs import Runs
from integrations import mcp_client
from integrations.mcp_pool import SessionPool
from integrations.oauth import OAuthClientError
from integrations.sealing import Sealer, SealingError
from integrations.transports import TransportConnection, TransportDeps, Transports, UnknownTransport
from integrations.urls import UrlPolicy

REJECTED = "the server rejected the bound connection's credential (HTTP 401); supply a new one"


class AccessTokenSource(Protocol):
    """Access tokens of OAuth connections (``services.oauth_tokens.AccessTokens``, injected by the worker)."""

    async def get(
        self, tenant_id: str, connection_id: str, generation: int, *, rejected: SecretStr | None = None
    ) -> SecretStr: ...


class BrokerActivities:
    def __init__(
        self,
        connections: Connections,
        parks: Parks,
        runs: Runs,
        sealer: Sealer | None,
        url_policy: UrlPolicy,
        pool: SessionPool | None = None,
        tokens: AccessTokenSource | None = None,
        transports: Transports | None = None,
    ) -> None:
        self.connections = connections
        self.runs = runs
        self.parks = parks
        self.sealer = sealer
        self.url_policy = url_policy
        # Kept-open MCP sessions (one HTTP exchange per call instead of four); None: a fresh session per call.
        self.pool = pool
        # Access tokens of OAuth connections; None: OAuth-backed bindings are refused.
        self.tokens = tokens
        # The providers that speak each connection transport (mcp_http rides the pool above).
        self.transports = transports or Transports(TransportDeps(url_policy, pool))

    async def _refuse(self, inp: c.BrokerIn, claim: DispatchView, reason: str) -> c.BrokerOut:
        """A binding that no longer holds denies the call: no credential is touched, nothing is sent."""
        taken = await self.connections.take(inp.run_id, inp.tool_call_id, inp.input_digest)
        if taken is None:
            current = await self.connections.claim(inp.run_id, inp.tool_call_id, inp.input_digest)
            return c.BrokerOut(state=current.state if current else "missing")
        access = access_of(await self.runs.run_spec(inp.run_id), claim.tool)
        decision = ev.binding_denied(inp.tool_call_id, claim.tool, reason, access)
        row = await self.connections.settle(
            inp.run_id, inp.tool_call_id, inp.input_digest, "refused", None, reason, decision
        )
        return c.BrokerOut(state=row.state)

    async def _unavailable(self, inp: c.BrokerIn, claim: DispatchView, reason: str) -> c.BrokerOut:
        """The bound connection is not usable (missing, revoked, in error, reauthorized, a credential gone): the
        call parks when its requirement says ``when_unavailable: park`` (nothing is taken, nothing is sent; the
        workflow waits and calls again), else it is refused as before."""
        spec = await self.runs.run_spec(inp.run_id)
        surface = next((b for b in spec.brokered if str(b["binding_id"]) == str(claim.binding_id)), None)
        if surface is not None and surface.get("when_unavailable") == "park" and accepts_work(claim.run_status):
            return c.BrokerOut(state="parked", reason=reason)
        return await self._refuse(inp, claim, reason)

    async def _credential_rejected(
        self, inp: c.BrokerIn, claim: DispatchView, brokered: list[dict[str, Any]]
    ) -> c.BrokerOut | None:
        """The upstream answered 401 to a static credential (rotated or revoked there): nothing ran. A call
        whose requirement parks is handed back (claim ``registered`` again, the connection in ``error`` so
        that its next use waits too) and parks like a revoked credential; None: it fails as before."""
        surface = next((b for b in brokered if str(b["binding_id"]) == str(claim.binding_id)), None)
        if surface is None or surface.get("when_unavailable") != "park" or not accepts_work(claim.run_status):
            return None
        await self.parks.credential_rejected(
            inp.run_id,
            inp.tool_call_id,
            inp.input_digest,
            str(claim.connection_id),
            claim.authority_generation,
        )
        return c.BrokerOut(state="parked", reason=REJECTED)

    @activity.defn(name=c.BROKER_CALL)
    async def broker_call(self, inp: c.BrokerIn) -> c.BrokerOut:
        # One read for every check; the claim CAS below is the only other statement before the call.
        claim = await self.connections.dispatch_view(inp.run_id, inp.tool_call_id, inp.input_digest)
        if claim is None:
            return c.BrokerOut(state="missing")
        binding = claim
        if binding.connection_status != "active":
            return await self._unavailable(inp, claim, f"the bound connection is {binding.connection_status}")
        if binding.live_generation != binding.authority_generation:
            return await self._unavailable(inp, claim, "the bound connection was reauthorized since this run started")
        if binding.live_owner_type != binding.connection_owner_type:
            return await self._refuse(inp, claim, "the bound connection changed owner since this run started")
        if binding.connection_owner_user_id is not None:
            if binding.live_owner_user_id != binding.connection_owner_user_id:
                return await self._refuse(inp, claim, "the bound connection changed owner since this run started")
            if not binding.owner_active:
                return await self._refuse(
                    inp, claim, "the owner of the bound personal connection is no longer an active member"
                )
        if binding.transport == "sandbox_cli":
            return await self._refuse(
                inp, claim, "a sandbox CLI tool runs inside the sandbox, never through the broker"
            )
        if self.sealer is None:
            return await self._refuse(inp, claim, "credential storage is disabled on this worker")
        if not accepts_work(claim.run_status):
            return await self._refuse(inp, claim, "session is not active")
        spec = await self.runs.run_spec(inp.run_id)
        oauth = binding.auth_kind == "oauth"
        try:
            # Read in the same statement as the checks, and only while the binding still holds.
            env = None if oauth or claim.credential_sealed is not None else (claim.credential_env or None)
            if env is not None:
                token = os.environ.get(env, "")
                if not token:
                    return await self._unavailable(inp, claim, f"Missing {env}")
            elif claim.credential_sealed is None:
                raise NotFound()
            elif oauth:
                token = await self._access_token(spec.tenant_id, binding)
            else:
                blob = bytes(claim.credential_sealed)
                token = self.sealer.open(blob, context=credential_context(spec.tenant_id)).decode()
        except (NotFound, SealingError):
            return await self._unavailable(inp, claim, "the bound connection's credential is no longer usable")
        except _NoAccess as err:
            if err.parks:
                return await self._unavailable(inp, claim, str(err))
            return await self._refuse(inp, claim, str(err))
        taken = await self.connections.take(inp.run_id, inp.tool_call_id, inp.input_digest)
        if taken is None:  # someone else holds it, or its outcome is final
            current = await self.connections.claim(inp.run_id, inp.tool_call_id, inp.input_digest)
            return c.BrokerOut(state=current.state if current else "missing")
        surface = next(b for b in spec.brokered if b["binding_id"] == str(claim.binding_id))
        split = split_mcp(claim.tool)
        assert split is not None
        tokens = [token]
        started = time.monotonic()
        transport = binding.transport or "mcp_http"
        tool_entry = next((t for t in surface.get("tools", []) if t["name"] == split[1]), {"name": split[1]})
        send = (transport, binding, tool_entry, claim.input, surface.get("protocol_version"))
        outcome = await self._call(token, *send)
        if oauth and outcome.auth_rejected:
            # The server refused the token before running anything: once more with a refreshed one.
            try:
                retry_token = await self._access_token(spec.tenant_id, binding, rejected=token)
            except _NoAccess as err:
                outcome = mcp_client.CallOutcome(outcome="failed_before_send", result=None, error=str(err))
            else:
                tokens.append(retry_token)
                outcome = await self._call(retry_token, *send)
        if outcome.auth_rejected and not oauth:
            parked = await self._credential_rejected(inp, claim, spec.brokered)
            if parked is not None:
                return parked
        latency_ms = int((time.monotonic() - started) * 1000)
        # An upstream that echoes the credential back must not carry it into the ledger or the sandbox.
        result, error = outcome.result, outcome.error
        for secret in tokens:
            result, error = _without(result, secret), _without(error, secret)
        error = error.replace("{id}", str(binding.connection_id)) if error else None
        data: dict[str, Any] = {
            "tool_call_id": inp.tool_call_id,
            "tool": claim.tool,
            "server": surface["slot"],
            "binding_id": str(claim.binding_id),
            "ok": outcome.outcome == "succeeded",
            "latency_ms": latency_ms,
            "outcome": outcome.outcome,
        }
        if result is not None:
            data["result_digest"] = document_digest(result)
        if error:
            data["error"] = error
        row = await self.connections.settle(
            inp.run_id,
            inp.tool_call_id,
            inp.input_digest,
            outcome.outcome,
            result,
            error,
            ev.NewEvent(type="tool.brokered", data=data),
        )
        return c.BrokerOut(state=row.state)

    async def _access_token(self, tenant_id: str, binding: DispatchView, *, rejected: str | None = None) -> str:
        """The OAuth connection's access token at the binding's generation, or :class:`_NoAccess` with the reason
        the call fails closed."""
        if self.tokens is None:
            raise _NoAccess("OAuth connections are not enabled on this worker")
        try:
            token = await self.tokens.get(
                tenant_id,
                str(binding.connection_id),
                binding.authority_generation,
                rejected=SecretStr(rejected) if rejected is not None else None,
            )
        except GrantLost as lost:
            raise _NoAccess(f"the bound connection is in error: {lost.reason} (reconnect it)", parks=True) from None
        except Conflict:
            raise _NoAccess("the bound connection was reauthorized since this run started", parks=True) from None
        except NotFound:
            raise _NoAccess("the bound connection is no longer active", parks=True) from None
        except OAuthClientError as err:
            raise _NoAccess(f"could not obtain an access token for the bound connection: {err}") from None
        return token.get_secret_value()

    async def _call(
        self,
        credential: str,
        transport: str,
        binding: DispatchView,
        tool: dict[str, Any],
        arguments: Any,
        protocol: str | None,
    ) -> mcp_client.CallOutcome:
        """One call through the connection's transport provider (admission, pinning and headers are its job)."""
        try:
            provider = self.transports.provider_for(transport)
        except UnknownTransport as err:
            return mcp_client.CallOutcome(outcome="failed_before_send", result=None, error=str(err))
        conn = TransportConnection(
            id=str(binding.connection_id),
            transport=transport,
            base_url=binding.base_url,
            config=dict(binding.transport_config or {}),
            credential=credential,
            header_name=binding.header_name,
            scheme=binding.scheme,
            auth_kind=binding.auth_kind,
            generation=binding.authority_generation,
            protocol_version=protocol,
        )
        return await provider.call_tool(conn, tool, arguments)

    def all(self) -> list[Callable[..., Any]]:
        return [self.broker_call]


class _NoAccess(Exception):
    """No usable access token for an OAuth binding; the message is the call's refusal reason. ``parks``: a
    person can fix it by connecting again (the call may wait for that instead of failing)."""

    def __init__(self, message: str, *, parks: bool = False) -> None:
        super().__init__(message)
        self.parks = parks


def _without(value: Any, secret: str) -> Any:
    """``value`` with every occurrence of ``secret`` replaced, at any depth of a JSON value."""
    if value is None or len(secret) < 4:
        return value
    if isinstance(value, str):
        return value.replace(secret, MARK)
    if isinstance(value, dict):
        return {k: _without(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [_without(v, secret) for v in value]
    return value
