"""The catalog's reviewed read/write patterns against the real servers they describe.

Every curated entry that launches an npm MCP server installed by ``make install`` (``.node/node_modules/.bin``) is
started for real (the entry's own command and arguments, the served directory moved to a temporary one), and its
real ``tools/list`` is classified by the entry's patterns: no tool may be left unclassified (it would be neither
discoverable nor callable), and the class must agree with what the server itself says of each tool (its
``readOnlyHint`` annotation): a tool that changes something is a write, never a read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from core.access import classify, parse_access
from tests.openapi_docs import ROOT

CATALOG = ROOT / "catalog" / "connectors.yaml"
NPM_BIN = ROOT / ".node" / "node_modules" / ".bin"


def npm_entries() -> list[dict[str, Any]]:
    entries = yaml.safe_load(CATALOG.read_text())
    return [
        e
        for e in entries
        if e.get("transport") == "stdio"
        and e.get("transport_config")
        and (NPM_BIN / str(e["transport_config"]["command"])).exists()
    ]


async def real_tools(entry: dict[str, Any], served: Path) -> list[types.Tool]:
    """``tools/list`` of the entry's server, launched from node_modules with its own arguments (directories
    replaced by ``served``)."""
    config = entry["transport_config"]
    args = [str(served) if a.startswith("/") else a for a in config.get("args", [])]
    params = StdioServerParameters(command=str(NPM_BIN / config["command"]), args=args, env=config.get("env"))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools


def test_the_catalog_has_entries_backed_by_installed_npm_servers() -> None:
    assert {e["slug"] for e in npm_entries()} >= {"filesystem"}, "run `make install` (server-filesystem)"


@pytest.mark.parametrize("slug", [e["slug"] for e in npm_entries()])
async def test_every_real_tool_is_classified_and_writes_are_writes(slug: str, tmp_path: Path) -> None:
    entry = next(e for e in npm_entries() if e["slug"] == slug)
    decl = parse_access(entry["access"], f"catalog entry '{slug}'.access")
    tools = await real_tools(entry, tmp_path)
    assert tools, f"{slug}: the server listed no tools"
    classes = {t.name: classify(decl, t.name)[0] for t in tools}
    assert [n for n, c in classes.items() if c is None] == [], f"{slug}: unclassified tools"
    said = {t.name: t.annotations.read_only_hint for t in tools if t.annotations is not None}
    assert said, f"{slug}: the server annotates none of its tools; review its tools by hand"
    wrong = {n: classes[n] for n, read_only in said.items() if read_only is not None and
             (classes[n] == "read") != read_only}  # fmt: skip
    assert wrong == {}, f"{slug}: the class disagrees with the server's readOnlyHint"
    if slug == "filesystem":  # the reviewed answer, spelled out
        writes = {n for n, c in classes.items() if c == "write"}
        assert writes == {"write_file", "edit_file", "create_directory", "move_file"}
        assert {"read_text_file", "read_file", "list_directory", "search_files", "directory_tree"} <= set(classes)
    # A connection made from the entry gets only the reads: a write tool is not callable until an admin enables it.
    from_entry = {"read": decl["read"], "write": {"tools": [], "approval": "always"}}
    assert all(classify(from_entry, n)[0] != "write" for n in classes)
