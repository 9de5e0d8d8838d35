"""Benchmark trigger invocation (``POST /v1/triggers/{id}/invoke``) against a bare ``POST /v1/sessions``.

Starts the real embedded stack in a temporary home, creates a replay agent and an ``allow``
subscription on it, then stops the worker: both paths end when the run row is committed and its
workflow is started in Temporal, which is what "invoke-to-run-created" means, and no sandbox
competes for the two cores while it is measured (the started workflows simply wait in their queue).

N concurrent clients (one keep-alive ``httpx.AsyncClient`` each) send a fixed number of requests per
round; rounds alternate (sessions, invoke, sessions, invoke, ...) and the medians of the rounds are
reported, because the machine is noisy. Every answer is checked (200, status ``created``, a new
run id; invoke additionally replays one key per client at the end and must get the same run back).

Writes the ``bench:triggers`` section of ``docs/benchmarks.md`` and prints it.

    .venv/bin/python bench/triggers.py [--clients 50] [--requests 4] [--rounds 3] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gate as gb  # noqa: E402
from cli.stack import Stack  # noqa: E402
from db.engine import asyncpg_dsn  # noqa: E402

KINDS = ("sessions", "invoke")


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Check:
    created: int = 0
    replays_ok: int = 0
    errors: list[str] = field(default_factory=list)
    run_ids: set[str] = field(default_factory=set)

    def bad(self, text: str) -> None:
        if len(self.errors) < 10:
            self.errors.append(text)


@dataclass
class Target:
    agent: str
    subscription: str
    token: str


def pct(xs: list[float], q: int) -> float:
    if len(xs) < 2:
        return xs[0] * 1000.0 if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000.0


async def one(kind: str, cl: httpx.AsyncClient, t: Target, check: Check, lat: list[float], key: str) -> None:
    started = time.perf_counter()
    if kind == "sessions":
        r = await cl.post("/v1/sessions", json={"agent": t.agent, "task": f"Handle {key}"})
    else:
        r = await cl.post(
            f"/v1/triggers/{t.subscription}/invoke",
            json={"context": {"n": key}},
            headers={"authorization": f"Bearer {t.token}", "idempotency-key": key},
        )
    lat.append(time.perf_counter() - started)
    if r.status_code != 200:
        check.bad(f"{kind}: {r.status_code} {r.text[:200]}")
        return
    body = r.json()
    run = body["session"] if kind == "sessions" else body
    run_id = run["id"] if kind == "sessions" else run["session_id"]
    if run["status"] != "created" or run_id in check.run_ids or body.get("replay"):
        check.bad(f"{kind}: unexpected answer {str(body)[:200]}")
        return
    check.run_ids.add(run_id)
    check.created += 1


async def run_round(kind: str, clients: list[httpx.AsyncClient], n: int, t: Target, check: Check, tag: str) -> gb.Round:
    rnd = gb.Round(kind)

    async def client(i: int, cl: httpx.AsyncClient) -> None:
        for j in range(n):
            await one(kind, cl, t, check, rnd.latencies, f"{tag}-{i}-{j}")

    started = time.perf_counter()
    await asyncio.gather(*(client(i, cl) for i, cl in enumerate(clients)))
    rnd.wall = time.perf_counter() - started
    return rnd


async def replays(clients: list[httpx.AsyncClient], t: Target, check: Check, tag: str) -> None:
    """The first key of every client again: the same run must come back, marked as a replay."""

    async def again(i: int, cl: httpx.AsyncClient) -> None:
        key = f"{tag}-{i}-0"
        r = await cl.post(
            f"/v1/triggers/{t.subscription}/invoke",
            json={"context": {"n": key}},
            headers={"authorization": f"Bearer {t.token}", "idempotency-key": key},
        )
        if r.status_code == 200 and r.json()["replay"] is True and r.json()["session_id"] in check.run_ids:
            check.replays_ok += 1
        else:
            check.bad(f"replay of {key}: {r.status_code} {r.text[:200]}")

    await asyncio.gather(*(again(i, cl) for i, cl in enumerate(clients)))


async def idle(kind: str, cl: httpx.AsyncClient, t: Target, check: Check, n: int) -> list[float]:
    lat: list[float] = []
    for j in range(n):
        await one(kind, cl, t, check, lat, f"idle-{kind}-{j}-{uuid.uuid4().hex[:6]}")
    return lat


async def count_runs(database_url: str) -> int:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM sessions"))
    finally:
        await conn.close()


@dataclass
class Outcome:
    rounds: list[gb.Round]
    idle: dict[str, list[float]]
    check: Check
    runs_in_db: int


def render(args: argparse.Namespace, out: Outcome) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    by_kind = {k: [r for r in out.rounds if r.kind == k] for k in KINDS}

    def med(kind: str, f: str) -> float:
        rounds = by_kind[kind]
        if f == "rate":
            return statistics.median(r.rate for r in rounds)
        return statistics.median(r.pct(int(f)) for r in rounds)

    s50, i50 = med("sessions", "50"), med("invoke", "50")
    s99, i99 = med("sessions", "99"), med("invoke", "99")
    srate, irate = med("sessions", "rate"), med("invoke", "rate")
    total = len(out.rounds) // 2 * args.clients * args.requests
    lines = [
        "## Trigger invoke vs a bare run creation",
        "",
        f"Run {now}; `nproc` {len(os.sched_getaffinity(0))}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}.",
        "`bench/triggers.py` creates a replay agent and an `allow` subscription (template `Handle {{n}}`), "
        "then **stops the worker**: both paths end when the run row is committed and its workflow started in "
        "Temporal (the run is `created`), and no sandbox competes for the CPUs while this is measured.",
        "",
        "* **sessions**: `POST /v1/sessions` with the admin token (agent lookup, RunSpec freeze, run insert, "
        "workflow start).",
        "* **invoke**: `POST /v1/triggers/{id}/invoke` with the trigger token and a unique `Idempotency-Key` "
        "(token lookup, subscription read, claim check, template render, the same freeze, then the run insert "
        "together with the invocation claim, workflow start). Under `allow` no row lock is taken: the unique "
        "claim index decides between simultaneous uses of one key.",
        "",
        f"{args.clients} concurrent clients (keep-alive), {args.requests} requests each per round, "
        f"{len(out.rounds) // 2} rounds of each kind alternating (sessions first); medians of the rounds. "
        f"Latency is request-to-answer of each call, i.e. invoke-to-run-created.",
        "",
        f"| path | p50 (ms) | p99 (ms) | runs created/s ({args.clients} clients) | idle p50 (ms, 1 client) |",
        "|---|---:|---:|---:|---:|",
        f"| sessions | {s50:.1f} | {s99:.1f} | {srate:.1f} | {pct(out.idle['sessions'], 50):.1f} |",
        f"| invoke | {i50:.1f} | {i99:.1f} | {irate:.1f} | {pct(out.idle['invoke'], 50):.1f} |",
        "",
        f"Invoke against a bare creation: p50 **{i50 / s50:.2f}x** ({i50 - s50:+.1f} ms), p99 {i99 / s99:.2f}x, "
        f"throughput {irate / srate:.2f}x.",
        "",
        f"Correctness: {out.check.created} runs created for {total * 2 + 2 * args.idle} requests, all distinct, "
        f"all `created`; {out.runs_in_db} runs in the database; {out.check.replays_ok} of {args.clients} "
        f"replayed keys returned their original run with `replay: true`; {len(out.check.errors)} errors.",
        "",
        "<details><summary>Per round</summary>",
        "",
        "| round | kind | p50 (ms) | p99 (ms) | runs/s | requests |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for i, rnd in enumerate(out.rounds):
        lines.append(
            f"| {i // 2 + 1} | {rnd.kind} | {rnd.pct(50):.1f} | {rnd.pct(99):.1f} | {rnd.rate:.1f} | {rnd.count} |"
        )
    lines += ["", "</details>"]
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> int:
    stack = Stack.ephemeral("fbxbt-", {"FLUIDBOX_REPLAY_DELAY_MS": "0", "FLUIDBOX_LOG_LEVEL": "WARNING"})
    clients: list[httpx.AsyncClient] = []
    api: httpx.AsyncClient | None = None
    ok = False
    try:
        say(f"• starting the stack in {stack.home}")
        admin = await stack.start()
        api = httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {admin}"}, timeout=60)
        name = f"bench-{uuid.uuid4().hex[:6]}"
        r = await api.post(
            "/v1/agents",
            json={"name": name, "harness": "replay", "policy": "demo", "harness_config": {"script": [{"say": "hi"}]}},
        )
        r.raise_for_status()
        r = await api.post("/v1/triggers", json={"agent": name, "name": name, "task_template": "Handle {{n}}"})
        r.raise_for_status()
        target = Target(agent=name, subscription=r.json()["subscription"]["id"], token=r.json()["token"])
        stack.stop_process("worker")
        say("• worker stopped: measuring run creation only")
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        clients = [
            httpx.AsyncClient(
                base_url=stack.api_url, headers={"authorization": f"Bearer {admin}"}, timeout=60, limits=limits
            )
            for _ in range(args.clients)
        ]
        check = Check()
        warm = await run_round("sessions", clients, 1, target, check, "warm-s")
        warm = await run_round("invoke", clients, 1, target, check, "warm-i")
        del warm
        idle_lat = {k: await idle(k, clients[0], target, check, args.idle) for k in KINDS}
        rounds: list[gb.Round] = []
        for i in range(args.rounds):
            for kind in KINDS:
                rnd = await run_round(kind, clients, args.requests, target, check, f"r{i}-{kind}")
                rounds.append(rnd)
                say(f"  round {i + 1} {kind:8} p50 {rnd.pct(50):7.1f} ms  p99 {rnd.pct(99):7.1f} ms  {rnd.rate:6.1f}/s")
        await replays(clients, target, check, "r0-invoke")
        runs_in_db = await count_runs(stack.database_url or "")
        check.created -= 2 * args.clients  # the warm-up runs are not part of the reported total
        out = Outcome(rounds, idle_lat, check, runs_in_db)
        if check.errors:
            for e in check.errors:
                say(f"ERROR {e}")
            return 1
        gb.publish(render(args, out), "triggers", args.write)
        ok = True
        return 0
    finally:
        for cl in clients:
            await cl.aclose()
        await gb.wind_down(stack, api, [], ok)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Benchmark trigger invoke against a bare POST /v1/sessions.")
    p.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    p.add_argument("--requests", type=int, default=4, help="requests per client per round (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each kind (default 3)")
    p.add_argument("--idle", type=int, default=20, help="sequential single-client requests of each kind (default 20)")
    p.add_argument("--quick", action="store_true", help="a small smoke run that only prints")
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/benchmarks.md")
    args = p.parse_args(argv)
    if args.quick:
        args.clients, args.requests, args.rounds, args.idle, args.write = 8, 2, 1, 5, False
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
