"""Deferred tool discovery: ``tool_search`` and ``tool_describe`` over a run's frozen tool snapshots.

A deferred run's agent sees three tools instead of every brokered schema: ``tool_search`` (a query → a few
ranked one-line entries), ``tool_describe`` (one tool's frozen schema) and ``tool_call`` (a target's name and
arguments). The control plane answers the first two from the frozen RunSpec, so the sandbox never holds the
full tool set; ``tool_call`` is executed as a direct brokered call on its target, so the gate judges the
target exactly as it judges a direct call (canonical name, frozen schema, policy, approval).

The ranker is BM25 over three weighted fields (name, parameter names, description), built once per RunSpec
and kept in a small cache: a RunSpec never changes after freeze, so its index never goes stale.

Which runs are deferred is decided at freeze (``core.runspec.resolve_tool_discovery``: an agent revision's
``tool_discovery`` of ``eager``, ``deferred`` or ``auto``, the last deferred above ``AUTO_DEFERRED_ABOVE``
brokered tools). Pure standard library (plus the RunSpec type): no I/O, no new dependency.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.access import entry_access
from core.runspec import RunSpec

DEFAULT_LIMIT = 10
MAX_LIMIT = 50
MAX_QUERY_CHARS = 500
ONE_LINE_CHARS = 200

# BM25 with per-field weights (BM25F-style: weighted term frequencies, one length normalisation).
K1 = 1.2
B = 0.75
NAME_WEIGHT = 3.0
PARAM_WEIGHT = 1.5
DESCRIPTION_WEIGHT = 1.0
EXACT_NAME_BONUS = 100.0  # a query that *is* a tool's name ranks that tool first

_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_INDEX_CACHE_SIZE = 128


def access_of(spec: RunSpec, surface: Mapping[str, Any], tool: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(discoverable, the access class shown) of one frozen tool, as the gate reads it (``core.access``): a tool
    frozen before classes existed is a write left to the policy; an unclassified tool is neither discoverable
    nor describable (the gate refuses to call it)."""
    access, _ = entry_access(dict(tool))
    if access is None:
        return False, None
    return True, str(access)


def needs_authorization(surface: Mapping[str, Any], unusable_slots: frozenset[str] = frozenset()) -> bool:
    """A binding whose connection cannot be used right now (missing, expired, revoked credential): flagged on
    the surface (``needs_authorization``) or found live by the caller (``unusable_slots``)."""
    return bool(surface.get("needs_authorization")) or surface.get("slot") in unusable_slots


def tokens(text: str) -> list[str]:
    """Lower-case words of ``text``: split on non-alphanumerics and camelCase, plurals folded (``issues``)."""
    out: list[str] = []
    for word in _WORD.findall(text):
        for part in _CAMEL.split(word):
            token = part.lower()
            if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
                token = token[:-1]
            if token:
                out.append(token)
    return out


def one_line(text: str | None) -> str:
    """The first line of a description, cut to 200 characters."""
    line = (text or "").strip().split("\n", 1)[0].strip()
    return line if len(line) <= ONE_LINE_CHARS else line[: ONE_LINE_CHARS - 1] + "…"


def parameter_names(schema: Any) -> list[str]:
    """The top-level property names of an input schema (what an agent would search a tool by)."""
    if not isinstance(schema, dict):
        return []
    props = schema.get("properties")
    return [str(k) for k in props] if isinstance(props, dict) else []


@dataclass(frozen=True)
class Entry:
    """One discoverable frozen tool."""

    name: str  # canonical ``mcp__<slot>__<tool>``
    tool: str
    slot: str
    connection_id: str | None
    description: str
    input_schema: Any
    access: str | None
    flagged: bool  # the surface says its connection needs authorization

    def listing(self, unusable_slots: frozenset[str]) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": one_line(self.description),
            "connection": self.slot,
            "access": self.access,
            "needsAuthorization": self.flagged or self.slot in unusable_slots,
        }


