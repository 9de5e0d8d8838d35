"""Policies, in process: import, publish under concurrency, revert, clone, delete, validate, preview."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import yaml

from tests.api.admin_helpers import make_agent, unique
from tests.api.conftest import Api

RULES: dict[str, Any] = {
    "defaults": {"tool_action": "approve"},
    "tools": [{"match": ["Read"], "action": "allow"}, {"match": ["Bash"], "action": "deny", "risk": "no shell"}],
}


async def imported(api: httpx.AsyncClient, doc: dict[str, Any] | None = None) -> str:
    name = unique("pol")
    r = await api.post("/v1/policies", json={"name": name, "yaml": yaml.safe_dump({"name": name, **(doc or RULES)})})
    assert r.status_code == 200 and r.json()["appended"] is True, r.text
    return name


async def test_import_is_idempotent_for_identical_content_and_versions_changes(api: Api) -> None:
    name = unique("pol")
    text = yaml.safe_dump({"name": name, **RULES})
    first = (await api.client.post("/v1/policies", json={"name": name, "yaml": text})).json()
    again = (await api.client.post("/v1/policies", json={"name": name, "yaml": text})).json()
    assert (first["policy"]["version"], first["appended"]) == (1, True)
    assert (again["policy"]["version"], again["appended"]) == (1, False)
    changed = yaml.safe_dump({"name": name, **RULES, "approvals": {"default_ttl_secs": 60}})
    third = (await api.client.post("/v1/policies", json={"name": name, "yaml": changed})).json()
    assert (third["policy"]["version"], third["appended"]) == (2, True)
    version = (await api.client.get(f"/v1/policies/{name}/versions/1")).json()
    assert version["yaml"] == text and version["content"]["tools"][1]["risk"] == "no shell"
    listed = {p["name"]: p for p in (await api.client.get("/v1/policies")).json()["policies"]}
    assert listed[name]["version"] == 2 and listed[name]["agents_using"] == 0
    assert listed[name]["autonomy_summary"] == {
        "permitted": True,
        "default_fallback": "deny",
        "allow_overrides": 0,
        "deny_overrides": 0,
    }
    assert {"default", "demo", "standard", "governed", "unrestricted"} <= set(listed)


async def test_policy_detail_shows_versions_users_and_the_matrix(api: Api) -> None:
    name = await imported(api.client)
    agent = await make_agent(api.client, [{"say": "hi"}], policy=name)
    detail = (await api.client.get(f"/v1/policies/{name}")).json()
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
    demo = {r["tool"]: r for r in (await api.client.get("/v1/policies/demo")).json()["matrix"]}
    assert set(demo["Bash"]) == {"tool", "group", "server", "status"}
    status = demo["Bash"]["status"]
    assert (status["status"], status["action"]) == ("conditional", "allow") and isinstance(status["rule"], int)
    assert set(status["constraints"]) == {"paths_allow", "paths_deny", "paths_on_no_match",
                                          "shell_allow_prefixes", "shell_deny_regex", "shell_on_no_match"}  # fmt: skip
    assert status["constraints"]["shell_on_no_match"] == "approve" and status["constraints"]["paths_allow"] is None


async def test_publish_is_optimistic_and_a_retry_cannot_create_two_versions(api: Api) -> None:
    name = await imported(api.client)
    content = {"name": name, **RULES, "defaults": {"tool_action": "deny"}}
    body = {"content": content, "summary": "deny by default", "base_version": 1}
    ok = await api.client.post(f"/v1/policies/{name}/publish", json=body)
    assert ok.status_code == 200 and ok.json()["policy"]["version"] == 2
    retry = await api.client.post(f"/v1/policies/{name}/publish", json=body)
    assert retry.status_code == 409
    assert retry.json()["error"] == (
        "the policy moved to v2 since this draft loaded v1 — reload, re-apply your edit, and publish again"
    )
    detail = (await api.client.get(f"/v1/policies/{name}")).json()
    assert [v["version"] for v in detail["versions"]] == [2, 1]
    assert detail["versions"][0]["summary"] == "deny by default"


async def test_concurrent_publishes_from_the_same_base_yield_exactly_one_version(api: Api) -> None:
    name = await imported(api.client)
    bodies = [
        {"content": {"name": name, **RULES, "approvals": {"default_ttl_secs": 60 + i}}, "summary": f"edit {i}",
         "base_version": 1}
        for i in range(6)
    ]  # fmt: skip
    results = await asyncio.gather(*[api.client.post(f"/v1/policies/{name}/publish", json=b) for b in bodies])
    assert sorted(r.status_code for r in results) == [200, 409, 409, 409, 409, 409]
    assert [v["version"] for v in (await api.client.get(f"/v1/policies/{name}")).json()["versions"]] == [2, 1]


async def test_revert_moves_forward_with_the_old_content(api: Api) -> None:
    name = await imported(api.client)
    v2 = {"name": name, "defaults": {"tool_action": "allow"}}
    await api.client.post(f"/v1/policies/{name}/publish", json={"content": v2, "summary": "open up", "base_version": 1})
    r = await api.client.post(f"/v1/policies/{name}/revert", json={"version": 1, "base_version": 2})
    assert r.status_code == 200 and r.json()["policy"]["version"] == 3
    detail = (await api.client.get(f"/v1/policies/{name}")).json()
    assert detail["content"] == {"name": name, **RULES}
    assert detail["versions"][0]["summary"] == "revert to v1"
    stale = await api.client.post(f"/v1/policies/{name}/revert", json={"version": 1, "base_version": 2})
    assert stale.status_code == 409
    missing = await api.client.post(f"/v1/policies/{name}/revert", json={"version": 9, "base_version": 3})
    assert missing.status_code == 404


async def test_clone_from_a_policy_or_blank_and_its_refusals(api: Api) -> None:
    source = await imported(api.client)
    copy, blank = unique("copy"), unique("blank")
    r = await api.client.post("/v1/policies/clone", json={"name": copy, "from": source})
    assert r.status_code == 200 and r.json()["policy"]["version"] == 1
    detail = (await api.client.get(f"/v1/policies/{copy}")).json()
    assert (
        detail["content"]["tools"] == RULES["tools"]
        and detail["versions"][0]["summary"] == f"cloned from '{source}' v1"
    )
    r = await api.client.post("/v1/policies/clone", json={"name": blank})
    assert r.status_code == 200
    rows = (await api.client.get(f"/v1/policies/{blank}")).json()["matrix"]
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
        r = await api.client.post("/v1/policies/clone", json=body)
        assert r.status_code == status and message in r.json()["error"], (body, r.text)


async def test_delete_is_refused_while_any_revision_names_the_policy(api: Api) -> None:
    used, unused = await imported(api.client), await imported(api.client)
    agent = await make_agent(api.client, [{"say": "hi"}], policy=used)
    await api.client.post(f"/v1/agents/{agent}/revisions", json={"policy": "demo"})
    r = await api.client.delete(f"/v1/policies/{used}")
    assert r.status_code == 409 and "still named by 1 agent revision(s)" in r.json()["error"]
    assert (await api.client.get(f"/v1/policies/{used}")).status_code == 200
    r = await api.client.delete(f"/v1/policies/{unused}")
    assert r.status_code == 200 and r.json()["deleted"]["name"] == unused
    assert (await api.client.delete(f"/v1/policies/{unused}")).status_code == 404
    assert (await api.client.get(f"/v1/policies/{unused}")).status_code == 404


async def test_alias_bombs_and_deep_documents_are_refused_with_a_reason_and_store_nothing(
    api: Api,
) -> None:
    """A 440-byte YAML alias bomb once cost the API 600 MB and 11 s; a 5,000-deep document was a 500."""
    before = (await api.client.get("/v1/policies")).json()["policies"]
    bomb = 'name: bomb\nx0: &x0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"x{i}: &x{i} [{','.join([f'*x{i - 1}'] * 10)}]\n" for i in range(1, 8)
    )
    deep_yaml = "name: deep\nx: " + "[" * 5000 + "]" * 5000 + "\n"
    for text, reason in ((bomb, "YAML aliases (*name) are not accepted (line 3)"), (deep_yaml, "deeper than 64")):
        for route, body in (
            ("/v1/policies", {"name": text.split()[1], "yaml": text}),
            ("/v1/policies/validate", {"yaml": text}),
        ):
            r = await api.client.post(route, json=body)
            assert r.status_code == 422, r.text
            assert reason in r.json()["error"], r.text
    deep_json = '{"content": {"name": "d", "x": ' + '{"x": ' * 5000 + "{}" + "}" * 5000 + "}}"
    r = await api.client.post("/v1/policies/preview", content=deep_json, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": "invalid request: the JSON body nests too deeply to be parsed",
        "code": "invalid_request",
    }
    assert (await api.client.get("/v1/policies")).json()["policies"] == before


async def test_validate_and_preview_persist_nothing(api: Api) -> None:
    before = (await api.client.get("/v1/policies")).json()["policies"]
    ok = await api.client.post("/v1/policies/validate", json={"yaml": "name: draft\ndefaults: {tool_action: deny}\n"})
    assert ok.json() == {"valid": True, "name": "draft"}
    bad = await api.client.post("/v1/policies/validate", json={"yaml": "name: draft\ndefaults: {tool_acton: deny}\n"})
    assert bad.status_code == 422 and "unknown key 'defaults.tool_acton'" in bad.json()["error"]
    broken = await api.client.post("/v1/policies/validate", json={"yaml": "name: [unclosed\n"})
    assert broken.status_code == 422 and "not valid YAML" in broken.json()["error"]
    draft = {"name": "draft", "tools": [{"match": ["Bash"], "action": "allow", "shell": {"deny_regex": ["rm"]}}]}
    preview = (await api.client.post("/v1/policies/preview", json={"content": draft})).json()
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
    r = await api.client.post("/v1/policies/preview", json={"content": bad_regex})
    assert r.status_code == 422 and "does not compile" in r.json()["error"]
    assert (await api.client.get("/v1/policies")).json()["policies"] == before


# Moved from tests/integration/test_api_errors.py: the policies' cases of its bad-request table and of its
# out-of-range numbers (found by the schemathesis pass: a version past PostgreSQL's integer range reached the
# driver, a 500).
TOO_BIG = "Input should be less than or equal to 2147483647"
BAD_REQUESTS: list[tuple[str, str, dict[str, Any] | None, int, str, str]] = [
    ("POST", "/v1/policies", {"name": "p1", "yaml": "name: p1\ntools:\n  - match: [Read]\n    action: allow\n"
                                                      "    colour: red\n"},
     422, "unprocessable", "unknown key 'tools.0.colour'"),
    ("POST", "/v1/policies", {"name": "p2", "yaml": "name: other\n"}, 400, "bad_request",
     "policy name must match yaml `name`"),
    ("POST", "/v1/policies", {"name": "p3"}, 400, "invalid_request", "missing field 'yaml'"),
    ("POST", "/v1/policies", {"name": "validate", "yaml": "name: validate\n"}, 400, "bad_request",
     "reserved by the policies API"),
    ("GET", "/v1/policies/demo/versions/69926590546333499654144", None, 400, "invalid_request", TOO_BIG),
    ("GET", "/v1/policies/demo/versions/2147483648", None, 400, "invalid_request", TOO_BIG),
    ("POST", "/v1/policies/demo/revert", {"version": 2**40, "base_version": 1}, 400, "invalid_request", TOO_BIG),
    ("POST", "/v1/policies/clone", {"name": "c-big", "from": "demo", "from_version": 2**40}, 400, "invalid_request",
     f"from_version: {TOO_BIG}"),
    ("POST", "/v1/policies/demo/publish", {"content": {"name": "demo"}, "base_version": 1}, 400, "bad_request",
     "a publish needs a non-empty summary"),
    ("POST", "/v1/policies/demo/publish", {"content": {"name": "other"}, "summary": "s", "base_version": 1}, 400,
     "bad_request", "the content's `name` must equal the policy being published"),
    ("GET", "/v1/policies/nope", None, 404, "not_found", "not found"),
    ("GET", "/v1/policies/demo/versions/99", None, 404, "not_found", "not found"),
    ("POST", "/v1/policies/preview", {"content": {"name": "d"}, "name": "nope"}, 404, "not_found", "not found"),
]  # fmt: skip


async def test_a_bad_policy_request_gets_a_clear_error_and_changes_nothing(api: Api) -> None:
    before = (await api.client.get("/v1/policies")).json()["policies"]
    for method, path, body, status, code, message in BAD_REQUESTS:
        r = await api.client.request(method, path, json=body)
        assert (r.status_code, r.json()["code"]) == (status, code), (path, body, r.text)
        assert set(r.json()) == {"error", "code"} and message in r.json()["error"], (path, body, r.text)
    assert (await api.client.get("/v1/policies")).json()["policies"] == before


async def test_answers_keep_the_shapes_clients_parse(api: Api) -> None:
    """What the answers' models must keep byte for byte: a field absent when unknown (not null), times as
    ``isoformat()``, the matrix rows of a stored policy without the brokered-tool fields a preview shows null."""
    name = unique("pol")
    imported = (
        await api.client.post("/v1/policies", json={"name": name, "yaml": yaml.safe_dump({"name": name})})
    ).json()
    assert set(imported) == {"policy", "appended"} and imported["policy"]["updated_at"].endswith("+00:00")
    blank = (await api.client.post("/v1/policies/clone", json={"name": unique("blank")})).json()
    assert set(blank["policy"]) == {"id", "name", "version"}, "a policy just created has no updated_at"
    listed = {p["name"]: p for p in (await api.client.get("/v1/policies")).json()["policies"]}
    assert listed[name]["updated_at"] == imported["policy"]["updated_at"]
    detail = (await api.client.get(f"/v1/policies/{name}")).json()
    assert list(detail) == ["autonomy_summary", "defaults", "budgets", "approvals", "egress", "matrix", "policy",
                            "content", "versions", "agents_using"]  # fmt: skip
    assert all(set(row) == {"tool", "group", "server", "status"} for row in detail["matrix"])
    preview = (await api.client.post("/v1/policies/preview", json={"content": {"name": "d"}})).json()
    assert all(row["access"] is None and row["approval"] is None for row in preview["matrix"])
    version = (await api.client.get(f"/v1/policies/{name}/versions/1")).json()
    assert version["policy"] == {"id": imported["policy"]["id"], "name": name}
    assert set(version["version"]) == {"version", "author", "summary", "created_at"}
    assert version["version"]["created_at"].endswith("+00:00") and version["yaml"] == yaml.safe_dump({"name": name})
