"""Access tokens for active OAuth connections, for the broker (and the photograph refresh).

:meth:`AccessTokens.get` returns an access token for a connection at the generation the caller's binding froze:

- from this process's cache while it has more than ``margin`` (300 s) left;
- else under the connection's row lock (so API and worker processes refresh once per expiry between them, and
  never present one rotated refresh token twice, which a rotating server punishes by revoking the grant): the
  token another process stored meanwhile, or a refresh (``resource`` sent, a rotated refresh token stored);
- ``rejected=<token>`` after the server answered 401 with that token: refresh even if it looks valid (once; the
  caller retries its call one time).

The cache does not re-read the connection: callers check their binding first (the broker's binding check runs
immediately before it touches a credential), and revoking a connection should :meth:`AccessTokens.evict` it.

A refresh the server refuses with ``invalid_grant`` moves the connection to ``error`` with the provider's reason
and raises :class:`GrantLost`; every binding to it fails closed from then on. A connection re-authorized since the
caller's binding was frozen raises :class:`core.errors.Conflict`; one that is no longer active,
:class:`core.errors.NotFound`. Tokens never reach a log line or a message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import SecretStr

from core.errors import GrantLost
from db.connections import credential_context
from db.oauth import GrantLock, OAuthRecords, registration_secret_context
from integrations.oauth import REFRESH_MARGIN, AuthorizationServer, ClientIdentity, InvalidGrant, OAuthClient
from integrations.sealing import Sealer

__all__ = ["AccessTokens", "GrantLost", "access_context"]

log = logging.getLogger("fluidbox.services.oauth_tokens")


def access_context(tenant_id: str) -> str:
    """The sealing context of a connection's stored access token."""
    return f"{tenant_id}:integration_connections.access_token"


@dataclass(frozen=True)
class _Cached:
    token: SecretStr
    expires_at: datetime | None


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AccessTokens:
    def __init__(
        self,
        records: OAuthRecords,
        sealer: Sealer,
        client: OAuthClient,
        *,
        margin: timedelta = REFRESH_MARGIN,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.records = records
        self.sealer = sealer
        self.client = client
        self.margin = margin
        self.clock = clock
        self._cache: dict[tuple[str, int], _Cached] = {}

    def _fresh(self, expires_at: datetime | None) -> bool:
        return expires_at is None or expires_at - self.clock() > self.margin

    def evict(self, connection_id: str) -> None:
        """Forget every cached token of a connection (revoke, reconnect)."""
        for key in [k for k in self._cache if k[0] == connection_id]:
            del self._cache[key]

    async def get(
        self, tenant_id: str, connection_id: str, generation: int, *, rejected: SecretStr | None = None
    ) -> SecretStr:
        """An access token for the connection at ``generation``; see the module docstring."""
        key = (connection_id, generation)
        cached = self._cache.get(key)
        if cached is not None and self._fresh(cached.expires_at) and not _same(cached.token, rejected):
            return cached.token
        lost: str | None = None
        async with self.records.locked_grant(tenant_id, connection_id, generation) as grant:
            stored = self._stored_access(tenant_id, grant)
            if stored is not None and self._fresh(stored.expires_at) and not _same(stored.token, rejected):
                self._cache[key] = stored
                return stored.token
            try:
                token = await self._refresh(tenant_id, grant)
            except InvalidGrant as exc:
                await grant.fail(exc.reason)
                lost = exc.reason
            else:
                self._cache[key] = token
                return token.token
        # The error status is committed (the lock's transaction ended) before the caller hears of it.
        self.evict(connection_id)
        log.warning("oauth connection %s lost its grant: %s", connection_id, lost)
        raise GrantLost(lost or "invalid_grant")

    def _stored_access(self, tenant_id: str, grant: GrantLock) -> _Cached | None:
        blob = grant.row.access_token_sealed
        if blob is None:
            return None
        token = self.sealer.open(bytes(blob), context=access_context(tenant_id)).decode()
        return _Cached(SecretStr(token), grant.row.access_expires_at)

    async def _refresh(self, tenant_id: str, grant: GrantLock) -> _Cached:
        oauth = grant.row.oauth or {}
        registration = grant.registration
        assert grant.row.credential_sealed is not None  # locked_grant yields only a grant that has one
        refresh_token = self.sealer.open(bytes(grant.row.credential_sealed), context=credential_context(tenant_id))
        server = AuthorizationServer(
            issuer=oauth["issuer"],
            authorization_endpoint=oauth["authorization_endpoint"],
            token_endpoint=oauth["token_endpoint"],
            revocation_endpoint=oauth.get("revocation_endpoint"),
        )
        secret_blob = registration.client_secret_sealed
        secret = (
            SecretStr(
                self.sealer.open(
                    bytes(secret_blob), context=registration_secret_context(tenant_id, "client_secret")
                ).decode()
            )
            if secret_blob is not None
            else None
        )
        identity = ClientIdentity(
            issuer=registration.issuer,
            client_id=registration.client_id,
            client_secret=secret,
            token_endpoint_auth_method=registration.token_endpoint_auth_method,
            source=registration.source,
            redirect_uri=registration.redirect_uri,
        )
        tokens = await self.client.refresh(server, identity, SecretStr(refresh_token.decode()), oauth["resource"])
        access = tokens.access_token.get_secret_value()
        rotated = None
        if tokens.rotated and tokens.refresh_token is not None:
            blob = self.sealer.seal(tokens.refresh_token.get_secret_value(), context=credential_context(tenant_id))
            rotated = (blob, self.sealer.key_id)
        await grant.save(
            access=(self.sealer.seal(access, context=access_context(tenant_id)), self.sealer.key_id, tokens.expires_at),
            refresh=rotated,
        )
        return _Cached(tokens.access_token, tokens.expires_at)


def _same(token: SecretStr, rejected: SecretStr | None) -> bool:
    return rejected is not None and token.get_secret_value() == rejected.get_secret_value()
