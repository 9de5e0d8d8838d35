"""Response shapes shared by more than one router (so that no router imports another)."""

from __future__ import annotations

from typing import Any

from db.connections import ConnectionRow
from db.models.connections import ConnectionToolSnapshot


def connection_public(row: ConnectionRow) -> dict[str, Any]:
    """A connection as the API shows it (the row holds no credential): a stdio environment's values and an
    uploaded OpenAPI document, which only its tools matter for, are not shown either."""
    out = row.model_dump()
    config = dict(row.transport_config)
    if isinstance(config.get("env"), dict):
        config["env"] = {name: "…" for name in config["env"]}
    if "document" in config:
        config["document"] = "(uploaded)"
    out["transport_config"] = config
    return out


def snapshot_public(row: ConnectionToolSnapshot, *, with_schemas: bool = False) -> dict[str, Any]:
    tools = row.tools_json
    return {
        "version": row.snapshot_version,
        "protocol_version": row.protocol_version,
        "tools_digest": row.tools_digest,
        "discovered_at": row.discovered_at,
        "authorization_generation": row.authorization_generation,
        "tools": tools
        if with_schemas
        else [
            {"name": t["name"], "description": t.get("description")}
            | ({"access": t["access"]} if "access" in t else {})
            for t in tools
        ],
    }
