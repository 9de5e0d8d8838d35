"""Tool access classes (pure): which of a connection's tools read, which write, and which are neither.

A connection declares ``access: {read: {tools: [patterns]}, write: {tools: [patterns], approval}}``
(shorthands: ``read: true|false``, ``write: false | {approval}``; ``true`` and a ``write`` without
``tools`` mean every tool). Patterns are ``fnmatch`` globs over the server's tool names. A write match
wins over a read match; a tool neither matches is *unclassified*: never listed to an agent and always
denied by the gate. ``approval: always`` puts a human in front of every call to that write tool, in
every autonomy mode; ``policy`` leaves the decision to the run's policy.

The class is frozen with each tool into the run's binding (``spec.brokered[].tools[].access`` and
``approval``), so editing a connection's declaration affects only future runs.
"""

from __future__ import annotations

import difflib
import json
from fnmatch import fnmatchcase
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.errors import Unprocessable
from core.tools import split_mcp

Access = Literal["read", "write"]
Approval = Literal["always", "policy"]
MAX_PATTERNS = 256
MAX_PATTERN = 256
ALL = ["*"]


def _patterns(values: list[str]) -> list[str]:
    if len(values) > MAX_PATTERNS:
        raise ValueError(f"at most {MAX_PATTERNS} patterns")
    for value in values:
        if not value.strip():
            raise ValueError("a tool pattern cannot be empty")
        if len(value) > MAX_PATTERN:
            raise ValueError(f"a tool pattern is at most {MAX_PATTERN} characters")
    return values


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadAccess(_Strict):
    tools: list[str] = Field(default_factory=list)

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[str]) -> list[str]:
        return _patterns(v)


class WriteAccess(_Strict):
    tools: list[str] = Field(default_factory=list)
    # Unstated approval on a write is the safe one: a human before every call.
    approval: Approval = "always"

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[str]) -> list[str]:
        return _patterns(v)


class AccessDecl(_Strict):
    """A connection's normalized declaration (both keys always present)."""

    read: ReadAccess = Field(default_factory=ReadAccess)
    write: WriteAccess = Field(default_factory=WriteAccess)

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        read, write = out.get("read"), out.get("write")
        if isinstance(read, bool):
            out["read"] = {"tools": ALL if read else []}
        if write is True:
            raise ValueError("`write: true` is ambiguous: say `write: {approval: always|policy}`")
        if write is False:
            out["write"] = {"tools": []}
        elif isinstance(write, dict) and "tools" not in write:
            out["write"] = {**write, "tools": ALL}
        return out


# Connections created before access classes existed (migration 0014), and run specs frozen before then:
# every tool is a write whose approval is left to the policy, i.e. exactly what those runs did before.
LEGACY: dict[str, Any] = {"read": {"tools": []}, "write": {"tools": ALL, "approval": "policy"}}
# A connector catalog entry's default: everything readable, nothing writable until an admin says so.
READ_ONLY: dict[str, Any] = {"read": {"tools": ALL}, "write": {"tools": [], "approval": "always"}}
# A connection created without a declaration: nothing is classified, so nothing is callable.
NONE: dict[str, Any] = {"read": {"tools": []}, "write": {"tools": [], "approval": "always"}}


def from_catalog(entry_access: dict[str, Any] | None) -> dict[str, Any]:
    """A new connection's declaration from its catalog entry's reviewed patterns: the entry's reads, no
    writes (enabling writes is an explicit edit of the connection)."""
    decl = parse_access(entry_access if entry_access is not None else READ_ONLY)
    return {"read": decl["read"], "write": {"tools": [], "approval": decl["write"]["approval"]}}


def parse_access(document: Any, where: str = "access") -> dict[str, Any]:
    """Strictly parse a declaration (shorthands allowed) into its normalized JSON form; 422 naming the
    problem otherwise."""
    try:
        decl = AccessDecl.model_validate(document)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in (where, *err["loc"]))
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key '{loc}'")
            else:
                problems.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
        raise Unprocessable("bad access declaration: " + "; ".join(problems)) from None
    return decl.model_dump(mode="json")


