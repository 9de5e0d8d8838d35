"""Alembic environment: async engine over asyncpg.

The existing revisions are plain SQL (see docs/decisions.md) and stay as they are. New ones start
from ``alembic revision --autogenerate``, which compares the database with the SQLModel models
(``db.models``) using the options in ``db.autogen``; ``alembic check`` reports any drift. From the
command line the database is ``FLUIDBOX_DATABASE_URL`` (``db.engine.migrate`` passes its own URL).
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from db.autogen import COMPARE_OPTIONS, TARGET_METADATA
from db.engine import sqlalchemy_url


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=TARGET_METADATA, **COMPARE_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


async def _main() -> None:
    url = context.config.get_main_option("sqlalchemy.url") or os.environ.get("FLUIDBOX_DATABASE_URL", "")
    engine = create_async_engine(sqlalchemy_url(url))
    async with engine.connect() as conn:
        await conn.run_sync(_run)
        await conn.commit()
    await engine.dispose()


asyncio.run(_main())
