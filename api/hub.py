"""Ledger wake-ups: one LISTEN connection per API process, fanned out in memory.

A NOTIFY only wakes a stream; every stream always reads from the ``seq > last`` catch-up query, so a
missed notification costs latency (the 2 s re-poll), never an event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from typing import Any

from db.notify import listen


class EventHub:
    def __init__(self, database_url: str) -> None:
        self._database_url = database_url
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(listen(self._database_url, self._notify))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _notify(self, payload: str) -> None:
        session_id = payload.partition(":")[0]
        for event in self._waiters.get(session_id, ()):
            event.set()

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