def classify(access_decl: dict[str, Any] | None, tool_name: str) -> tuple[Access | None, Approval | None]:
    """``(access, approval)`` of one tool under a normalized declaration: a write match wins over a read
    match; ``(None, None)`` when the tool is unclassified (or there is no declaration)."""
    if not access_decl:
        return None, None
    write = access_decl.get("write") or {}
    if any(fnmatchcase(tool_name, p) for p in write.get("tools") or []):
        return "write", write.get("approval") or "always"
    read = access_decl.get("read") or {}
    if any(fnmatchcase(tool_name, p) for p in read.get("tools") or []):
        return "read", None
    return None, None


def with_access(access_decl: dict[str, Any] | None, tool: dict[str, Any]) -> dict[str, Any]:
    """A frozen tool definition with its ``access`` and ``approval`` stamped on. The connection's declaration
    decides; a tool it leaves unclassified keeps the class its transport photographed (an OpenAPI or HTTP
    operation's method: GET/HEAD read, anything else write), and such a default write always needs a human."""
    access, approval = classify(access_decl, str(tool["name"]))
    if access is None and tool.get("access") in ("read", "write"):
        access = tool["access"]
        approval = "always" if access == "write" else None
    return {**tool, "access": access, "approval": approval}


def entry_access(entry: dict[str, Any]) -> tuple[Access | None, Approval | None]:
    """The class frozen on one ``spec.brokered`` tool entry. An entry frozen before access classes
    existed has no ``access`` key at all: it keeps what it could do then (a write left to the policy)."""
    if "access" not in entry:
        return "write", "policy"
    return entry.get("access"), entry.get("approval")


def brokered_entry(brokered: list[dict[str, Any]], tool: str) -> dict[str, Any] | None:
    """The frozen ``spec.brokered`` tool entry behind ``mcp__<slot>__<name>``, or None."""
    parts = split_mcp(tool)
    if parts is None:
        return None
    slot, name = parts
    for surface in brokered:
        if surface.get("slot") == slot:
            return next((t for t in surface.get("tools", []) if t.get("name") == name), None)
    return None


class HasBrokered(Protocol):
    """What :func:`tool_access` reads of a run (``core.runspec.RunSpec`` is one)."""

    @property
    def brokered(self) -> list[dict[str, Any]]: ...


def tool_access(spec: HasBrokered, tool: str) -> tuple[Access, Approval | None] | None:
    """``(access, approval)`` of a brokered tool of this run; None when the tool is not a brokered tool
    of the run or is unclassified (neither discoverable nor callable)."""
    entry = brokered_entry(spec.brokered, tool)
    if entry is None:
        return None
    access, approval = entry_access(entry)
    if access is None:
        return None
    return access, approval


def definition(tool: dict[str, Any]) -> dict[str, Any]:
    """What an admin approves of a photographed tool: its description and input schema (the name is
    the key). A change of either quarantines the tool until approved."""
    return {"description": tool.get("description") or "", "input_schema": tool.get("input_schema")}


def definition_diff(previous: dict[str, Any] | None, proposed: dict[str, Any]) -> tuple[list[str], str]:
    """What changed between an approved tool definition and a proposed one: the fields that differ
    (``description``, ``input_schema``) and a unified diff of both as indented, key-sorted JSON."""
    before = previous or {}
    fields = [k for k in ("description", "input_schema") if k not in before or before.get(k) != proposed.get(k)]

    def lines(doc: dict[str, Any] | None) -> list[str]:
        return [] if doc is None else (json.dumps(doc, indent=2, sort_keys=True) + "\n").splitlines(keepends=True)

    text = "".join(difflib.unified_diff(lines(previous), lines(proposed), fromfile="approved", tofile="proposed", n=3))
    return fields, text


def access_of(spec: HasBrokered, tool: str) -> Access | None:
    """The access class a ``tool.decision`` records: a brokered tool's frozen class, else None."""
    entry = brokered_entry(spec.brokered, tool)
    return entry_access(entry)[0] if entry is not None else None


def is_classified(entry: dict[str, Any]) -> bool:
    return entry_access(entry)[0] is not None


__all__ = [
    "LEGACY",
    "NONE",
    "READ_ONLY",
    "Access",
    "AccessDecl",
    "Approval",
    "access_of",
    "brokered_entry",
    "classify",
    "definition",
    "definition_diff",
    "entry_access",
    "from_catalog",
    "is_classified",
    "parse_access",
    "tool_access",
    "with_access",
]
