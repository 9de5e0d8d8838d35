"""The connector OAuth browser leg in a real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python client through ``executable_path``; no browser download): open the ``go_url``, sign in and approve on the
provider's page, land on our callback page (the ``__Host-`` flow cookie kept from the stack's plain-http loopback
origin), then a run makes a brokered call with the new grant.

Skipped when Chromium or Playwright is absent (``make install`` installs both).
"""

from __future__ import annotations

import shutil

import httpx
import pytest

from tests.integration.helpers import events, make_agent, make_policy, start_run, wait_status
from tests.integration.test_broker import BROKER_POLICY, requirement
from tests.integration.test_oauth_connections import create
from tests.mcp_servers import RunningServer
from tests.oauth_servers import AuthorizationServer

pytestmark = pytest.mark.stack

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.async_api")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (make install)", allow_module_level=True)


async def test_a_person_connects_in_a_real_browser_and_a_run_uses_the_new_grant(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    connection = await create(api, mcp.url)
    r = await api.post(f"/v1/connections/{connection['id']}/oauth/start")
    assert r.status_code == 200, r.text
    async with playwright.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await page.goto(r.json()["go_url"])
            await page.wait_for_url(f"{auth.issuer}/interaction/**")
            await page.fill("input[name=login]", "alice")
            await page.click("button[value=approve]")
            await page.wait_for_url("**/v1/oauth/callback?**")
            await page.get_by_role("heading", name="Connected").wait_for()
            text = await page.content()
            # Kept from plain http on 127.0.0.1: Chromium treats a loopback origin as a secure context.
            kept = {c["name"]: c for c in await page.context.cookies()}
        finally:
            await browser.close()
    assert "protected &lt;calc&gt;" in text
    flow = kept["__Host-fbx_oauth_flow"]
    assert (flow["secure"], flow["httpOnly"], flow["sameSite"], flow["path"]) == (True, True, "Lax", "/")
    row = (await api.get(f"/v1/connections/{connection['id']}")).json()["connection"]
    assert row["status"] == "active"

    agent = await make_agent(
        api, [{"tool": "mcp__calc__add", "input": {"a": 20, "b": 22}}], policy=await make_policy(api, BROKER_POLICY),
        connection_requirements=[requirement(mcp.url, ["add"])],
    )  # fmt: skip
    run_id = await start_run(api, agent)
    await wait_status(api, run_id, {"completed", "failed"})
    said = [e["payload"]["data"]["text"] for e in await events(api, run_id) if e["type"] == "agent.message"]
    assert "mcp__calc__add → 42" in said, said
