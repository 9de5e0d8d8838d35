"""Every handler returns the model it declares (``api/responses.py``), never a dict built beside it, so mypy checks
each answer against the schema ``/openapi.json`` publishes. A handler that shapes its own answer (a stream, a
redirect, a page, a proxied body) says so by returning a ``Response``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_type_hints

from fastapi.routing import APIRoute
from starlette.responses import Response

from api import routes
from api.app import create_app
from config.settings import Settings


def app_routes() -> list[APIRoute]:
    """Every API route of the app, through the routers it includes (FastAPI resolves included routers lazily)."""
    app = create_app(Settings(admin_token="fbx_admin_" + "0" * 48, database_url="postgresql://unused/x"))
    found: list[APIRoute] = []
    pending: list[Any] = list(app.routes)
    while pending:
        route = pending.pop()
        if isinstance(route, APIRoute):
            found.append(route)
        elif hasattr(route, "original_router"):
            pending.extend(route.original_router.routes)
    return found


def test_the_walk_reaches_every_router() -> None:
    routers = {f"api.routes.{p.stem}" for p in Path(routes.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert {r.endpoint.__module__ for r in app_routes()} == routers


def test_every_handler_returns_the_model_it_declares() -> None:
    loose = []
    for route in app_routes():
        returned = get_type_hints(route.endpoint).get("return")
        if isinstance(returned, type) and issubclass(returned, Response):
            continue
        if route.response_model is None or returned is not route.response_model:
            where = f"{route.endpoint.__module__}.{route.endpoint.__name__}"
            loose.append(f"{','.join(sorted(route.methods))} {route.path} ({where}) -> {returned}")
    assert loose == []
