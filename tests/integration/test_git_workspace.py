"""git_repository workspaces: cloned by the control plane, handed to the sandbox as a plain tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx

from tests.integration.helpers import DEMO_REPO, events, make_agent, wait_pending, wait_status


def _repository(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "origin"
    shutil.copytree(DEMO_REPO, repo)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "demo"], ["tag", "v1"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env={**env, "PATH": "/usr/bin:/bin"})
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return repo, head.stdout.strip()


async def test_a_run_works_on_a_cloned_repository_and_its_diff_is_against_the_commit(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    repo, commit = _repository(tmp_path)
    workspace = {"kind": "git_repository", "url": f"file://{repo}", "ref": "v1"}
    r = await api.post("/v1/sessions", json={"agent": await make_agent(api), "task": "t", "workspace": workspace})
    assert r.status_code == 200, r.text
    run_id = r.json()["session"]["id"]
    pending = await wait_pending(api, run_id)
    await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["status"] == "completed", row
    initialized = next(e for e in await events(api, run_id) if e["type"] == "workspace.initialized")
    assert initialized["payload"]["data"]["commit"] == commit
    assert initialized["payload"]["data"]["repository"] == f"file://{repo}"
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert '+    return f"Hello, {name}!"' in out["diff"]
    assert ".git/" not in out["diff"]  # the agent got a plain tree; the baseline is the control plane's
    assert "Hello, name!" in (repo / "app.py").read_text()  # the origin is never touched


async def test_bad_repository_workspaces_are_refused_before_anything_starts(api: httpx.AsyncClient) -> None:
    agent = await make_agent(api)
    for workspace, message in [
        ({"kind": "git_repository"}, "needs a `url`"),
        ({"kind": "git_repository", "url": "http://example.com/r.git"}, "https://"),
        ({"kind": "git_repository", "url": "ssh://git@example.com/r.git"}, "https://"),
        ({"kind": "git_repository", "url": "https://user:pw@example.com/r.git"}, "must not carry credentials"),
        ({"kind": "git_repository", "url": "https://example.com/r.git", "ref": "--upload-pack=x"}, "branch or tag"),
    ]:
        r = await api.post("/v1/sessions", json={"agent": agent, "task": "t", "workspace": workspace})
        assert r.status_code == 400, (workspace, r.text)
        assert message in r.json()["error"], r.text
    agent_id = next(a["id"] for a in (await api.get("/v1/agents")).json()["agents"] if a["name"] == agent)
    listed = (await api.get("/v1/sessions")).json()["sessions"]
    assert not [s for s in listed if s["agent_id"] == agent_id]  # nothing was started


async def test_a_repository_that_cannot_be_cloned_fails_the_run_saying_why(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    r = await api.post(
        "/v1/sessions",
        json={
            "agent": await make_agent(api),
            "task": "t",
            "workspace": {"kind": "git_repository", "url": f"file://{missing}"},
        },
    )
    assert r.status_code == 200, r.text
    row = await wait_status(api, r.json()["session"]["id"], {"failed"})
    assert "cannot clone" in row["status_reason"], row
