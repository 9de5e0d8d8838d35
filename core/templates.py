"""Task templates: ``{{key}}`` substitution, nothing more (no expressions, no escaping rules).

A placeholder is ``{{`` + optional spaces + a key + optional spaces + ``}}``. An unclosed ``{{``,
a malformed key, or a key the variables do not supply is a 400 naming it: a template never renders
half-filled. Single braces and a stray ``}}`` are ordinary text.
"""

from __future__ import annotations

import re

from core.errors import BadRequest

KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def _scan(template: str) -> list[tuple[int, int, str]]:
    """Every placeholder as (start, end, key), in order."""
    out: list[tuple[int, int, str]] = []
    pos = 0
    while (start := template.find("{{", pos)) != -1:
        end = template.find("}}", start + 2)
        if end == -1:
            raise BadRequest(f"task_template has an unclosed '{{{{' at character {start}")
        key = template[start + 2 : end].strip()
        if not KEY.fullmatch(key):
            shown = template[start : end + 2]
            raise BadRequest(
                f"task_template placeholder {shown!r} at character {start} is not a valid key "
                "(letters, digits, '_', '.', '-'; starting with a letter or '_')"
            )
        out.append((start, end + 2, key))
        pos = end + 2
    return out


def placeholders(template: str) -> list[str]:
    """The distinct keys a template references, in first-use order (validates the syntax)."""
    seen: list[str] = []
    for _, _, key in _scan(template):
        if key not in seen:
            seen.append(key)
    return seen


def render(template: str, variables: dict[str, str]) -> str:
    """Substitute every placeholder; values are inserted verbatim (never re-scanned)."""
    parts: list[str] = []
    pos = 0
    for start, end, key in _scan(template):
        if key not in variables:
            raise BadRequest(f"task_template references '{{{{{key}}}}}' but the invocation context has no '{key}'")
        parts.append(template[pos:start])
        parts.append(variables[key])
        pos = end
    parts.append(template[pos:])
    return "".join(parts)


def require_only(template: str, allowed: set[str], what: str) -> None:
    """Refuse a template that needs keys the invocation shape can never supply."""
    extra = [k for k in placeholders(template) if k not in allowed]
    if extra:
        names = ", ".join(f"'{{{{{k}}}}}'" for k in extra)
        raise BadRequest(f"task_template references {names}, but {what} only supply {', '.join(sorted(allowed))}")
