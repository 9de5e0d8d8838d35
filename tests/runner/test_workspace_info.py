"""The catalog's ``workspace-info`` server (runner/workspace_info.py), started as its catalog entry starts it
and spoken to over stdio by the ``mcp`` SDK's client: the tool its entry declares, and the bounds of its walk."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from runner import workspace_info
from sandbox.bubblewrap import CODE_ROOT

ROOT = Path(__file__).resolve().parents[2]
ENTRY = next(
    e for e in yaml.safe_load((ROOT / "catalog" / "connectors.yaml").read_text()) if e["slug"] == "workspace-info"
)


def host_path(sandbox_path: str) -> Path:
    """Where a path the entry names inside the sandbox (under /opt/fluidbox) is in this checkout."""
    return ROOT / Path(sandbox_path).relative_to(CODE_ROOT)


async def call_summary(cwd: Path) -> tuple[list[str], dict[str, Any]]:
    launch = ENTRY["sandbox_launch"]
    params = StdioServerParameters(
        command=sys.executable, args=[str(host_path(a)) for a in launch["args"]], cwd=str(cwd),
        env={"PATH": os.environ["PATH"], "HOME": str(cwd)},  # the sandbox's allow-list: no PYTHONPATH
    )  # fmt: skip
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool("summary", {})
        return tools, json.loads(result.content[0].text)  # type: ignore[union-attr]


async def test_the_entry_starts_a_server_offering_the_tool_it_declares_and_counting_by_language(
    tmp_path: Path,
) -> None:
    (tmp_path / "app.py").write_text("print(1)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n" * 10)
    (tmp_path / "README.md").write_text("# hi\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big.py").write_text("y" * 10_000)
    (tmp_path / "link").symlink_to(outside)
    tools, summary = await call_summary(tmp_path)
    assert tools == [t["name"] for t in ENTRY["sandbox_launch"]["tools"]] == ["summary"]
    assert summary == {
        "files": 3,
        "bytes": 9 + 60 + 5,
        "languages": {"Python": {"files": 2, "bytes": 69}, "Markdown": {"files": 1, "bytes": 5}},
        "truncated": False,
    }


def test_a_tree_past_the_bounds_is_cut_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_info, "MAX_DEPTH", 4)
    deep = tmp_path
    for i in range(10):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (deep / "hidden.py").write_text("z")
    (tmp_path / "top.py").write_text("a")
    assert workspace_info.summarize(str(tmp_path)) == {
        "files": 1, "bytes": 1, "languages": {"Python": {"files": 1, "bytes": 1}}, "truncated": True,
    }  # fmt: skip
    monkeypatch.setattr(workspace_info, "MAX_DEPTH", 64)
    monkeypatch.setattr(workspace_info, "MAX_ENTRIES", 3)
    for i in range(10):
        (tmp_path / f"f{i}.txt").write_text("t")
    assert workspace_info.summarize(str(tmp_path))["truncated"] is True
