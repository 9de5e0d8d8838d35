"""Stable digests: tool inputs, tokens, documents."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_digest(tool: str, tool_input: Any) -> str:
    """``sha256:`` + first 8 bytes (16 hex) of the canonical JSON of tool and input."""
    text = canonical_json({"tool": tool, "input": tool_input})
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def sha256_hex(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def document_digest(value: Any) -> str:
    return "sha256:" + sha256_hex(canonical_json(value))
