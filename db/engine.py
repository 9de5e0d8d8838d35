"""Connections: an asyncpg pool for the hot path, alembic (over SQLAlchemy+asyncpg) for migrations."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent


def sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError("FLUIDBOX_DATABASE_URL must be a postgresql:// URL")


def asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _init_connection(conn: asyncpg.Connection[Any]) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class _NoResetConnection(asyncpg.Connection):  # type: ignore[misc]
    """Pooled connections hold no session state (no LISTEN, advisory locks, cursors or SET), so the
    reset query asyncpg runs on every release is a wasted round trip on the gate's hot path."""

    def get_reset_query(self) -> str:
        return ""


async def create_pool(url: str, *, min_size: int = 2, max_size: int = 20) -> asyncpg.Pool[Any]:
    pool = await asyncpg.create_pool(
        asyncpg_dsn(url),
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        command_timeout=60,
        connection_class=_NoResetConnection,
    )
    assert pool is not None
    return pool


def _upgrade(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "db" / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, "head")


async def migrate(url: str) -> None:
    """Apply every migration (alembic's env runs its own event loop, so it gets a thread)."""
    await asyncio.to_thread(_upgrade, url)


async def ensure_database(admin_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``admin_url`` unless it exists; returns its URL."""
    conn = await asyncpg.connect(admin_url)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, query = admin_url.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")
