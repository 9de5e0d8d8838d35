"""Which fields a new connection may combine: the shape rules of ``POST /v1/connections`` and of connecting a
catalog entry, written once.

A :class:`ConnectionDraft` is what a caller asks for. Each ``check_*`` here states the rules of one step and
raises the first one the draft breaks (400, or 422 where a transport's configuration cannot be used); the
service (:mod:`services.connections`, :mod:`services.catalog`) calls them in order, with the caller's rights and
the I/O between them, so a request breaking several rules is answered as it always was. A draft made from a
catalog entry (``entry``: its slug) is refused in the catalog's words (``'<slug>' …``).

Pure: no I/O. Which configuration a transport can run (a stdio command, an OpenAPI document, an auth block) is
its provider's to say (:mod:`integrations.transports`); the service asks it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from core.errors import BadRequest, Unprocessable

TRANSPORTS = ("mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli", "git")
DEVICE_OR_CLI = ("relay", "sandbox_cli")

PERSONAL_NEEDS_USER = "a personal connection belongs to a signed-in user; the operator token has none"
CLIENT_SECRET_ALONE = "`client_secret` needs the `client_id` it was issued with"
NO_SANDBOX_CREDENTIAL = (
    "a sandbox_cli connection carries no credential, so it takes no {field}: its tools run inside the sandbox, "
    "which never holds one (a CLI that needs a credential belongs behind a brokered transport)"
)

# RFC 6749 §3.3 scope-token: printable ASCII except space, double quote and backslash.
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


@dataclass(frozen=True)
class ConnectionDraft:
    """A connection as asked for, before anything is contacted or stored. ``transport`` and ``provider`` are as
    given (:func:`chosen_transport` settles them); ``entry`` is the catalog slug when a catalog entry is being
    connected (its transport configuration is then trusted: the entry was reviewed when it was added)."""

    provider: str | None = None
    transport: str | None = None
    transport_config: dict[str, Any] | None = None
    base_url: str | None = None
    display_name: str | None = None
    auth_kind: str = "static"
    token: SecretStr | None = None
    header_name: str | None = None
    scheme: str = "Bearer"
    owner: str = "organization"
    client_id: str | None = None
    client_secret: SecretStr | None = None
    scopes: list[str] | None = None
    access: Any = None
    tools: list[dict[str, Any]] | None = None
    credential_env: str | None = None
    entry: str | None = None

    @property
    def personal(self) -> bool:
        return self.owner == "personal"

    @property
    def oauth(self) -> bool:
        return self.auth_kind == "oauth"

    @property
    def has_token(self) -> bool:
        """A token was given and is not empty."""
        return self.token is not None and bool(self.token.get_secret_value())

    @property
    def oauth_settings(self) -> bool:
        """A client id, a client secret or scopes: what only an OAuth connection takes."""
        return self.client_id is not None or self.client_secret is not None or bool(self.scopes)

    def said(self, direct: str, listed: str) -> str:
        """``direct`` for ``POST /v1/connections``; ``listed`` (the catalog's words) for a catalog entry."""
        return direct if self.entry is None else listed


def chosen_transport(draft: ConnectionDraft) -> str:
    """The transport the draft names (``transport``, else ``provider``, else ``mcp_http``)."""
    transport = draft.transport or draft.provider or "mcp_http"
    if draft.transport is not None and draft.provider not in (None, draft.transport, "mcp_http"):
        raise BadRequest(f"`provider` '{draft.provider}' and `transport` '{draft.transport}' disagree")
    if transport not in TRANSPORTS:
        raise BadRequest(f"unsupported provider '{transport}' (supported: {', '.join(TRANSPORTS)})")
    return transport


def check_git(draft: ConnectionDraft) -> None:
    """A ``git`` connection is a credential for cloning, nothing else: a token under an https prefix."""
    if draft.auth_kind != "static" or draft.oauth_settings:
        raise BadRequest("a git connection takes no OAuth settings")
    if draft.access is not None or draft.tools is not None or draft.transport_config:
        raise BadRequest("a git connection has no tools: it takes no `access`, `tools` or `transport_config`")
    if draft.header_name is not None or draft.credential_env is not None:
        raise BadRequest("a git connection takes a `token` (and `scheme`), no `header_name` or `credential_env`")
    if draft.base_url is None:
        raise BadRequest("a git connection needs a `base_url`: the https:// prefix of the repositories it clones")
    if not draft.has_token:
        raise BadRequest("a git connection needs a `token` (`user:token` with scheme Basic, or a Bearer token)")


def check_device_or_cli(draft: ConnectionDraft, transport: str) -> None:
    """A relay: a sealed token, no header or scheme of its own, no declared tools. A sandbox CLI: declared tools
    and no credential at all (its tools run inside the sandbox), always an organization connection."""
    if draft.auth_kind != "static" or draft.oauth_settings:
        raise BadRequest(
            draft.said(
                f"a {transport} connection takes no OAuth settings",
                f"'{draft.entry}' ({transport}) takes no OAuth settings",
            )
        )
    if draft.header_name is not None or draft.scheme != "Bearer":
        raise BadRequest(f"a {transport} connection sends no custom header or scheme")
    if not draft.base_url:
        raise BadRequest(
            draft.said(f"a {transport} connection needs a `base_url`", f"'{draft.entry}' has no URL to connect to")
        )
    if transport == "sandbox_cli":
        if draft.token is not None or draft.credential_env is not None:
            field = "`token`" if draft.token is not None else "`credential_env`"
            raise BadRequest(
                draft.said(
                    NO_SANDBOX_CREDENTIAL.format(field=field),
                    f"'{draft.entry}' is a sandbox CLI: it takes no `token` (its tools run inside the sandbox, which "
                    "never holds a credential)",
                )
            )
        if draft.transport_config:
            raise BadRequest("a sandbox_cli connection declares its `tools`; it has no `transport_config`")
        if draft.personal:
            raise BadRequest("a sandbox_cli connection is an organization connection")
        return
    if draft.tools is not None:
        raise BadRequest("a relay connection photographs its tools; it takes no `tools`")
    if draft.credential_env is not None:
        raise BadRequest("a relay connection's credential is its `token` (sealed); it takes no `credential_env`")
    if not draft.has_token:
        raise BadRequest(
            draft.said(
                "a relay connection needs the relay's `token`",
                f"'{draft.entry}' is a relay: it needs the relay's credential as `token`",
            )
        )


def check_brokered(draft: ConnectionDraft) -> None:
    """An MCP, OpenAPI, HTTP or stdio connection photographs its tools: it declares none."""
    if draft.tools is not None:
        raise BadRequest("`tools` apply to sandbox_cli connections only")


def check_mcp_http(draft: ConnectionDraft) -> None:
    """An MCP server over HTTP is its URL; it has no transport configuration."""
    if draft.transport_config is not None:
        raise BadRequest("`transport_config` applies to openapi, http, stdio and relay connections only")
    if draft.base_url is None:
        raise BadRequest("an mcp_http connection needs a `base_url`")


def check_oauth_client(draft: ConnectionDraft) -> None:
    """An OAuth connection's credential is obtained by signing in; a client id it is given is its own."""
    if draft.token is not None:
        raise BadRequest(
            draft.said(
                "an oauth connection takes no `token`: it is obtained by signing in",
                f"'{draft.entry}' connects with OAuth: it takes no `token`",
            )
        )
    if draft.client_secret is not None and draft.client_id is None:
        raise BadRequest(CLIENT_SECRET_ALONE)
    if draft.entry is None and draft.scopes is not None and not all(_SCOPE.fullmatch(s) for s in draft.scopes):
        raise BadRequest("`scopes` must be non-empty OAuth scope tokens (no spaces or quotes)")


def check_bearer_only(draft: ConnectionDraft) -> None:
    """An OAuth MCP connection sends its access token as ``Authorization: Bearer``."""
    if draft.header_name is not None or draft.scheme != "Bearer":
        raise BadRequest("an oauth connection sends `Authorization: Bearer`; `header_name` and `scheme` do not apply")


def check_no_oauth_client(draft: ConnectionDraft) -> None:
    if draft.oauth_settings:
        raise BadRequest("`client_id`, `client_secret` and `scopes` apply to oauth connections only")


def check_static_credential(draft: ConnectionDraft) -> None:
    """A static MCP connection's credential: a ``token`` or the environment variable ``credential_env``."""
    if draft.credential_env is not None:
        if draft.token is not None:
            raise BadRequest("give either `token` or `credential_env`, not both")
    elif not draft.has_token:
        raise BadRequest(
            draft.said("a static connection needs a `token` (or `credential_env`)", f"'{draft.entry}' needs a `token`")
        )


def check_described(draft: ConnectionDraft, transport: str, config: dict[str, Any]) -> str | None:
    """An ``openapi``, ``http`` or ``stdio`` connection once its configuration is admissible: returns its
    ``base_url`` (a stdio one's is ``stdio://<name>``, named after it or its command when not given); None for
    an openapi one without one (it is read from the document)."""
    if draft.oauth and transport == "stdio":
        raise BadRequest("a stdio connection takes its credential through `credential_env`, not OAuth")
    if not draft.oauth:
        check_no_oauth_client(draft)
    base_url = draft.base_url
    if transport == "stdio":
        name = re.sub(r"[^a-z0-9-]+", "-", (draft.display_name or str(config.get("command", ""))).lower()).strip("-")
        base_url = base_url or f"stdio://{name or 'server'}"
        if not base_url.startswith("stdio://"):
            raise Unprocessable("a stdio connection's `base_url` (its name for requirements) must start with stdio://")
    elif transport == "http":
        if not isinstance(config.get("endpoints"), list):
            raise Unprocessable("an http connection needs `endpoints` (method, path, arguments, access)")
        if base_url is None:
            raise BadRequest(f"an {transport} connection needs a `base_url`")
    return base_url


def auth_type(config: dict[str, Any]) -> str:
    """How a described connection presents its credential (its configuration's ``auth.type``; bearer unset)."""
    auth = config.get("auth") or {}
    return str(auth.get("type", "bearer"))


def needs_token(transport: str, config: dict[str, Any]) -> bool:
    """Whether a static described connection must be given a token: a stdio server takes its credential from
    its environment, and ``auth: {type: none}`` sends none."""
    return transport != "stdio" and auth_type(config) != "none"


def credential_scheme(config: dict[str, Any], scheme: str) -> str:
    """The scheme a described connection's credential is sent with: Basic for ``auth: {type: basic}``."""
    return "Basic" if auth_type(config) == "basic" else scheme


def check_described_credential(draft: ConnectionDraft, transport: str, config: dict[str, Any]) -> None:
    """A described connection's credential: signed in for (``auth`` then is {type: oauth}), or a token where
    its auth sends one."""
    if draft.oauth:
        check_oauth_client(draft)
        if config.get("auth", {"type": "oauth"}).get("type") != "oauth":
            raise Unprocessable("an oauth connection's `auth` must be {type: oauth} (or left out)")
    elif not draft.has_token and needs_token(transport, config):
        raise BadRequest(
            draft.said(
                f"this connection's auth ({auth_type(config)}) needs a `token`", f"'{draft.entry}' needs a `token`"
            )
        )


__all__ = [
    "CLIENT_SECRET_ALONE",
    "DEVICE_OR_CLI",
    "NO_SANDBOX_CREDENTIAL",
    "PERSONAL_NEEDS_USER",
    "TRANSPORTS",
    "ConnectionDraft",
    "auth_type",
    "check_bearer_only",
    "check_brokered",
    "check_described",
    "check_described_credential",
    "check_device_or_cli",
    "check_git",
    "check_mcp_http",
    "check_no_oauth_client",
    "check_oauth_client",
    "check_static_credential",
    "chosen_transport",
    "credential_scheme",
    "needs_token",
]
