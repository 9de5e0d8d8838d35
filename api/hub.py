"""Ledger wake-ups: one LISTEN connection per API process, fanned out in memory.

A NOTIFY only wakes a stream; every stream always reads from the ``seq > last`` catch-up query, so a
missed notification costs latency (the 2 s re-poll), never an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

import asyncpg

from db.engine import asyncpg_dsn
from db.store import NOTIFY_CHANNEL

log = logging.getLogger("fluidbox.hub")


class EventHub:
    def __init__(self, database_url: str) -> None:
        self._dsn = asyncpg_dsn(database_url)
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        session_id = payload.partition(":")[0]
        for event in self._waiters.get(session_id, ()):
            event.set()

    async def _listen(self) -> None:
        while True:
            try:
                conn = await asyncpg.connect(self._dsn)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, ev=closed: ev.set())
                try:
                    await conn.add_listener(NOTIFY_CHANNEL, self._notify)
                    await closed.wait()
                finally:
                    with contextlib.suppress(Exception):
                        await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database restarted: streams fall back to polling meanwhile
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
                await asyncio.sleep(1)

    @contextlib.contextmanager
    def subscribe(self, session_id: str) -> Any:
        event = asyncio.Event()
        self._waiters[session_id].add(event)
        try:
            yield event
        finally:
            self._waiters[session_id].discard(event)
            if not self._waiters[session_id]:
                del self._waiters[session_id]
