"""The LLM facade (runner plane): metered, budgeted model traffic with the real key swapped in."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["internal"])
