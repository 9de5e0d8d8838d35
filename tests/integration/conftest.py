"""One real embedded stack per test session: PostgreSQL, Temporal dev server, worker and API.

Timings are shortened through the same settings an operator would use (heartbeat, liveness, quiesce),
so faults surface in seconds; nothing is mocked.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from cli.stack import Stack, admin_token
from tests.llm_upstream import Upstream, running_upstream, text

FAST = {
    "FLUIDBOX_REPLAY_DELAY_MS": "0",
    "FLUIDBOX_HEARTBEAT_SECS": "0.5",
    "FLUIDBOX_HEARTBEAT_STALE_SECS": "10",
    "FLUIDBOX_LIVENESS_CHECK_SECS": "0.5",
    "FLUIDBOX_QUIESCE_SECS": "5",
    "FLUIDBOX_APPROVAL_RECHECK_SECS": "1",
    "FLUIDBOX_LOG_LEVEL": "WARNING",
    # A fresh credential key per test session; MCP servers started by the tests live on loopback.
    "FLUIDBOX_CREDENTIAL_KEY": secrets.token_hex(32),
    "FLUIDBOX_ALLOW_LOOPBACK_CONNECTORS": "true",
    "FLUIDBOX_ALLOW_LOOPBACK_CALLBACKS": "true",
    "FLUIDBOX_STRANDED_AFTER_SECS": "3",
    "FLUIDBOX_STRANDED_CHECK_SECS": "0.5",
    # Runs move to a fresh workflow history every 3 updates, so every test with several approvals or
    # brokered calls also proves that a move changes nothing a user can see (production: 1500).
    "FLUIDBOX_RUN_MOVE_AFTER_UPDATES": "3",
    # Finished runs' directories stay for the session (tests read workspaces and sandbox logs afterwards);
    # production removes them at finalization (tests/activities/test_rundirs.py).
    "FLUIDBOX_RUN_DIR_RETENTION_SECS": "3600",
    # A connection's credential configured from the environment (``credential_env``), present in API and worker.
    "PARKTEST_MCP_TOKEN": "env-" + secrets.token_hex(16),
}


# The real upstream credential of this test session: only the API process may ever hold it.
LLM_UPSTREAM_KEY = "sk-ant-upstream-" + secrets.token_hex(20)
# What a LiteLLM proxy in front of the upstream would present on its usage callback (/internal/llm-usage).
LITELLM_MASTER_KEY = "sk-litellm-" + secrets.token_hex(20)


@pytest.fixture(scope="session")
def llm_upstream_server() -> Iterator[Upstream]:
    """The scripted LLM upstream (tests/llm_upstream.py); it runs before the stack starts."""
    with running_upstream() as up:
        yield up


@pytest.fixture
def llm_upstream(llm_upstream_server: Upstream) -> Upstream:
    """The session's upstream with an empty queue, no recorded requests and the default text turn."""
    llm_upstream_server.clear()
    llm_upstream_server.default = text("ok")
    llm_upstream_server.rearm()
    return llm_upstream_server


@pytest.fixture(scope="session")
async def stack(llm_upstream_server: Upstream) -> AsyncIterator[Stack]:
    env = {
        **FAST,
        "FLUIDBOX_LLM_UPSTREAM_URL": llm_upstream_server.url,
        "FLUIDBOX_LLM_UPSTREAM_KEY": LLM_UPSTREAM_KEY,
        "FLUIDBOX_LLM_SWEEP_SECS": "0.5",
        "LITELLM_MASTER_KEY": LITELLM_MASTER_KEY,
    }
    st = Stack.ephemeral("fbxt-", env)
    try:
        await st.start()
        yield st
    finally:
        st.stop()
        shutil.rmtree(st.home, ignore_errors=True)


@pytest.fixture(scope="session")
def admin(stack: Stack) -> str:
    return admin_token(stack.home)[0]


@pytest.fixture
async def api(stack: Stack, admin: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=stack.api_url, headers={"authorization": f"Bearer {admin}"}, timeout=60
    ) as client:
        yield client
