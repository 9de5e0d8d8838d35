"""The catalog's reviewed read/write patterns against the real servers they describe.

Three kinds of curated entry are checked. The first two start a real MCP server installed by ``make install``
(``.node/node_modules``) over stdio and classify its real ``tools/list`` with the entry's patterns:

* entries that launch an npm server themselves (``filesystem``): the entry's own command and arguments, the served
  directory moved to a temporary one;
* hosted entries (``sentry``, ``notion``): the catalog points at the vendor's remote HTTP server, which is not
  reachable from a test, so the tool list is the one of the npm release of the same vendor's server at the version
  pinned in the Makefile (``SENTRY_MCP_VERSION``, ``NOTION_MCP_VERSION``), started with a dummy credential (neither
  checks it before listing tools). Sentry's server also exposes a catalog of further tools behind its
  ``search_sentry_tools`` gateway; those are checked too, since the hosted server may list them directly.

The third is ``github``: GitHub's own server (github/github-mcp-server) is released as a Go binary and a container
image, not on npm (``@modelcontextprotocol/server-github`` there is an older, archived server with other tools than the
hosted one), so its tool list is a snapshot kept beside this file: every tool's name and ``readOnlyHint`` as the
release's own tool snapshots declare them (``github_mcp_server_tools.json`` names the release and commit).

``stripe``, ``linear`` and ``atlassian`` stay unverified: ``@stripe/mcp`` 0.3.3 only relays stdio to
https://mcp.stripe.com (no tool list of its own), and Linear and Atlassian publish no package of their hosted servers.

No tool may be left unclassified (it would be neither discoverable nor callable), and a tool that changes something
is a write, never a read: the class must agree with the server's own ``readOnlyHint`` where it gives one, and a tool
whose name says it mutates (create, update, delete, ...) must be a write. Each entry's reviewed set of writes is
spelled out, with the version it was reviewed at: a version bump fails here until someone reviews the new tools.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from core.access import classify, from_catalog, parse_access
from tests.openapi_docs import ROOT

CATALOG = ROOT / "catalog" / "connectors.yaml"
NODE_MODULES = ROOT / ".node" / "node_modules"
NPM_BIN = NODE_MODULES / ".bin"
MUTATING = {"create", "update", "delete", "patch", "move", "add", "remove", "set", "assign", "archive", "send",
            "cancel", "refund", "execute", "write", "edit", "resolve", "upload", "duplicate"}  # fmt: skip
# Sentry's gateway ranks its catalog by these words; together they reach every tool of the pinned release.
SENTRY_TOPICS = ("issue event project team dsn monitor uptime release trace span doc dashboard alert rule replay "
                 "profile snapshot conversation agent whoami organization onboarding attachment breadcrumb tag user "
                 "activity note stacktrace seer resource").split()  # fmt: skip


@dataclass(frozen=True)
class Release:
    """An npm release of a hosted entry's vendor server, and how to start it without a real credential."""

    package: str
    version: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


HOSTED = {
    # --all-skills: every tool the release has, not only the default skills'.
    "sentry": Release("@sentry/mcp-server", "0.39.0", "sentry-mcp", ["--access-token=not-real", "--all-skills"]),
    "notion": Release("@notionhq/notion-mcp-server", "2.5.2", "notion-mcp-server", env={"NOTION_TOKEN": "ntn_x"}),
}
# Reads whose name carries a mutating word, each reviewed against the tool's description: find_duplicate "returns
# ranked candidate issues ... and does not close, link, comment on, or otherwise modify any issue".
READ_DESPITE_NAME = {"github": {"find_duplicate"}}
# Tool lists of releases that are not on npm: name → readOnlyHint, with the release they were read from.
SNAPSHOTS = {"github": Path(__file__).resolve().parent / "github_mcp_server_tools.json"}
# The reviewed answer per entry: the exact writes (everything else listed is a read).
WRITES = {
    "github": {"actions_run_trigger", "add_comment_to_pending_review", "add_issue_comment",
               "add_issue_comment_reaction", "add_issue_reaction", "add_pull_request_review_comment",
               "add_pull_request_review_comment_reaction", "add_reply_to_pull_request_comment", "add_sub_issue",
               "assign_copilot_to_issue", "assign_copilot_to_issue_with_intent", "create_branch", "create_gist",
               "create_issue", "create_or_update_file", "create_pull_request", "create_pull_request_review",
               "create_repository", "delete_file", "delete_pending_pull_request_review", "delete_repository",
               "discussion_comment_write", "dismiss_notification", "fork_repository", "issue_dependency_write",
               "issue_write", "label_write", "manage_notification_subscription",
               "manage_repository_notification_subscription", "mark_all_notifications_read", "merge_pull_request",
               "projects_write", "pull_request_review_write", "push_files", "remove_sub_issue",
               "reprioritize_sub_issue", "request_copilot_review", "request_pull_request_reviewers",
               "resolve_review_thread", "set_issue_fields", "star_repository", "sub_issue_write",
               "submit_pending_pull_request_review", "unresolve_review_thread", "unstar_repository", "update_gist",
               "update_issue_assignees", "update_issue_body", "update_issue_labels", "update_issue_milestone",
               "update_issue_state", "update_issue_title", "update_issue_type", "update_pull_request",
               "update_pull_request_body", "update_pull_request_branch", "update_pull_request_draft_state",
               "update_pull_request_state", "update_pull_request_title"},
    "filesystem": {"write_file", "edit_file", "create_directory", "move_file"},
    "sentry": {"update_issue", "analyze_issue_with_seer", "execute_sentry_tool", "add_issue_note",
               "add_team_to_project", "remove_team_from_project", "create_dsn", "update_dsn", "create_project",
               "update_project", "create_team", "create_uptime_monitor", "update_uptime_monitor",
               "delete_uptime_monitor", "onboarding_status_update"},
    "notion": {"API-create-a-comment", "API-create-a-data-source", "API-update-a-data-source", "API-post-page",
               "API-patch-page", "API-move-page", "API-update-page-markdown", "API-patch-block-children",
               "API-update-a-block", "API-delete-a-block"},
}  # fmt: skip


