"""Response shapes shared by more than one router (so that no router imports another)."""

from __future__ import annotations

from typing import Any


def connection_public(row: dict[str, Any]) -> dict[str, Any]:
    """A connection as the API shows it: never the sealed credential."""
    return {
        k: (v.isoformat() if hasattr(v, "isoformat") else v)
        for k, v in row.items()
        if k not in ("credential_sealed", "credential_key_id")
    }


def snapshot_public(row: dict[str, Any], *, with_schemas: bool = False) -> dict[str, Any]:
    tools = row["tools_json"]
    return {
        "version": row["snapshot_version"],
        "protocol_version": row["protocol_version"],
        "tools_digest": row["tools_digest"],
        "discovered_at": row["discovered_at"].isoformat(),
        "authorization_generation": row["authorization_generation"],
        "tools": tools if with_schemas else [{"name": t["name"], "description": t.get("description")} for t in tools],
    }
