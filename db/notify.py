"""Listening for the ledger's NOTIFY on one dedicated connection that reconnects by itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from db.engine import asyncpg_dsn
from db.ledger import NOTIFY_CHANNEL

log = logging.getLogger("fluidbox.hub")


async def listen(database_url: str, on_payload: Callable[[str], None]) -> None:
    """Call ``on_payload`` for every ledger notification until cancelled. A lost connection (the
    database restarted) is opened again after 1 s; meanwhile listeners fall back to polling."""
    dsn = asyncpg_dsn(database_url)

    def notified(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        on_payload(payload)

    while True:
        try:
            conn = await asyncpg.connect(dsn)
            closed = asyncio.Event()
            conn.add_termination_listener(lambda _c, ev=closed: ev.set())
            try:
                await conn.add_listener(NOTIFY_CHANNEL, notified)
                await closed.wait()
            finally:
                with contextlib.suppress(Exception):
                    await conn.close()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database restarted: streams fall back to polling meanwhile
            log.warning("LISTEN connection lost (%s); reconnecting", exc)
            await asyncio.sleep(1)