def entries() -> dict[str, dict[str, Any]]:
    return {e["slug"]: e for e in yaml.safe_load(CATALOG.read_text())}


def npm_entries() -> list[dict[str, Any]]:
    return [
        e
        for e in entries().values()
        if e.get("transport") == "stdio"
        and e.get("transport_config")
        and (NPM_BIN / str(e["transport_config"]["command"])).exists()
    ]


def checked_slugs() -> list[str]:
    return sorted({e["slug"] for e in npm_entries()} | set(HOSTED) | set(SNAPSHOTS))


async def list_all(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def hint(annotations: Any) -> bool | None:
    return annotations.read_only_hint if annotations is not None else None


async def sentry_catalog(session: ClientSession) -> dict[str, bool | None]:
    """The tools behind Sentry's ``search_sentry_tools`` / ``execute_sentry_tool`` gateway, with their hints."""
    found: dict[str, bool | None] = {}
    for topic in SENTRY_TOPICS:
        result = await session.call_tool("search_sentry_tools", {"query": topic, "limit": 20})
        assert not result.is_error, f"search_sentry_tools({topic!r}): {result.content}"
        assert result.structured_content is not None
        for tool in result.structured_content["results"]:
            found[tool["name"]] = (tool.get("annotations") or {}).get("readOnlyHint")
    return found


async def real_tools(slug: str, served: Path) -> dict[str, bool | None]:
    """Every real tool name the entry's server offers, with its ``readOnlyHint`` (None when it gives none)."""
    if slug in SNAPSHOTS:
        return dict(json.loads(SNAPSHOTS[slug].read_text())["tools"])
    if slug in HOSTED:
        release = HOSTED[slug]
        installed = json.loads((NODE_MODULES / release.package / "package.json").read_text())["version"]
        assert installed == release.version, f"{release.package} {installed} is not the reviewed {release.version}"
        params = StdioServerParameters(command=str(NPM_BIN / release.command), args=release.args, env=release.env)
    else:
        config = entries()[slug]["transport_config"]
        args = [str(served) if a.startswith("/") else a for a in config.get("args", [])]
        params = StdioServerParameters(command=str(NPM_BIN / config["command"]), args=args, env=config.get("env"))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: hint(t.annotations) for t in await list_all(session)}
        if slug == "sentry":
            tools |= await sentry_catalog(session)
        return tools


def test_the_catalog_has_entries_backed_by_installed_npm_servers() -> None:
    assert {e["slug"] for e in npm_entries()} >= {"filesystem"}, "run `make install` (server-filesystem)"
    missing = [r.package for r in HOSTED.values() if not (NPM_BIN / r.command).exists()]
    assert missing == [], "run `make install` (the vendors' MCP servers)"
    assert set(HOSTED) | set(SNAPSHOTS) <= set(entries())


@pytest.mark.parametrize("slug", checked_slugs())
async def test_every_real_tool_is_classified_and_writes_are_writes(slug: str, tmp_path: Path) -> None:
    entry = entries()[slug]
    decl = parse_access(entry["access"], f"catalog entry '{slug}'.access")
    tools = await real_tools(slug, tmp_path)
    assert tools, f"{slug}: the server listed no tools"
    classes = {name: classify(decl, name)[0] for name in tools}
    assert [n for n, c in classes.items() if c is None] == [], f"{slug}: unclassified tools"
    assert any(h is not None for h in tools.values()), f"{slug}: the server annotates none of its tools"
    wrong = {n: classes[n] for n, read_only in tools.items() if read_only is not None and
             (classes[n] == "read") != read_only}  # fmt: skip
    assert wrong == {}, f"{slug}: the class disagrees with the server's readOnlyHint"
    mutating = {n for n in tools if MUTATING & set(re.split(r"[_\-]", n.lower()))} - READ_DESPITE_NAME.get(slug, set())
    assert {n: classes[n] for n in mutating if classes[n] != "write"} == {}, f"{slug}: a mutating name is a read"
    # The reviewed answer, spelled out.
    assert {n for n, c in classes.items() if c == "write"} == WRITES[slug]
    if slug == "filesystem":
        assert {"read_text_file", "read_file", "list_directory", "search_files", "directory_tree"} <= set(classes)
    if slug == "sentry":  # the direct tools/list of the pinned release, and the gateway's reads
        assert {"search_issues", "search_events", "get_sentry_resource", "search_sentry_tools"} <= set(classes)
        assert {"get_issue_details", "get_trace_details", "find_releases", "whoami"} <= set(classes)
    if slug == "github":  # the consolidated read tools, and the writes that name no mutating verb
        assert classes["issue_read"] == classes["pull_request_read"] == classes["get_me"] == "read"
        assert classes["issue_write"] == classes["merge_pull_request"] == classes["push_files"] == "write"
    if slug == "notion":  # POSTs that only read
        assert classes["API-post-search"] == classes["API-query-data-source"] == "read"
    # A connection made from the entry gets only the reads: a write tool is not callable until an admin enables it
    # (by copying the entry's write patterns onto the connection, which then classify every write as one).
    made = from_catalog(entry["access"])
    assert {n: classify(made, n)[0] for n in WRITES[slug]} == dict.fromkeys(WRITES[slug])
    assert {n for n in classes if classify(made, n)[0] == "read"} == set(classes) - WRITES[slug]
