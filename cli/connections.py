"""``fluidbox connections …``: connect servers over every transport (MCP over HTTP, OpenAPI, HTTP, stdio MCP).

The credential is read from an environment variable (``--token-env``), never from the command line, so it does
not land in shell history or the process list.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
import yaml

from cli.client import Api, CliError

app = typer.Typer(no_args_is_help=True, help="Connections: create (any transport), list, show, tools, refresh, revoke.")


def _out(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def _config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise CliError(f"cannot read {path}: {err}") from None
    if not isinstance(doc, dict):
        raise CliError(f"{path} must hold an object (the transport configuration)")
    return doc


@app.command("list")
def connections_list() -> None:
    """Every visible connection: id, transport, status, base URL, name."""
    for c in Api().get("/v1/connections")["connections"]:
        typer.echo(f"{c['id']}  {c.get('transport', 'mcp_http')}  {c['status']}  {c['base_url']}  {c['display_name']}")


@app.command("show")
def connections_show(connection: str) -> None:
    """One connection (never its credential)."""
    _out(Api().get(f"/v1/connections/{connection}"))


@app.command("tools")
def connections_tools(connection: str) -> None:
    """The latest tool snapshot: names, descriptions and access classes."""
    _out(Api().get(f"/v1/connections/{connection}/tools"))


@app.command("refresh")
def connections_refresh(connection: str) -> None:
    """Photograph the tools again (new runs get the new snapshot)."""
    _out(Api().post(f"/v1/connections/{connection}/tools/refresh"))


@app.command("revoke")
def connections_revoke(connection: str) -> None:
    """Destroy the sealed credential; runs in flight fail closed on their next call."""
    _out(Api().post(f"/v1/connections/{connection}/revoke"))


@app.command("create")
def connections_create(
    transport: str = typer.Option("mcp_http", help="mcp_http | openapi | http | stdio"),
    base_url: str | None = typer.Option(None, help="Server / API base URL (stdio: stdio://NAME, optional)."),
    name: str | None = typer.Option(None, "--name", help="Display name."),
    token_env: str | None = typer.Option(None, help="Environment variable holding the credential."),
    config: Path | None = typer.Option(None, help="JSON/YAML file with the transport configuration."),
    document_url: str | None = typer.Option(None, help="openapi: the document's URL."),
    document: Path | None = typer.Option(None, help="openapi: upload this JSON/YAML document."),
    auth: str | None = typer.Option(None, help="openapi/http auth: bearer | basic | none | header:NAME | query:NAME"),
    command: str | None = typer.Option(None, help="stdio: the executable (admins only)."),
    arg: list[str] = typer.Option([], "--arg", help="stdio: one argument (repeat; each stays one argument)."),
    header_name: str | None = typer.Option(None, help="mcp_http: send the token in this header."),
    oauth: bool = typer.Option(False, "--oauth", help="Sign in with OAuth (mcp_http, openapi, http): prints `next`."),
) -> None:
    """Create a connection; its tools are photographed at once (nothing is stored if that fails)."""
    cfg = _config(config)
    if document_url:
        cfg["document_url"] = document_url
    if document is not None:
        cfg["document"] = document.read_text()
    if auth:
        kind, _, where = auth.partition(":")
        if kind in ("header", "query"):
            cfg["auth"] = {"type": "api_key", "in": kind, "name": where}
        else:
            cfg["auth"] = {"type": kind}
    if command:
        cfg["command"] = command
    if arg:
        cfg["args"] = list(arg)
    body: dict[str, Any] = {"transport": transport}
    if transport != "mcp_http" or cfg:
        body["transport_config"] = cfg
    if base_url:
        body["base_url"] = base_url
    if name:
        body["display_name"] = name
    if header_name:
        body["header_name"] = header_name
    if oauth:
        body["auth_kind"] = "oauth"
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise CliError(f"environment variable {token_env} is empty or unset")
        body["token"] = token
    _out(Api().post("/v1/connections", body))


def register(root: typer.Typer) -> None:
    """Attach ``connections`` to the root command."""
    root.add_typer(app, name="connections")
