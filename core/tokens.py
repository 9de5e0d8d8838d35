"""Bearer token shapes. Tokens are random, shown once, stored only as SHA-256 digests."""

from __future__ import annotations

from enum import StrEnum

from core.digests import sha256_hex

SESSION_TOKEN_PREFIX = "fbx_sess_"
ADMIN_TOKEN_PREFIX = "fbx_admin_"


class Audience(StrEnum):
    CONTROL = "control"
    TOOL = "tool"
    LLM = "llm"
    WORKSPACE = "workspace"


# A one-time credential a sandbox off the worker's host trades for the run's tokens (never a run token itself).
BOOTSTRAP_AUDIENCE = "bootstrap"

RUN_AUDIENCES: tuple[Audience, ...] = (Audience.CONTROL, Audience.TOOL, Audience.LLM, Audience.WORKSPACE)


def session_token(random_hex: str) -> str:
    """Build a run-scoped token from 32 hex characters of randomness supplied by the caller."""
    return SESSION_TOKEN_PREFIX + random_hex


def token_digest(token: str) -> str:
    return sha256_hex(token)
