"""Policies over HTTP: import, publish under concurrency, revert, clone, delete, validate, preview."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.helpers import make_agent, unique

pytestmark = pytest.mark.stack

RULES: dict[str, Any] = {
    "defaults": {"tool_action": "approve"},
    "tools": [{"match": ["Read"], "action": "allow"}, {"match": ["Bash"], "action": "deny", "risk": "no shell"}],
}


async def imported(api: httpx.AsyncClient, doc: dict[str, Any] | None = None) -> str:
    name = unique("pol")
    r = await api.post("/v1/policies", json={"name": name, "yaml": yaml.safe_dump({"name": name, **(doc or RULES)})})
    assert r.status_code == 200 and r.json()["appended"] is True, r.text
    return name


async def test_import_is_idempotent_for_identical_content_and_versions_changes(api: httpx.AsyncClient) -> None:
    name = unique("pol")
    text = yaml.safe_dump({"name": name, **RULES})
    first = (await api.post("/v1/policies", json={"name": name, "yaml": text})).json()
    again = (await api.post("/v1/policies", json={"name": name, "yaml": text})).json()
    assert (first["policy"]["version"], first["appended"]) == (1, True)
    assert (again["policy"]["version"], again["appended"]) == (1, False)
    changed = yaml.safe_dump({"name": name, **RULES, "approvals": {"default_ttl_secs": 60}})
    third = (await api.post("/v1/policies", json={"name": name, "yaml": changed})).json()
    assert (third["policy"]["version"], third["appended"]) == (2, True)
    version = (await api.get(f"/v1/policies/{name}/versions/1")).json()
    assert version["yaml"] == text and version["content"]["tools"][1]["risk"] == "no shell"
    listed = {p["name"]: p for p in (await api.get("/v1/policies")).json()["policies"]}
    assert listed[name]["version"] == 2 and listed[name]["agents_using"] == 0
    assert listed[name]["autonomy_summary"] == {
        "permitted": True,
        "default_fallback": "deny",
        "allow_overrides": 0,
        "deny_overrides": 0,
    }
    assert {"default", "demo", "standard", "governed", "unrestricted"} <= set(listed)


async def test_policy_detail_shows_versions_users_and_the_matrix(api: httpx.AsyncClient) -> None:
    name = await imported(api)
    agent = await make_agent(api, [{"say": "hi"}], policy=name)
    detail = (await api.get(f"/v1/policies/{name}")).json()
    assert detail["policy"]["version"] == 1 and [v["version"] for v in detail["versions"]] == [1]
    assert detail["agents_using"] == [agent]
    rows = {row["tool"]: row for row in detail["matrix"]}
    # spec "Matrix rows": {tool, group, server, status} with `status` the tagged verdict object.
    assert rows["Read"] == {"tool": "Read", "group": "files", "server": None,
                            "status": {"status": "unconditional", "action": "allow", "rule": 0}}  # fmt: skip
    assert rows["Bash"]["status"] == {"status": "unconditional", "action": "deny", "rule": 1}
    assert rows["Write"] == {
        "tool": "Write",
        "group": "files",
        "server": None,
        "status": {"status": "default", "action": "approve"},
    }
    demo = {r["tool"]: r for r in (await api.get("/v1/policies/demo")).json()["matrix"]}
    assert set(demo["Bash"]) == {"tool", "group", "server", "status"}
    status = demo["Bash"]["status"]
    assert (status["status"], status["action"]) == ("conditional", "allow") and isinstance(status["rule"], int)
    assert set(status["constraints"]) == {"paths_allow", "paths_deny", "paths_on_no_match",
                                          "shell_allow_prefixes", "shell_deny_regex", "shell_on_no_match"}  # fmt: skip
    assert status["constraints"]["shell_on_no_match"] == "approve" and status["constraints"]["paths_allow"] is None


async def test_publish_is_optimistic_and_a_retry_cannot_create_two_versions(api: httpx.AsyncClient) -> None:
    name = await imported(api)
    content = {"name": name, **RULES, "defaults": {"tool_action": "deny"}}
    body = {"content": content, "summary": "deny by default", "base_version": 1}
    ok = await api.post(f"/v1/policies/{name}/publish", json=body)
    assert ok.status_code == 200 and ok.json()["policy"]["version"] == 2
    retry = await api.post(f"/v1/policies/{name}/publish", json=body)
    assert retry.status_code == 409
    assert retry.json()["error"] == (
        "the policy moved to v2 since this draft loaded v1 — reload, re-apply your edit, and publish again"
    )
    detail = (await api.get(f"/v1/policies/{name}")).json()
    assert [v["version"] for v in detail["versions"]] == [2, 1]
    assert detail["versions"][0]["summary"] == "deny by default"


async def test_concurrent_publishes_from_the_same_base_yield_exactly_one_version(api: httpx.AsyncClient) -> None:
    name = await imported(api)
    bodies = [
        {"content": {"name": name, **RULES, "approvals": {"default_ttl_secs": 60 + i}}, "summary": f"edit {i}",
         "base_version": 1}
        for i in range(6)
    ]  # fmt: skip
    results = await asyncio.gather(*[api.post(f"/v1/policies/{name}/publish", json=b) for b in bodies])
    assert sorted(r.status_code for r in results) == [200, 409, 409, 409, 409, 409]
    assert [v["version"] for v in (await api.get(f"/v1/policies/{name}")).json()["versions"]] == [2, 1]


async def test_revert_moves_forward_with_the_old_content(api: httpx.AsyncClient) -> None:
    name = await imported(api)
    v2 = {"name": name, "defaults": {"tool_action": "allow"}}
    await api.post(f"/v1/policies/{name}/publish", json={"content": v2, "summary": "open up", "base_version": 1})
    r = await api.post(f"/v1/policies/{name}/revert", json={"version": 1, "base_version": 2})
    assert r.status_code == 200 and r.json()["policy"]["version"] == 3
    detail = (await api.get(f"/v1/policies/{name}")).json()
    assert detail["content"] == {"name": name, **RULES}
    assert detail["versions"][0]["summary"] == "revert to v1"
    stale = await api.post(f"/v1/policies/{name}/revert", json={"version": 1, "base_version": 2})
    assert stale.status_code == 409
    missing = await api.post(f"/v1/policies/{name}/revert", json={"version": 9, "base_version": 3})
    assert missing.status_code == 404


async def test_clone_from_a_policy_or_blank_and_its_refusals(api: httpx.AsyncClient) -> None:
    source = await imported(api)
    copy, blank = unique("copy"), unique("blank")
    r = await api.post("/v1/policies/clone", json={"name": copy, "from": source})
    assert r.status_code == 200 and r.json()["policy"]["version"] == 1
    detail = (await api.get(f"/v1/policies/{copy}")).json()
    assert (
        detail["content"]["tools"] == RULES["tools"]
        and detail["versions"][0]["summary"] == f"cloned from '{source}' v1"
    )
    r = await api.post("/v1/policies/clone", json={"name": blank})
    assert r.status_code == 200
    rows = (await api.get(f"/v1/policies/{blank}")).json()["matrix"]
    assert {(row["status"]["status"], row["status"]["action"]) for row in rows} == {("default", "approve")}, (
        "blank is fail-safe"
    )
    cases = [
        ({"name": copy, "from": source}, 409, f"a policy named '{copy}' already exists"),
        ({"name": unique("x"), "from": "nope"}, 400, "unknown source policy 'nope'"),
        ({"name": unique("x"), "from": source, "from_version": 7}, 400, f"source policy '{source}' has no v7"),
        ({"name": unique("x"), "from_version": 1}, 400, "`from_version` needs `from`"),
        ({"name": "clone"}, 400, "reserved"),
        ({"name": ".hidden"}, 400, "do not start with '.'"),
    ]
    for body, status, message in cases:
        r = await api.post("/v1/policies/clone", json=body)
        assert r.status_code == status and message in r.json()["error"], (body, r.text)


async def test_delete_is_refused_while_any_revision_names_the_policy(api: httpx.AsyncClient) -> None:
    used, unused = await imported(api), await imported(api)
    agent = await make_agent(api, [{"say": "hi"}], policy=used)
    await api.post(f"/v1/agents/{agent}/revisions", json={"policy": "demo"})
    r = await api.delete(f"/v1/policies/{used}")
    assert r.status_code == 409 and "still named by 1 agent revision(s)" in r.json()["error"]
    assert (await api.get(f"/v1/policies/{used}")).status_code == 200
    r = await api.delete(f"/v1/policies/{unused}")
    assert r.status_code == 200 and r.json()["deleted"]["name"] == unused
    assert (await api.delete(f"/v1/policies/{unused}")).status_code == 404
    assert (await api.get(f"/v1/policies/{unused}")).status_code == 404


async def test_alias_bombs_and_deep_documents_are_refused_with_a_reason_and_store_nothing(
    api: httpx.AsyncClient,
) -> None:
    """A 440-byte YAML alias bomb once cost the API 600 MB and 11 s; a 5,000-deep document was a 500."""
    before = (await api.get("/v1/policies")).json()["policies"]
    bomb = 'name: bomb\nx0: &x0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"x{i}: &x{i} [{','.join([f'*x{i - 1}'] * 10)}]\n" for i in range(1, 8)
    )
    deep_yaml = "name: deep\nx: " + "[" * 5000 + "]" * 5000 + "\n"
    for text, reason in ((bomb, "YAML aliases (*name) are not accepted (line 3)"), (deep_yaml, "deeper than 64")):
        for route, body in (
            ("/v1/policies", {"name": text.split()[1], "yaml": text}),
            ("/v1/policies/validate", {"yaml": text}),
        ):
            r = await api.post(route, json=body)
            assert r.status_code == 422, r.text
            assert reason in r.json()["error"], r.text
    deep_json = '{"content": {"name": "d", "x": ' + '{"x": ' * 5000 + "{}" + "}" * 5000 + "}}"
    r = await api.post("/v1/policies/preview", content=deep_json, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": "invalid request: the JSON body nests too deeply to be parsed",
        "code": "invalid_request",
    }
    assert (await api.get("/v1/policies")).json()["policies"] == before


async def test_validate_and_preview_persist_nothing(api: httpx.AsyncClient) -> None:
    before = (await api.get("/v1/policies")).json()["policies"]
    ok = await api.post("/v1/policies/validate", json={"yaml": "name: draft\ndefaults: {tool_action: deny}\n"})
    assert ok.json() == {"valid": True, "name": "draft"}
    bad = await api.post("/v1/policies/validate", json={"yaml": "name: draft\ndefaults: {tool_acton: deny}\n"})
    assert bad.status_code == 422 and "unknown key 'defaults.tool_acton'" in bad.json()["error"]
    broken = await api.post("/v1/policies/validate", json={"yaml": "name: [unclosed\n"})
    assert broken.status_code == 422 and "not valid YAML" in broken.json()["error"]
    draft = {"name": "draft", "tools": [{"match": ["Bash"], "action": "allow", "shell": {"deny_regex": ["rm"]}}]}
    preview = (await api.post("/v1/policies/preview", json={"content": draft})).json()
    bash = next(r for r in preview["matrix"] if r["tool"] == "Bash")
    assert bash["status"] == {
        "status": "conditional",
        "action": "allow",
        "rule": 0,
        "constraints": {
            "paths_allow": None,
            "paths_deny": None,
            "paths_on_no_match": None,
            "shell_allow_prefixes": [],
            "shell_deny_regex": ["rm"],
            "shell_on_no_match": "approve",
        },
    }
    assert preview["budgets"]["max_tool_calls"] == 100 and preview["defaults"] == {"tool_action": "approve"}
    bad_regex = {"name": "draft", "tools": [{"match": ["Bash"], "action": "allow", "shell": {"deny_regex": ["("]}}]}
    r = await api.post("/v1/policies/preview", json={"content": bad_regex})
    assert r.status_code == 422 and "does not compile" in r.json()["error"]
    assert (await api.get("/v1/policies")).json()["policies"] == before
