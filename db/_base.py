"""What every repository under ``db/`` shares: the connection type, the row types and record conversion.

A repository returns typed rows: the ``table=True`` model of ``db.models`` when a query reads one
table's columns, a small pydantic read model (beside its repository) when it joins or aggregates.
``Row`` dicts remain only for the parks repository's ``run_parks`` rows and where plain data is passed in
(a run's artifacts, a managed app's form fields); ``core`` reads a row through a protocol of its own
(``core.bindings.Candidate``), never a ``db`` type.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import asyncpg
from pydantic import BaseModel, ConfigDict

from core.errors import NotFound

Conn = Any  # asyncpg.Connection or a pool proxy (asyncpg types are not generic at runtime)
# What every repository is built over, named here for the layers above (only db imports the driver). The
# stubs make asyncpg.Pool generic; at runtime it is not, so the subscripted form exists for type checkers only.
if TYPE_CHECKING:
    Pool: TypeAlias = asyncpg.Pool[Any]
else:
    Pool = asyncpg.Pool
Row = dict[str, Any]
M = TypeVar("M", bound=BaseModel)


def uuid_or_none(value: str) -> uuid.UUID | None:
    """``value`` as a UUID, or None when it is not one (an id nobody issued finds nothing)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def known_id(value: str, message: str = "not found") -> uuid.UUID:
    """``value`` as a UUID; :class:`NotFound` (``message``) when it is not one."""
    found = uuid_or_none(value)
    if found is None:
        raise NotFound(message)
    return found


class ReadModel(BaseModel):
    """A typed row a query builds from several tables (read only: nothing writes it back)."""

    model_config = ConfigDict(frozen=True)


def as_row(record: asyncpg.Record | None) -> Row | None:
    """A record as a dict, UUIDs as strings (``None`` stays ``None``)."""
    if record is None:
        return None
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in record.items()}


def as_rows(records: Iterable[asyncpg.Record]) -> list[Row]:
    return [r for rec in records if (r := as_row(rec)) is not None]


def as_model(model: type[M], record: asyncpg.Record | None) -> M | None:
    """A record as ``model`` (validated: a column the model does not expect is ignored)."""
    return None if record is None else model.model_validate(dict(record.items()))


def as_models(model: type[M], records: Iterable[asyncpg.Record]) -> list[M]:
    return [model.model_validate(dict(record.items())) for record in records]


async def fetch_model(conn: Conn, model: type[M], sql: str, *args: Any) -> M | None:
    """One row of ``sql`` on ``conn`` (inside the caller's transaction) as ``model``, or ``None``."""
    return as_model(model, await conn.fetchrow(sql, *args))


async def fetch_models(conn: Conn, model: type[M], sql: str, *args: Any) -> list[M]:
    """Every row of ``sql`` on ``conn`` as ``model``."""
    return as_models(model, await conn.fetch(sql, *args))


class Repository:
    """A repository over the pool: acquire, fetch and convert in one call for single-statement reads."""

    def __init__(self, pool: asyncpg.Pool[Any]) -> None:
        self.pool = pool

    async def one(self, model: type[M], sql: str, *args: Any) -> M | None:
        async with self.pool.acquire() as conn:
            return as_model(model, await conn.fetchrow(sql, *args))

    async def many(self, model: type[M], sql: str, *args: Any) -> list[M]:
        async with self.pool.acquire() as conn:
            return as_models(model, await conn.fetch(sql, *args))

    async def one_row(self, sql: str, *args: Any) -> Row | None:
        async with self.pool.acquire() as conn:
            return as_row(await conn.fetchrow(sql, *args))

    async def rows(self, sql: str, *args: Any) -> list[Row]:
        async with self.pool.acquire() as conn:
            return as_rows(await conn.fetch(sql, *args))

    async def execute(self, sql: str, *args: Any) -> str:
        async with self.pool.acquire() as conn:
            return str(await conn.execute(sql, *args))


__all__ = [
    "Conn",
    "Pool",
    "ReadModel",
    "Repository",
    "Row",
    "as_model",
    "as_models",
    "as_row",
    "as_rows",
    "fetch_model",
    "fetch_models",
    "known_id",
    "uuid_or_none",
]
