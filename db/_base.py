"""What every repository under ``db/`` shares: the connection type, the row type and record conversion."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import asyncpg

Conn = Any  # asyncpg.Connection or a pool proxy (asyncpg types are not generic at runtime)
Row = dict[str, Any]


def as_row(record: asyncpg.Record | None) -> Row | None:
    """A record as a dict, UUIDs as strings (``None`` stays ``None``)."""
    if record is None:
        return None
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in record.items()}


def as_rows(records: Iterable[asyncpg.Record]) -> list[Row]:
    return [r for rec in records if (r := as_row(rec)) is not None]


__all__ = ["Conn", "Row", "as_row", "as_rows"]
