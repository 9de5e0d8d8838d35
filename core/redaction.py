"""The redactor: the only way to build a ``Redacted`` payload, and so the only way into the ledger.

Secrets and token-shaped strings are replaced with ``‹redacted›`` at any depth of a JSON value.
"""

from __future__ import annotations

import re
from typing import Any

MARK = "‹redacted›"

_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"sk-ant-[A-Za-z0-9_\-]{8,}",
        r"sk-proj-[A-Za-z0-9_\-]{8,}",
        r"\bsk-[A-Za-z0-9_\-]{16,}",
        r"fbx_(?:sess|trig|web|pat|admin|whsec)_[A-Za-z0-9]{8,}",
        r"\bgh[pousr]_[A-Za-z0-9]{20,}",
        r"github_pat_[A-Za-z0-9_]{20,}",
        r"\bAKIA[0-9A-Z]{16}\b",
        r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
        r"\bnpg_[A-Za-z0-9]{10,}",
        r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{16,}",
        r"(?i)(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",
    )
)


def scrub_text(text: str) -> str:
    for pattern in _PATTERNS:
        text = pattern.sub(MARK, text)
    return text


class Redacted:
    """A JSON value that has passed the redactor. Construct it only via ``Redactor.redact``."""

    __slots__ = ("value",)
    _token = object()

    def __init__(self, value: Any, token: object) -> None:
        if token is not Redacted._token:
            raise TypeError("Redacted values come only from Redactor.redact")
        self.value = value


class Redactor:
    def __init__(self, extra_secrets: tuple[str, ...] = ()) -> None:
        # Exact secrets known to this process (the admin token, upstream keys) are scrubbed too.
        self._extra = tuple(s for s in extra_secrets if len(s) >= 8)

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self._extra:
                value = value.replace(secret, MARK)
            return scrub_text(value)
        if isinstance(value, dict):
            return {self._scrub(str(k)): self._scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub(v) for v in value]
        return value

    def redact(self, value: Any) -> Redacted:
        return Redacted(self._scrub(value), Redacted._token)
