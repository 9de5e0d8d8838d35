"""Trigger subscriptions: API invocation, schedules and event shapes, with shown-once secrets."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1/triggers", tags=["triggers"])
