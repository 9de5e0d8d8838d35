"""Helpers shared by every test package."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T]],
    *,
    timeout: float = 60.0,
    interval: float = 0.1,
    message: str | Callable[[], str] = "condition not reached in time",
) -> T:
    """Await ``check()`` until it returns something truthy and return that; fail after ``timeout`` seconds.

    A check that knows the condition can no longer come true raises ``AssertionError`` itself (at once).
    ``message`` may be a callable, so the failure can say what was seen last.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() >= deadline:
            raise AssertionError(message() if callable(message) else message)
        await asyncio.sleep(interval)
