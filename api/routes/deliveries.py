"""Result deliveries: the signed webhooks a finished run sends to its destinations."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["deliveries"])
