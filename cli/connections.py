"""``fluidbox connections …``: connect servers over every transport (MCP over HTTP, OpenAPI, HTTP endpoints, stdio
MCP, a device relay, a sandbox CLI), and list, show, re-photograph and revoke them.

A connection is created from flags, from a request body in a JSON/YAML file (``--file``, the body of
``POST /v1/connections``), or both (flags win). The credential is read from an environment variable
(``--token-env``), never from the command line or a file, so it does not land in shell history, the process list
or a file next to the body.

Bad input — an unknown transport, a flag the transport does not take, an unreadable file, or a request the API
refuses as malformed (400, 404, 422) — is one line on stderr and exit status 2; other failures exit 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
import yaml

from cli.client import Api, CliError

app = typer.Typer(
    no_args_is_help=True,
    help="Connections: create (any transport, relay and sandbox_cli included), list, show, tools, refresh, revoke.",
)

TRANSPORTS = ("mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli", "git")
BAD_INPUT = frozenset({400, 404, 422})
# Which transports take each transport-specific flag (checked before anything is sent).
FLAG_TRANSPORTS: dict[str, tuple[str, ...]] = {
    "--document-url": ("openapi",),
    "--document": ("openapi",),
    "--auth": ("openapi", "http"),
    "--command": ("stdio",),
    "--arg": ("stdio",),
    "--header-name": ("mcp_http",),
    "--oauth": ("mcp_http", "openapi", "http"),
    "--ca-pem": ("relay",),
    "--timeout": ("relay",),
    "--tools": ("sandbox_cli",),
    "--scheme": ("git",),
    "--config": ("openapi", "http", "stdio", "relay"),
}


def bad(message: str) -> CliError:
    """Bad input: one line, exit status 2."""
    return CliError(message, code=2)


def _call(method: str, path: str, body: Any = None) -> Any:
    """One API request; a refusal of the input itself (400, 404, 422) exits 2."""
    try:
        return Api().request(method, path, body if body is not None or method == "GET" else {})
    except CliError as err:
        if err.status in BAD_INPUT:
            raise bad(str(err)) from None
        raise


def _out(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def _load(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise bad(f"cannot read {what} {path}: {reason}") from None


def _object(path: Path | None, what: str) -> dict[str, Any]:
    if path is None:
        return {}
    doc = _load(path, what)
    if not isinstance(doc, dict):
        raise bad(f"{path} must hold an object ({what})")
    return doc


def _access(text: str | None) -> Any:
    if text is None:
        return None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise bad("--access is not JSON/YAML (e.g. '{\"read\": true}')") from None
    if not isinstance(doc, dict):
        raise bad('--access must be an object, e.g. \'{"read": true}\' or \'{"read": {"tools": ["get_*"]}}\'')
    return doc


@app.command("list")
def connections_list() -> None:
    """Every visible connection: id, transport, status, base URL, name."""
    for c in _call("GET", "/v1/connections")["connections"]:
        typer.echo(f"{c['id']}  {c.get('transport', 'mcp_http')}  {c['status']}  {c['base_url']}  {c['display_name']}")


@app.command("show")
def connections_show(connection: str) -> None:
    """One connection (never its credential)."""
    _out(_call("GET", f"/v1/connections/{connection}"))


@app.command("tools")
def connections_tools(connection: str) -> None:
    """The latest tool snapshot: names, descriptions and access classes."""
    _out(_call("GET", f"/v1/connections/{connection}/tools"))


@app.command("refresh")
def connections_refresh(connection: str) -> None:
    """Photograph the tools again (new runs get the new snapshot)."""
    _out(_call("POST", f"/v1/connections/{connection}/tools/refresh"))


@app.command("revoke")
def connections_revoke(connection: str) -> None:
    """Destroy the sealed credential; runs in flight fail closed on their next call."""
    _out(_call("POST", f"/v1/connections/{connection}/revoke"))


@app.command("create")
def connections_create(
    transport: str | None = typer.Option(
        None, help="mcp_http (default) | openapi | http | stdio | relay | sandbox_cli | git"
    ),
    file: Path | None = typer.Option(None, "--file", help="JSON/YAML file with the request body (flags win)."),
    base_url: str | None = typer.Option(
        None, help="Server / API / relay URL (stdio: stdio://NAME, optional; sandbox_cli: sandbox-cli://NAME)."
    ),
    name: str | None = typer.Option(None, "--name", help="Display name."),
    token_env: str | None = typer.Option(None, help="Environment variable holding the credential."),
    access: str | None = typer.Option(None, help="Access declaration as JSON/YAML, e.g. '{\"read\": true}'."),
    config: Path | None = typer.Option(None, help="JSON/YAML file with the transport configuration."),
    document_url: str | None = typer.Option(None, help="openapi: the document's URL."),
    document: Path | None = typer.Option(None, help="openapi: upload this JSON/YAML document."),
    auth: str | None = typer.Option(None, help="openapi/http auth: bearer | basic | none | header:NAME | query:NAME"),
    command: str | None = typer.Option(None, help="stdio: the executable (admins only)."),
    arg: list[str] = typer.Option([], "--arg", help="stdio: one argument (repeat; each stays one argument)."),
    header_name: str | None = typer.Option(None, help="mcp_http: send the token in this header."),
    oauth: bool = typer.Option(False, "--oauth", help="Sign in with OAuth (mcp_http, openapi, http): prints `next`."),
    ca_pem: Path | None = typer.Option(None, help="relay: PEM file of the CA that issued the relay's certificate."),
    timeout: str | None = typer.Option(None, help="relay: seconds every exchange may take (default 30, max 120)."),
    tools: Path | None = typer.Option(None, help="sandbox_cli: JSON/YAML file with the tool declarations (a list)."),
    scheme: str | None = typer.Option(None, help="git: how the token is sent, Basic (default) or Bearer."),
) -> None:
    """Create a connection; its tools are photographed at once (nothing is stored if that fails)."""
    body = _object(file, "the request body")
    if "token" in body:
        raise bad(f"{file} holds a `token`: keep credentials out of files, pass --token-env VAR instead")
    chosen = transport or body.get("transport") or body.get("provider") or "mcp_http"
    if chosen not in TRANSPORTS:
        raise bad(f"unknown transport '{chosen}' (one of: {', '.join(TRANSPORTS)})")
    given = {
        "--document-url": document_url, "--document": document, "--auth": auth, "--command": command,
        "--arg": arg or None, "--header-name": header_name, "--oauth": oauth or None, "--ca-pem": ca_pem,
        "--timeout": timeout, "--tools": tools, "--config": config, "--scheme": scheme,
    }  # fmt: skip
    for flag, value in given.items():
        if value is not None and chosen not in FLAG_TRANSPORTS[flag]:
            takers = ", ".join(FLAG_TRANSPORTS[flag])
            raise bad(f"{flag} does not apply to a {chosen} connection (it applies to {takers})")
    cfg = {**dict(body.get("transport_config") or {}), **_object(config, "the transport configuration")}
    if document_url:
        cfg["document_url"] = document_url
    if document is not None:
        try:
            cfg["document"] = document.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise bad(f"cannot read --document {document}: {err}") from None
    if auth:
        kind, _, where = auth.partition(":")
        if kind in ("header", "query") and where:
            cfg["auth"] = {"type": "api_key", "in": kind, "name": where}
        elif kind in ("bearer", "basic", "none") and not where:
            cfg["auth"] = {"type": kind}
        else:
            raise bad(f"--auth '{auth}' is not bearer, basic, none, header:NAME or query:NAME")
    if command:
        cfg["command"] = command
    if arg:
        cfg["args"] = list(arg)
    if ca_pem is not None:
        try:
            cfg["ca_pem"] = ca_pem.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise bad(f"cannot read --ca-pem {ca_pem}: {err}") from None
    if timeout is not None:
        try:
            cfg["timeout_s"] = float(timeout)
        except ValueError:
            raise bad(f"--timeout must be a number of seconds, not {timeout!r}") from None
    body["transport"] = chosen
    body.pop("provider", None)
    if cfg or chosen in ("openapi", "http", "stdio"):
        body["transport_config"] = cfg
    if tools is not None:
        declared = _load(tools, "the tool declarations")
        if not isinstance(declared, list):
            raise bad(f"{tools} must hold a list of tool declarations ({{name, command, args, input_schema}})")
        body["tools"] = declared
    if scheme:
        body["scheme"] = scheme
    if base_url:
        body["base_url"] = base_url
    if name:
        body["display_name"] = name
    if header_name:
        body["header_name"] = header_name
    if oauth:
        body["auth_kind"] = "oauth"
    if (declared_access := _access(access)) is not None:
        body["access"] = declared_access
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise bad(f"environment variable {token_env} is empty or unset")
        body["token"] = token
    _out(_call("POST", "/v1/connections", body))


def register(root: typer.Typer) -> None:
    """Attach ``connections`` to the root command."""
    root.add_typer(app, name="connections")
