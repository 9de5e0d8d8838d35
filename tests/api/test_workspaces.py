"""The runner plane for sandboxes off the worker's host, in process: the one-time bootstrap exchange and the
workspace archives."""

from __future__ import annotations

import gzip
import secrets

from core.contract import WORKSPACE_DIGEST_HEADER
from core.digests import sha256_hex
from core.states import RunStatus
from core.tokens import BOOTSTRAP_AUDIENCE, Audience
from tests.api.conftest import Api
from tests.api.runs_helpers import finish_run, make_agent, run_token, start_run

ARCHIVE = gzip.compress(b"a tar of the workspace")


async def bootstrap_credential(api: Api, run_id: str) -> str:
    tenant = await api.ctx.identity.boot_tenant()
    return await api.ctx.tokens.issue_token(tenant, run_id, BOOTSTRAP_AUDIENCE, 600, secrets.token_hex(16))


async def test_the_bootstrap_credential_is_spent_once_for_the_runs_tokens(api: Api) -> None:
    agent = await make_agent(api)
    run, other = await start_run(api, agent), await start_run(api, agent)
    credential = await bootstrap_credential(api, run["id"])
    async with api.as_token(credential) as pod:
        r = await pod.post(f"/internal/sessions/{run['id']}/bootstrap")
        assert r.status_code == 200, r.text
        tokens = r.json()
        assert set(tokens) == {"control", "tool", "llm", "workspace"}
        again = await pod.post(f"/internal/sessions/{run['id']}/bootstrap")
    assert again.json() == {
        "error": "unauthorized: the bootstrap credential is unknown, expired or already spent",
        "code": "unauthorized",
    }
    # The tokens it answered are the run's own.
    async with api.as_token(tokens["control"]) as control:
        r = await control.post(f"/internal/sessions/{run['id']}/heartbeat")
        assert (r.status_code, r.json()) == (200, {"ok": True, "action": None})
    # Another run's credential is no use here, and a run that ended gets no tokens.
    async with api.as_token(await bootstrap_credential(api, other["id"])) as pod:
        assert (await pod.post(f"/internal/sessions/{run['id']}/bootstrap")).status_code == 404
    await finish_run(api, other["id"], RunStatus.FAILED)
    async with api.as_token(await bootstrap_credential(api, other["id"])) as pod:
        r = await pod.post(f"/internal/sessions/{other['id']}/bootstrap")
    assert (r.status_code, r.json()["code"], r.json()["session_status"]) == (409, "conflict", "failed")


async def test_the_runner_downloads_the_prepared_tree_and_uploads_the_final_one(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    path = f"/internal/sessions/{run['id']}/workspace"
    async with api.as_token(await run_token(api, run["id"], Audience.WORKSPACE)) as runner:
        r = await runner.get(path)
        assert (r.status_code, r.json()["code"]) == (404, "not_found")
        prepared = await api.ctx.archives.put(run["id"], "initial", ARCHIVE)
        r = await runner.get(path)
        assert (r.content, r.headers[WORKSPACE_DIGEST_HEADER]) == (ARCHIVE, prepared.sha256)
        assert r.headers["content-type"] == "application/gzip"

        final = gzip.compress(b"the final tree")
        for headers, content, message in [
            ({}, final, f"missing {WORKSPACE_DIGEST_HEADER}"),
            ({WORKSPACE_DIGEST_HEADER: sha256_hex(b"")}, b"", "empty workspace archive"),
            ({WORKSPACE_DIGEST_HEADER: "0" * 64}, final, "does not match the archive"),
        ]:
            r = await runner.put(path, content=content, headers={"content-type": "application/gzip", **headers})
            assert r.status_code == 400 and message in r.json()["error"], r.text
        assert await api.ctx.archives.get(run["id"], "final") is None
        r = await runner.put(
            path,
            content=final,
            headers={"content-type": "application/octet-stream", WORKSPACE_DIGEST_HEADER: sha256_hex(final)},
        )
        assert r.json() == {"sha256": sha256_hex(final), "size": len(final)}
    stored = await api.ctx.archives.get(run["id"], "final")
    assert stored is not None and stored.data == final
    async with api.as_token(await run_token(api, run["id"], Audience.CONTROL)) as control:
        r = await control.get(path)
        assert (r.status_code, r.content) == (403, b'{"error":"wrong_audience"}')
