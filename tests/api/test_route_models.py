"""Every handler returns the model it declares (``api/responses.py``), never a dict built beside it, so mypy checks
each answer against the schema ``/openapi.json`` publishes.

Only the run routers are listed so far; a router joins the list once its handlers return their models."""

from __future__ import annotations

from types import ModuleType
from typing import get_type_hints

import pytest
from fastapi.routing import APIRoute

from api.routes import approvals, deliveries, internal, llm, sessions, usage, workspaces

ROUTERS = [approvals, deliveries, internal, llm, sessions, usage, workspaces]


@pytest.mark.parametrize("module", ROUTERS, ids=lambda m: m.__name__)
def test_every_handler_returns_the_model_it_declares(module: ModuleType) -> None:
    declared = [r for r in module.router.routes if isinstance(r, APIRoute) and r.response_model is not None]
    assert declared
    wrong = {
        f"{'/'.join(sorted(r.methods))} {r.path}": get_type_hints(r.endpoint).get("return")
        for r in declared
        if get_type_hints(r.endpoint).get("return") is not r.response_model
    }
    assert wrong == {}
