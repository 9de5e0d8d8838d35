"""Benchmark the resume of a parked brokered call against an approval wake, on the same stack.

Starts the real embedded stack and a real MCP server (tests/mcp_servers.py) in this process. Each round
runs two replay agents whose script is ``Bash`` (needs approval) then ``mcp__calc__echo``:

* **approval wake** (baseline): the connection is usable; the clock starts when the approval decision is
  posted and stops when the echo reaches the MCP server (decision CAS → signal → workflow → the runner's
  held ``/permission`` answers → the brokered call).
* **parked resume**: the connection is revoked while the approval waits, the decision is posted, the echo
  parks (``waiting_for_connection``); the clock starts when ``PUT /v1/connections/{id}/credential`` is sent
  and stops when the parked echo reaches the MCP server (photograph with the new credential → commit →
  ``connection_ready`` signal → ``try_unpark`` → the claimed call). The PUT's photograph (one MCP
  session + tools/list) is inside the figure.

The re-check timer is set long (60 s), so only the signal path is measured. Reports p50 of each and
their ratio; writes the ``bench:parked`` section of ``docs/benchmarks.md``.

    .venv/bin/python bench/parked.py [--rounds 8] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gate as gb  # noqa: E402
from bench.gate import say  # noqa: E402
from cli.stack import Stack  # noqa: E402
from tests.mcp_servers import RunningServer, basic, serve  # noqa: E402

POLICY = (
    "defaults: {tool_action: deny}\ntools:\n- {match: ['mcp__*'], action: allow}\n- {match: [Bash], action: approve}\n"
)


async def until(check: Any, within: float = 60.0, pause: float = 0.002) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise gb.BenchError("timed out")
        await asyncio.sleep(pause)


def echoes(srv: RunningServer, text: str) -> int:
    return sum(1 for tool, args in srv.recorder.calls if tool == "echo" and args.get("text") == text)


async def status(api: httpx.AsyncClient, run_id: str) -> str:
    return str((await api.get(f"/v1/sessions/{run_id}")).json()["session"]["status"])


async def pending(api: httpx.AsyncClient, run_id: str) -> str:
    found: list[str] = []

    async def check() -> bool:
        rows = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
        found[:] = [r["id"] for r in rows if r["status"] == "pending"]
        return bool(found)

    await until(check, pause=0.05)
    return found[0]


async def one_round(api: httpx.AsyncClient, srv: RunningServer, agent: str, n: int) -> tuple[float, float]:
    conn = (await api.post("/v1/connections", json={"provider": "mcp_http", "base_url": srv.url, "token": "t"})).json()[
        "connection"
    ]["id"]
    body = {"agent": agent, "task": "t"}
    # Baseline: an approval wake before a brokered call.
    base_run = (await api.post("/v1/sessions", json=body)).json()["session"]["id"]
    approval = await pending(api, base_run)
    text = f"r{n}"
    started = time.perf_counter()
    await api.post(f"/v1/approvals/{approval}/decision", json={"decision": "deny"})
    await until(lambda: _true(echoes(srv, text) >= 1))
    approval_wake = time.perf_counter() - started
    # Parked: the connection is revoked while the approval waits; the echo parks.
    park_run = (await api.post("/v1/sessions", json=body)).json()["session"]["id"]
    approval = await pending(api, park_run)
    await api.post(f"/v1/connections/{conn}/revoke")
    await api.post(f"/v1/approvals/{approval}/decision", json={"decision": "deny"})

    async def parked() -> bool:
        return await status(api, park_run) == "waiting_for_connection"

    await until(parked, pause=0.05)
    before = echoes(srv, text)
    started = time.perf_counter()
    await api.put(f"/v1/connections/{conn}/credential", json={"token": "t2"})
    await until(lambda: _true(echoes(srv, text) > before))
    resume = time.perf_counter() - started
    for run_id in (base_run, park_run):

        async def done(run_id: str = run_id) -> bool:
            return await status(api, run_id) in ("completed", "failed")

        await until(done, pause=0.1)
    if echoes(srv, text) != 2:
        raise gb.BenchError(f"round {n}: expected one echo per run, saw {echoes(srv, text)}")
    await api.post(f"/v1/connections/{conn}/revoke")  # the next round's runs bind a fresh connection
    return approval_wake, resume


async def _true(value: bool) -> bool:
    return value


async def bench(args: argparse.Namespace) -> int:
    env = {
        "FLUIDBOX_REPLAY_DELAY_MS": "0",
        "FLUIDBOX_CREDENTIAL_KEY": secrets.token_hex(32),
        "FLUIDBOX_ALLOW_LOOPBACK_CONNECTORS": "true",
        "FLUIDBOX_APPROVAL_RECHECK_SECS": "60",
    }
    stack = Stack.ephemeral("fbxb-", env)
    ok = False
    api: httpx.AsyncClient | None = None
    try:
        token = await stack.start()
        api = httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=120)
        name = f"bench-parked-{secrets.token_hex(3)}"
        await api.post("/v1/policies", json={"name": name, "yaml": f"name: {name}\n{POLICY}"})
        waits: list[float] = []
        resumes: list[float] = []
        async with serve(basic()) as srv:
            for n in range(args.rounds):
                script = [
                    {"tool": "Bash", "input": {"command": "x"}},
                    {"tool": "mcp__calc__echo", "input": {"text": f"r{n}"}},
                ]
                agent = f"bench-parked-{n}-{secrets.token_hex(3)}"
                r = await api.post(
                    "/v1/agents",
                    json={
                        "name": agent, "harness": "replay", "policy": name, "harness_config": {"script": script},
                        "connection_requirements": [
                            {"slot": "calc", "connector": {"url": srv.url}, "required_tools": ["echo"]}
                        ],
                    },
                )  # fmt: skip
                if r.status_code != 200:
                    raise gb.BenchError(f"agent: {r.text[:300]}")
                wake, resume = await one_round(api, srv, agent, n)
                waits.append(wake)
                resumes.append(resume)
                say(f"  round {n}: approval wake {wake * 1000:.0f} ms, parked resume {resume * 1000:.0f} ms")
        ok = True
    finally:
        if api is not None:
            await api.aclose()
        stack.stop()
    p50_wake, p50_resume = statistics.median(waits), statistics.median(resumes)
    section = "\n".join(
        [
            "## A parked brokered call resuming vs an approval wake (`bench/parked.py`)",
            "",
            f"{dt.date.today().isoformat()}, {platform.machine()}, {args.rounds} rounds on one embedded stack; "
            "a real MCP server in the benchmark process. Both clocks stop when the brokered echo reaches the "
            "MCP server. The approval wake starts at the decision POST; the parked resume at the "
            "`PUT /v1/connections/{id}/credential` that makes the connection usable again (its photograph "
            "of the server is included). The re-check timer is 60 s, so both are the signal path.",
            "",
            "| path | p50 | min | max |",
            "|---|---|---|---|",
            f"| approval wake → call reaches the server (baseline) | {p50_wake * 1000:.0f} ms | "
            f"{min(waits) * 1000:.0f} ms | {max(waits) * 1000:.0f} ms |",
            f"| connection usable → parked call reaches the server | {p50_resume * 1000:.0f} ms | "
            f"{min(resumes) * 1000:.0f} ms | {max(resumes) * 1000:.0f} ms |",
            "",
            f"**Parked resume p50 = {p50_resume / p50_wake:.2f}× the approval wake p50.**",
        ]
    )
    gb.publish(section, "parked", args.write)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/benchmarks.md")
    return asyncio.run(bench(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
