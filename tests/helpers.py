"""Helpers shared by every test package."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from config.settings import Settings
from core.redaction import Redactor
from services.context import AppContext, build_context
from services.run_control import InMemoryRunWorkflows

if TYPE_CHECKING:
    import socket

    import uvicorn

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


@contextlib.contextmanager
def server_thread(server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> Iterator[None]:
    """Run a real uvicorn server in a daemon thread for the block: it answers once the block starts, and it has
    stopped when the block ends."""
    kwargs: dict[str, Any] = {"sockets": sockets} if sockets is not None else {}
    thread = threading.Thread(target=server.run, kwargs=kwargs, daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(1000):  # uvicorn sets ``started`` once it listens; there is nothing to wait on instead
        if server.started:
            break
        started.wait(0.01)
    assert server.started, "the test server did not start"
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)


def context_over(
    pool: Any,
    settings: Settings | None = None,
    *,
    temporal: Callable[[], Awaitable[Any]] | None = None,
    redactor: Redactor | None = None,
    sealer: Any = None,
) -> AppContext:
    """The process's object graph over a test's pool (``services.context.build_context``). Without ``temporal``,
    runs' workflows are :class:`InMemoryRunWorkflows` and any other use of Temporal fails at once."""

    async def no_temporal() -> Any:
        raise ConnectionError("this test runs no Temporal server")

    return build_context(
        settings or Settings(),
        pool,
        temporal=temporal or no_temporal,
        workflows=None if temporal else InMemoryRunWorkflows(),
        redactor=redactor or Redactor(),
        sealer=sealer,
    )


def examples(n: int) -> int:
    """A property's example count, scaled by ``FLUIDBOX_TEST_EXAMPLES_SCALE`` (``make check`` runs a quarter of
    each; ``make test`` runs them all)."""
    return max(25, round(n * float(os.environ.get("FLUIDBOX_TEST_EXAMPLES_SCALE", "1"))))
