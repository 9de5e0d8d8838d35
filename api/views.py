"""Response shapes shared by more than one router (so that no router imports another)."""

from __future__ import annotations

from typing import Any


def connection_public(row: dict[str, Any]) -> dict[str, Any]:
    """A connection as the API shows it: never the sealed credential (nor a stdio environment's values, nor an
    uploaded OpenAPI document, which only its tools matter for)."""
    out = {
        k: (v.isoformat() if hasattr(v, "isoformat") else v)
        for k, v in row.items()
        if k not in ("credential_sealed", "credential_key_id")
    }
    config = out.get("transport_config")
    if isinstance(config, dict):
        config = dict(config)
        if isinstance(config.get("env"), dict):
            config["env"] = {name: "…" for name in config["env"]}
        if "document" in config:
            config["document"] = "(uploaded)"
        out["transport_config"] = config
    return out


def snapshot_public(row: dict[str, Any], *, with_schemas: bool = False) -> dict[str, Any]:
    tools = row["tools_json"]
    return {
        "version": row["snapshot_version"],
        "protocol_version": row["protocol_version"],
        "tools_digest": row["tools_digest"],
        "discovered_at": row["discovered_at"].isoformat(),
        "authorization_generation": row["authorization_generation"],
        "tools": tools
        if with_schemas
        else [
            {"name": t["name"], "description": t.get("description")}
            | ({"access": t["access"]} if "access" in t else {})
            for t in tools
        ],
    }