class Index:
    """BM25 over the discoverable frozen tools of one RunSpec."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.by_name = {e.name: e for e in entries}
        self._exact: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            self._exact.setdefault(entry.name, []).append(i)
            if entry.tool != entry.name:
                self._exact.setdefault(entry.tool, []).append(i)
        postings: dict[str, list[tuple[int, float]]] = {}
        lengths: list[float] = []
        for i, entry in enumerate(entries):
            weighted: dict[str, float] = {}
            fields = (
                (tokens(entry.tool), NAME_WEIGHT),
                ([t for p in parameter_names(entry.input_schema) for t in tokens(p)], PARAM_WEIGHT),
                (tokens(entry.description), DESCRIPTION_WEIGHT),
            )
            for words, weight in fields:
                for word in words:
                    weighted[word] = weighted.get(word, 0.0) + weight
            lengths.append(sum(weighted.values()))
            for word, tf in weighted.items():
                postings.setdefault(word, []).append((i, tf))
        count = len(entries)
        avg = (sum(lengths) / count) if count else 1.0
        self._norm = [K1 * (1 - B + B * (length / avg if avg else 1.0)) for length in lengths]
        self._postings = postings
        self._idf = {w: math.log(1 + (count - len(p) + 0.5) / (len(p) + 0.5)) for w, p in postings.items()}

    def rank(self, query: str, limit: int) -> list[Entry]:
        """The best ``limit`` entries for ``query``; entries matching no query word are left out."""
        scores: dict[int, float] = {}
        for word in set(tokens(query)):
            idf = self._idf.get(word)
            if idf is None:
                continue
            for i, tf in self._postings[word]:
                scores[i] = scores.get(i, 0.0) + idf * tf * (K1 + 1) / (tf + self._norm[i])
        for i in self._exact.get(query.strip(), ()):
            scores[i] = scores.get(i, 0.0) + EXACT_NAME_BONUS
        # Ties go to the name, so one query always answers in one order.
        best = heapq.nsmallest(limit, scores.items(), key=lambda kv: (-kv[1], self.entries[kv[0]].name))
        return [self.entries[i] for i, _ in best]


def build_index(spec: RunSpec) -> Index:
    entries = []
    for surface in spec.brokered:
        flagged = needs_authorization(surface)
        for tool in surface.get("tools", []):
            discoverable, access = access_of(spec, surface, tool)
            if not discoverable:
                continue
            entries.append(
                Entry(
                    name=f"mcp__{surface['slot']}__{tool['name']}",
                    tool=str(tool["name"]),
                    slot=str(surface["slot"]),
                    connection_id=surface.get("connection_id"),
                    description=str(tool.get("description") or ""),
                    input_schema=tool.get("input_schema"),
                    access=access,
                    flagged=flagged,
                )
            )
    return Index(entries)


# id(spec) → (spec, index). The entry holds the spec itself, so its id cannot be reused while it is cached.
_cache: OrderedDict[int, tuple[RunSpec, Index]] = OrderedDict()


def index_for(spec: RunSpec) -> Index:
    """The spec's index, built on first use (the API keeps RunSpecs cached, so a run builds it once)."""
    key = id(spec)
    hit = _cache.get(key)
    if hit is not None and hit[0] is spec:
        _cache.move_to_end(key)
        return hit[1]
    index = build_index(spec)
    _cache[key] = (spec, index)
    while len(_cache) > _INDEX_CACHE_SIZE:
        _cache.popitem(last=False)
    return index


def search(
    spec: RunSpec, query: str, limit: int = DEFAULT_LIMIT, unusable_slots: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """``tool_search``: ranked ``{name, description, connection, access, needsAuthorization}`` entries.

    Only the run's frozen, discoverable tools are searched; a tool whose connection needs authorization is
    listed with ``needsAuthorization: true``, never left out.
    """
    limit = max(1, min(limit, MAX_LIMIT))
    return [e.listing(unusable_slots) for e in index_for(spec).rank(query[:MAX_QUERY_CHARS], limit)]


def describe(spec: RunSpec, name: str, unusable_slots: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """``tool_describe``: the frozen definition of one discoverable tool, or None when the run has no such tool."""
    entry = index_for(spec).by_name.get(name)
    if entry is None:
        return None
    return {
        **entry.listing(unusable_slots),
        "description": entry.description,
        "input_schema": entry.input_schema,
    }
