"""``fluidbox users``: add users and mint their personal access tokens, on this machine.

This is a LOCAL admin command, the one exception to "the CLI talks to the HTTP API only": it writes
to the stack's PostgreSQL directly. There is no SSO/browser login yet, and the spec forbids the
operator token from minting PATs (a PAT belongs to a membership, minted from that member's browser
session), so the HTTP API cannot do it. Whoever can run this already owns the database. The
database is ``FLUIDBOX_DATABASE_URL`` when set, else the embedded PostgreSQL of ``fluidbox up``
found through ``$FLUIDBOX_HOME/pg/postmaster.pid`` (the stack must be running).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import typer

from cli.client import CliError, home

users = typer.Typer(no_args_is_help=True, help="Add users and mint personal access tokens (local admin).")

DATABASE_NAME = "fluidbox"  # cli.stack.Stack.database_name


def database_url() -> str:
    """The stack's database: FLUIDBOX_DATABASE_URL, or the running embedded PostgreSQL."""
    if url := os.environ.get("FLUIDBOX_DATABASE_URL"):
        return url
    pidfile = home().resolve() / "pg" / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
        if not socket_dir or not Path(f"/proc/{pid}").exists():
            raise ValueError("not running")
    except (OSError, ValueError, IndexError):
        raise CliError(
            f"no running fluidbox database under {pidfile.parent} — start the stack (`fluidbox up`) "
            "or set FLUIDBOX_DATABASE_URL"
        ) from None
    return f"postgresql://postgres@/{DATABASE_NAME}?host={socket_dir}&port={port}"


async def _with_identity(org: str, work: Any) -> Any:
    from db.engine import create_pool
    from db.errors import DatabaseError, SchemaNotReady
    from db.identity import Identity

    url = database_url()
    try:
        pool = await create_pool(url, min_size=1, max_size=1)
    except (OSError, DatabaseError) as exc:
        raise CliError(f"cannot connect to the fluidbox database: {exc}") from None
    try:
        identity = Identity(pool)
        try:
            tenant = await identity.org(org)
        except SchemaNotReady:
            raise CliError("the database is not migrated for users yet — start the stack once to migrate it") from None
        if tenant is None:
            raise CliError(f"unknown org '{org}' (the boot org is 'default'; start the stack once to create it)")
        return await work(identity, str(tenant.id))
    finally:
        await pool.close()


def _run(org: str, work: Any) -> Any:
    from core.errors import DomainError

    try:
        return asyncio.run(_with_identity(org, work))
    except DomainError as exc:
        raise CliError(exc.message) from None


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


@users.command("add")
def add(
    email: str = typer.Option(..., "--email", help="The user's email (unique in the org)."),
    name: str = typer.Option(..., "--name", help="Display name."),
    role: list[str] = typer.Option(["member"], "--role", help="member, approver, admin or owner; repeatable."),
    org: str = typer.Option("default", "--org", help="Org slug."),
) -> None:
    """Create a user and their active membership in the org."""

    async def work(identity: Any, tenant_id: str) -> Any:
        member = await identity.add_user(tenant_id, email, name, role, actor=("system", "cli:users add"))
        return member.model_dump()

    typer.echo(_json({"member": _run(org, work)}))


@users.command("token")
def token(
    email: str = typer.Argument(..., help="The member's email."),
    name: str = typer.Option(..., "--name", help="What the token is for (1-100 characters)."),
    expires_in: int | None = typer.Option(
        None, "--expires-in", help="Lifetime in seconds (default 90 days; clamped to 60 s … 365 days)."
    ),
    org: str = typer.Option("default", "--org", help="Org slug."),
    read_only: bool = typer.Option(False, "--read-only", help="The token may only read (GET/HEAD)."),
) -> None:
    """Mint a personal access token for an active member. The token is printed once, never again."""

    async def work(identity: Any, tenant_id: str) -> Any:
        member = await identity.member_by_email(tenant_id, email)
        if member is None:
            raise CliError(f"no user with email '{email}' in org '{org}' (add one with `fluidbox users add`)")
        secret, row = await identity.mint_pat(
            tenant_id, str(member.id), name, expires_in, actor=("system", "cli:users token"), read_only=read_only
        )
        return {"token": secret, "pat": row.model_dump()}

    typer.echo(_json(_run(org, work)))
    typer.echo("store the token now: it is shown once and cannot be read back", err=True)


@users.command("revoke-token")
def revoke_token(
    token_id: str = typer.Argument(..., help="The token's id (from `fluidbox users token`, or GET /v1/auth/tokens)."),
    org: str = typer.Option("default", "--org", help="Org slug."),
) -> None:
    """Revoke one personal access token; it answers 401 from the next request on."""

    async def work(identity: Any, tenant_id: str) -> Any:
        pat = await identity.revoke_pat(tenant_id, token_id, actor=("system", "cli:users revoke-token"))
        return pat.model_dump()

    typer.echo(_json({"revoked": True, "pat": _run(org, work)}))


@users.command("list")
def list_users(org: str = typer.Option("default", "--org", help="Org slug.")) -> None:
    """Members of the org with their roles and status."""

    async def work(identity: Any, tenant_id: str) -> Any:
        return await identity.members(tenant_id)

    for row in _run(org, work):
        typer.echo(f"{row.id}  {row.email:<32} {','.join(row.roles):<28} {row.status}")
