"""git_repository workspaces: cloned by the control plane, handed to the sandbox as a plain tree."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities import workspace as ws
from cli.stack import Stack
from integrations.urls import UrlPolicy
from tests.git_server import bare_repository, git_http_server
from tests.integration.helpers import DEMO_REPO, events, make_agent, make_policy, wait_pending, wait_status
from tests.integration.test_identity import add_user, as_user, mint


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


# ---- private repositories: a sealed `git` connection, used only by the control plane's clone -----------------

BASH_ALLOWED: dict[str, Any] = {"defaults": {"tool_action": "deny"}, "tools": [{"match": ["Bash"], "action": "allow"}]}
SECRET_NOTES = "only readers of the private repository see this line\n"


async def git_connection(api: httpx.AsyncClient, base_url: str, token: str, **extra: Any) -> httpx.Response:
    body = {"transport": "git", "base_url": base_url, "token": token, "scheme": "Basic", **extra}
    return await api.post("/v1/connections", json=body)


async def test_a_private_repository_is_cloned_with_its_sealed_credential_which_reaches_nothing_else(
    api: httpx.AsyncClient, stack: Stack, tmp_path: Path
) -> None:
    canary = "canary-" + secrets.token_hex(16)
    credential = f"alice:{canary}"
    header = "Basic " + base64.b64encode(credential.encode()).decode()
    commit = bare_repository(tmp_path, "private", {"secret-notes.md": SECRET_NOTES, "app.py": "print('hi')\n"})
    with git_http_server(tmp_path, credential) as server:
        created = await git_connection(api, server.url, credential, display_name="private git")
        assert created.status_code == 200, created.text
        cid = created.json()["connection"]["id"]
        assert created.json()["connection"]["transport"] == "git"
        script = [
            {
                "tool": "Bash",
                "input": {"command": "cat secret-notes.md > seen.txt; env > sandbox-env.txt; ls -a > listing.txt"},
            }
        ]
        agent = await make_agent(api, script, policy=await make_policy(api, BASH_ALLOWED))
        url = f"{server.url}/private.git"
        workspace = {"kind": "git_repository", "url": url, "ref": "main", "credential": cid}
        r = await api.post("/v1/sessions", json={"agent": agent, "task": "t", "workspace": workspace})
        assert r.status_code == 200, r.text
        run_id = r.json()["session"]["id"]
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["status"] == "completed", row
        assert header in server.seen_authorization and server.authorized, "the clone authenticated with the connection"
    evs = await events(api, run_id)
    initialized = next(e for e in evs if e["type"] == "workspace.initialized")["payload"]["data"]
    assert (initialized["commit"], initialized["repository"], initialized["credential"]) == (commit, url, cid)
    assert row["run_spec"]["workspace"]["credential"] == cid  # the RunSpec names the connection, not the secret
    diff = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()["diff"]
    assert "+" + SECRET_NOTES.strip() in diff, "the sandbox read the private repository's files"
    assert "+PATH=" in diff, "the environment the agent's commands get in the sandbox was captured"
    assert "+.git" not in diff.replace("+.gitignore", ""), "the sandbox got a plain tree, no .git (no config)"
    run_dir = stack.home / "runs" / run_id
    on_disk = [p for p in run_dir.rglob("*") if p.is_file()]
    assert (run_dir / "workspace" / "seen.txt").read_text() == SECRET_NOTES
    listed = (await api.get("/v1/connections")).text
    detail = (await api.get(f"/v1/connections/{cid}")).text
    logs = "".join(p.read_text(errors="replace") for p in Path(stack.logs).glob("*.log"))
    for needle in (canary, base64.b64encode(credential.encode()).decode()):
        for text in (diff, json.dumps(evs), json.dumps(row), listed, detail, logs):
            assert needle not in text
        for path in on_disk:  # the workspace, the sandbox's log and environment dump, the baseline repository
            assert needle.encode() not in path.read_bytes(), path


async def test_a_credential_the_remote_refuses_fails_the_run_naming_the_repository_not_the_secret(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    bare_repository(tmp_path, "private", {"README.md": "private\n"})
    wrong, right = "alice:wrong-" + secrets.token_hex(8), "alice:right-" + secrets.token_hex(8)
    with git_http_server(tmp_path, right) as server:
        created = await git_connection(api, server.url, wrong)
        assert created.status_code == 200, created.text
        cid = created.json()["connection"]["id"]
        url = f"{server.url}/private.git"
        body = {
            "agent": await make_agent(api),
            "task": "t",
            "workspace": {"kind": "git_repository", "url": url, "credential": cid},
        }
        r = await api.post("/v1/sessions", json=body)
        assert r.status_code == 200, r.text
        row = await wait_status(api, r.json()["session"]["id"], {"failed"})
        assert server.refused and not server.authorized
        # The owner replaces the token: the next run clones and its sandbox starts.
        replaced = await api.put(f"/v1/connections/{cid}/credential", json={"token": right})
        assert replaced.status_code == 200, replaced.text
        again = await api.post("/v1/sessions", json=body)
        assert again.status_code == 200, again.text
        cloned = await wait_status(api, again.json()["session"]["id"], {"running", "completed", "failed"})
        assert cloned["status_reason"] is None or "cannot clone" not in cloned["status_reason"], cloned
        assert server.authorized
        await api.post(f"/v1/sessions/{again.json()['session']['id']}/cancel")
        # A revoked credential is refused before a run is created.
        assert (await api.post(f"/v1/connections/{cid}/revoke")).status_code == 200
        revoked = await api.post("/v1/sessions", json=body)
        assert revoked.status_code == 422 and "is revoked" in revoked.json()["error"], revoked.text
    reason = row["status_reason"]
    assert f"cannot clone {url}: the remote refused the stored credential" in reason, row
    assert wrong not in reason and wrong.split(":")[1] not in json.dumps(row)


async def test_private_repository_mistakes_are_refused_before_anything_starts(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    base = "http://127.0.0.1:9/team"
    org = (await git_connection(api, base, "bot:tok")).json()["connection"]["id"]
    alice, bob = await add_user(stack), await add_user(stack)
    async with as_user(stack, await mint(stack, alice["email"])) as a:
        personal = await git_connection(a, base, "alice:tok", owner="personal")
        assert personal.status_code == 200, personal.text
    alices = personal.json()["connection"]["id"]
    agent = await make_agent(api)
    cases: list[tuple[httpx.AsyncClient | None, dict[str, Any], int, str]] = [
        (None, {"url": f"{base}/app.git", "credential": str(uuid.uuid4())}, 400, "unknown git credential"),
        (
            None,
            {"url": "https://git.example.com/team/app.git", "credential": org},
            400,
            f"for repositories under {base}",
        ),
        (None, {"url": f"{base}-other/app.git", "credential": org}, 400, "for repositories under"),
        (None, {"url": "https://bot:tok@git.example.com/app.git"}, 400, "must not carry credentials"),
        (None, {"url": "http://git.example.com/app.git", "credential": org}, 400, "https://"),
        (None, {"url": f"file://{DEMO_REPO}", "credential": org}, 400, "takes no `credential`"),
        (None, {"url": f"{base}/app.git", "credential": alices}, 403, "personal connection"),  # the operator
        (bob, {"url": f"{base}/app.git", "credential": alices}, 403, "personal connection"),
    ]
    for who, fields, status, message in cases:
        workspace = {"kind": "git_repository", **fields}
        body = {"agent": agent, "task": "t", "workspace": workspace}
        if who is None:
            r = await api.post("/v1/sessions", json=body)
        else:
            async with as_user(stack, await mint(stack, who["email"])) as client:
                r = await client.post("/v1/sessions", json=body)
        assert r.status_code == status, (fields, r.text)
        assert message in r.json()["error"], (fields, r.text)
    for base_url, token, message in [
        ("ssh://git@git.example.com/team", "bot:tok", "https:// prefix"),
        ("http://git.example.com/team", "bot:tok", "plain http only for a loopback"),
        ("https://git.example.com/team", "no-colon", "must be `user:token`"),
    ]:
        r = await git_connection(api, base_url, token)
        assert r.status_code == 400 and message in r.json()["error"], r.text
    agent_id = next(a["id"] for a in (await api.get("/v1/agents")).json()["agents"] if a["name"] == agent)
    assert not [s for s in (await api.get("/v1/sessions")).json()["sessions"] if s["agent_id"] == agent_id]


# ---- where a clone may connect: only the addresses admission vetted, and never a redirect's ---------------------


@pytest.mark.parametrize(
    ("vetted_at", "credential"),
    [("127.0.0.2", None), ("127.0.0.2", "alice:pin-" + secrets.token_hex(8)), ("::1", None)],
)
async def test_a_clone_connects_to_the_address_admission_vetted_never_to_a_fresh_resolution(
    tmp_path: Path, vetted_at: str, credential: str | None
) -> None:
    """Admission resolves ``localhost`` to ``vetted_at`` (its injected resolver plays the DNS answer it vetted;
    ``::1`` shows an IPv6 address pinned in curl's bracketed form); the system resolver would answer 127.0.0.1 on
    a second lookup, where a decoy serves another repository on the same port. The clone must get the vetted
    server's commit and the decoy must see no request at all."""
    commit = bare_repository(tmp_path / "vetted", "app", {"README.md": "the vetted server\n"})
    bare_repository(tmp_path / "decoy", "app", {"README.md": "the decoy\n"})
    with contextlib.ExitStack() as stack:
        for _ in range(5):  # the vetted address's free port may be taken on 127.0.0.1: try another
            vetted = stack.enter_context(git_http_server(tmp_path / "vetted", credential, host=vetted_at))
            port = int(vetted.url.rsplit(":", 1)[1])
            try:
                decoy = stack.enter_context(
                    git_http_server(tmp_path / "decoy", credential, host="127.0.0.1", port=port)
                )
                break
            except OSError:
                continue
        else:
            raise AssertionError(f"no port free on both {vetted_at} and 127.0.0.1")
        policy = UrlPolicy(allow_loopback=True, resolver=lambda host, _port: [vetted_at])
        auth = ws.GitAuth("Basic", credential) if credential else None
        got = await ws.fetch(f"http://localhost:{port}/app.git", "main", tmp_path / "clone", policy, auth)
        assert got == commit
        assert (tmp_path / "clone" / "README.md").read_text() == "the vetted server\n"
        assert vetted.requests and not decoy.requests, decoy.requests


@pytest.mark.parametrize("credential", [None, "alice:redirect-" + secrets.token_hex(8)])
async def test_a_clone_never_follows_a_redirect_with_or_without_a_credential(
    tmp_path: Path, credential: str | None
) -> None:
    """The admitted server answers 302 to a second address that would serve the repository (a stand-in for the
    metadata address): the clone fails saying the redirect is not followed, and the second address sees nothing."""
    bare_repository(tmp_path, "app", {"README.md": "elsewhere\n"})
    with (
        git_http_server(tmp_path, None, host="127.0.0.3") as elsewhere,
        git_http_server(tmp_path, credential, redirect_to=elsewhere.url) as redirecting,
    ):
        url = f"{redirecting.url}/app.git"
        auth = ws.GitAuth("Basic", credential) if credential else None
        with pytest.raises(ws.WorkspaceError) as err:
            await ws.fetch(url, None, tmp_path / "clone", UrlPolicy(allow_loopback=True), auth)
        assert redirecting.requests, "the admitted server was asked"
        assert not elsewhere.requests, "the redirect was followed"
    assert str(err.value) == (
        f"cannot clone {url}: the server answered with a redirect (HTTP 302), which is never followed; "
        "give the repository's final URL"
    )
    assert not (tmp_path / "clone").exists()


async def test_an_http_repository_is_never_cloned_without_its_admission(tmp_path: Path) -> None:
    with pytest.raises(ws.WorkspaceError, match="cloned only pinned to its admission"):
        await ws.clone("http://127.0.0.1:9/app.git", None, tmp_path / "clone")
    other = await UrlPolicy(allow_loopback=True).admit("http://127.0.0.1:9/other.git")
    with pytest.raises(ws.WorkspaceError, match="cloned only pinned to its admission"):
        await ws.clone("http://127.0.0.1:9/app.git", None, tmp_path / "clone", admitted=other)
