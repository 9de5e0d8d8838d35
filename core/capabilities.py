"""Capability bundle definitions: sandbox-class MCP servers an agent revision can pin (pure).

Brokered servers are not bundles any more: they are connection requirements bound to custodied
connections. Everything authored here is screened for invisible characters, because tool names and
descriptions reach the model verbatim.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.digests import canonical_json
from core.errors import BadRequest

MAX_BYTES = 2 * 1024 * 1024
_POISON = re.compile("[\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def _clean(value: str, what: str) -> str:
    if _POISON.search(value):
        raise ValueError(f"{what} contains invisible or control characters")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class BundleTool(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    description: str = Field(default="", max_length=32768)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        _clean(v.replace("\n", " ").replace("\t", " "), "a tool description")  # newlines and tabs are fine
        return v

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                jsonschema.validators.validator_for(v, default=jsonschema.Draft202012Validator).check_schema(v)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"not a valid JSON Schema: {exc.message}") from None
        return v


class BundleServer(_Strict):
    class_: Literal["sandbox", "brokered"] = Field(alias="class")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    command: str | None = Field(default=None, min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=64)
    tools: list[BundleTool] = Field(default_factory=list, max_length=64)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        return _clean(v, "a server command") if v is not None else v


class BundleDefinition(_Strict):
    name: str = Field(pattern=r"^[a-z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=32768)
    servers: list[BundleServer] = Field(min_length=1, max_length=16)


def parse_bundle(document: Any) -> BundleDefinition:
    """Strictly parse an authored bundle; 400 naming the problem (brokered servers are refused)."""
    if len(canonical_json(document).encode()) > MAX_BYTES:
        raise BadRequest("a capability bundle definition is at most 2 MiB")
    try:
        bundle = BundleDefinition.model_validate(document)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(document)"
            problems.append(
                f"unknown field '{where}'" if err["type"] == "extra_forbidden" else f"{where}: {err['msg']}"
            )
        raise BadRequest("invalid capability bundle: " + "; ".join(problems)) from None
    for server in bundle.servers:
        if server.class_ == "brokered":
            raise BadRequest(
                f"brokered server '{server.name}' can no longer be published in a capability bundle — brokered "
                "tools are now connection requirements + snapshots; see docs/api.md"
            )
        if server.command is None:
            raise BadRequest(f"sandbox server '{server.name}' needs a `command`")
        if not server.tools:
            # The gate only lets through tools frozen from this list: a server without it could
            # never be called, and its real surface would go unscreened.
            raise BadRequest(
                f"sandbox server '{server.name}' declares no tools — list each under `tools` "
                "(name, description, input_schema)"
            )
        names = [t.name for t in server.tools]
        if len(names) != len(set(names)):
            raise BadRequest(f"server '{server.name}' declares a tool more than once")
    aliases = [s.name for s in bundle.servers]
    if len(aliases) != len(set(aliases)):
        raise BadRequest("two servers in one bundle share an alias")
    return bundle


def launch_server(alias: str, launch: dict[str, Any]) -> dict[str, Any]:
    """The sandbox-class bundle server a catalog entry's ``sandbox_launch`` stands for."""
    return {
        "class": "sandbox",
        "name": alias,
        "command": launch.get("command"),
        "args": launch.get("args", []),
        "tools": launch.get("tools", []),
    }


def check_catalog_launch(slug: str, transport: str, launch: dict[str, Any] | None) -> None:
    """A stdio entry runs inside the sandbox, so it needs a ``sandbox_launch`` that would publish as
    a valid bundle server (command and declared tools); 400 naming the problem otherwise."""
    if launch is None:
        if transport == "stdio":
            raise BadRequest(
                "a stdio catalog entry needs `sandbox_launch` ({command, args?, tools}): "
                "it runs inside the sandbox and has no URL to connect to"
            )
        return
    try:
        parse_bundle({"name": "catalog", "servers": [launch_server(slug, launch)]})
    except BadRequest as err:
        raise BadRequest(f"invalid sandbox_launch: {err.message}") from None


def frozen_entry(row: dict[str, Any]) -> dict[str, Any]:
    """What a RunSpec keeps of a pinned bundle version."""
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "version": row["version"],
        "definition_digest": row["definition_digest"],
        "servers": [
            {
                "class": s["class"],
                "name": s["name"],
                "command": s["command"],
                "args": s.get("args", []),
                "tools": s.get("tools", []),
            }
            for s in row["definition"]["servers"]
        ],
    }


def narrow_pins(pins: list[dict[str, Any]], keep: list[str] | None) -> list[dict[str, Any]]:
    """The revision's pinned bundles narrowed (remove-only) by a keep-list; ``None`` keeps all, ``[]`` none.

    Raises:
        BadRequest: ``keep`` names a bundle the revision does not pin (capabilities can only narrow).
    """
    if keep is None:
        return pins
    pinned = {p["name"] for p in pins}
    extra = sorted(set(keep) - pinned)
    if extra:
        raise BadRequest(f"capabilities can only narrow: {', '.join(extra)} not attached to this agent's revision")
    return [p for p in pins if p["name"] in keep]
