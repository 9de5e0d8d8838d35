"""Benchmark the scaled-out control plane: two API processes and two workers on one PostgreSQL and one Temporal.

Starts the real embedded stack in a temporary home with ``api_processes=2`` and ``worker_processes=2``
(replay delay 0), and a replay agent whose one step (``echo ok``) needs an approval. In one run of the stack:

1. **approval wake, one replica vs across replicas**: runs wait on their approval; for each, a runner-side
   ``/permission`` for the held tool call is sent to API A (where the sandboxes' gateway is), then the
   decision is posted either to A itself or to API B, alternating. A wake is the time from sending the
   decision to the held ``/permission`` answering ``allow`` (client clock). Same runs, same stack, interleaved;
   the figure is the ratio of the p50s (across / same).
2. **decisions per second, one API vs two**: N runs wait at once; all N decisions are posted by 20 concurrent
   clients to API A only, or (on N fresh runs) spread over A and B; the phases alternate, each after the runs
   of the one before completed. Reported, no target: on a 2-core machine
   the API processes, PostgreSQL, Temporal and the workers share the same two cores.

Writes the ``bench:scale-out`` section of ``docs/benchmarks.md`` and prints it.

    .venv/bin/python bench/scale_out.py [--wakes 20] [--decisions 30] [--rounds 2] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gate as gb  # noqa: E402
from cli.stack import Stack, admin_token  # noqa: E402

CLIENTS = 20
WARMUP = 4  # wakes not counted: two through each API first
POLICY = "name: {name}\ndefaults:\n  tool_action: approve\n"
STEP = {"tool": "Bash", "input": {"command": "echo ok"}}
HELD = {"tool_call_id": "rp_001", "tool": "Bash", "input": {"command": "echo ok"}}


def say(text: str) -> None:
    print(text, flush=True)


def pct(xs: list[float], q: int) -> float:
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


async def make_agent(api: httpx.AsyncClient) -> str:
    name = f"bench-scale-out-{os.getpid()}"
    r = await api.post("/v1/policies", json={"name": name, "yaml": POLICY.format(name=name)})
    r.raise_for_status()
    body = {"name": name, "harness": "replay", "policy": name, "harness_config": {"script": [STEP]}}
    r = await api.post("/v1/agents", json=body)
    r.raise_for_status()
    return name


async def start_waiting(api: httpx.AsyncClient, agent: str, count: int) -> dict[str, str]:
    """Start ``count`` runs and return run id → its pending approval id once every one waits."""
    sem = asyncio.Semaphore(CLIENTS)

    async def one() -> str:
        async with sem:
            r = await api.post("/v1/sessions", json={"agent": agent, "task": "bench"})
            r.raise_for_status()
            return str(r.json()["session"]["id"])

    ids = await asyncio.gather(*(one() for _ in range(count)))
    deadline = time.monotonic() + 300
    while True:
        r = await api.get("/v1/approvals")
        r.raise_for_status()
        pending = {str(a["session_id"]): str(a["id"]) for a in r.json()["approvals"]}
        if all(i in pending for i in ids):
            return {i: pending[i] for i in ids}
        if time.monotonic() > deadline:
            raise gb.BenchError(f"only {sum(i in pending for i in ids)} of {count} runs waited on an approval")
        await asyncio.sleep(0.2)


async def wake(
    stack: Stack, deciders: list[httpx.AsyncClient], run_id: str, approval: str, via: int
) -> tuple[float, float]:
    """Seconds from sending the decision (to API ``via``) to the /permission held on API A answering, and to the
    decision's own answer."""
    from tests.integration.helpers import issue_token

    token = await issue_token(stack.database_url or "", run_id, "tool")
    async with httpx.AsyncClient(
        base_url=stack.api_urls[0], headers={"authorization": f"Bearer {token}"}, timeout=60
    ) as runner:
        held = asyncio.create_task(runner.post(f"/internal/sessions/{run_id}/permission", json=HELD))
        await asyncio.sleep(0.2)  # the held call reaches its wait before the decision is sent
        if held.done():
            raise gb.BenchError(f"the held /permission of {run_id} answered before the decision: {held.result().text}")
        started = time.perf_counter()
        decided: list[float] = []

        async def decide() -> None:
            r = await deciders[via].post(f"/v1/approvals/{approval}/decision", json={"decision": "approve"})
            r.raise_for_status()
            decided.append(time.perf_counter() - started)

        decision = asyncio.create_task(decide())
        answer = await held
        took = time.perf_counter() - started
        await decision
    if answer.json() != {"decision": "allow"}:
        raise gb.BenchError(f"the held /permission of {run_id} answered {answer.text}")
    return took, decided[0]


async def decide_all(deciders: list[httpx.AsyncClient], approvals: list[str]) -> float:
    """Decisions per second: every approval decided by CLIENTS concurrent clients, round-robin over ``deciders``."""
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for n, approval in enumerate(approvals):
        queue.put_nowait((n, approval))

    async def client() -> None:
        while not queue.empty():
            n, approval = queue.get_nowait()
            r = await deciders[n % len(deciders)].post(
                f"/v1/approvals/{approval}/decision", json={"decision": "approve"}
            )
            r.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return len(approvals) / (time.perf_counter() - started)


async def wait_done(api: httpx.AsyncClient, ids: list[str]) -> int:
    deadline = time.monotonic() + 300
    while True:
        rows = [(await api.get(f"/v1/sessions/{i}")).json()["session"]["status"] for i in ids]
        if (
            all(s in ("completed", "failed", "cancelled", "budget_exceeded") for s in rows)
            or time.monotonic() > deadline
        ):
            return rows.count("completed")
        await asyncio.sleep(0.5)


def row(label: str, xs: list[float], answered: list[float]) -> str:
    ms = [f"{v * 1000:.0f} ms" for v in (pct(xs, 50), pct(xs, 90), max(xs), pct(answered, 50))]
    return f"| {label} | {' | '.join(ms)} |"


def section(
    args: argparse.Namespace,
    same: list[float],
    across: list[float],
    posted: tuple[list[float], list[float]],
    load: float,
    rates: dict[int, list[float]],
) -> str:
    one, two = statistics.mean(rates[1]), statistics.mean(rates[2])
    ratio = pct(across, 50) / pct(same, 50)
    lines = [
        "## Scaled-out control plane: two APIs and two workers (`bench/scale_out.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        "one embedded stack (real PostgreSQL, Temporal dev server, bwrap sandboxes) with **2 API processes and 2 "
        "workers**, replay delay 0. The machine was shared with other engineers' work, so absolute times are "
        "indicative; the ratios come from the same run.",
        "",
        "**Approval wake, across replicas vs on one replica.** A run waits on its approval; a `/permission` for the "
        "held tool call is sent to API A (the sandboxes' gateway); the decision is posted to API A itself or to "
        f"API B, alternating ({len(same)} + {len(across)} runs, after {WARMUP} not counted). "
        "Wake = decision sent → held `/permission` answers "
        "(client clock).",
        "",
        "| decision posted to | wake p50 | wake p90 | wake max | the decision's own answer, p50 |",
        "|---|---|---|---|---|",
        row("API A (same replica)", same, posted[0]),
        row("API B (across replicas)", across, posted[1]),
        "",
        f"The machine's 1-minute load average was {load:.1f} on {os.cpu_count()} cores when the wakes were measured.",
        "",
        f"**p50 across / same: {ratio:.2f}×.** Both paths are the same mechanism: the decision's compare-and-swap "
        "commits `approval.decided`, PostgreSQL's NOTIFY reaches every API process's LISTEN connection, and the held "
        "call re-reads its approval row (the workflow's update answers too, whichever is first). No replica "
        "forwards to another. What differs is how many processes sit on the critical path: across replicas B "
        "commits the decision and A answers the held call; on one replica A does both in one event loop. On a machine "
        "this loaded, expect the ratio to move by tens of percent from one run to the next."
        + (
            " The held call answers before the decision's own response, which also waits for the Temporal signal."
            if pct(same + across, 50) < pct(posted[0] + posted[1], 50)
            else ""
        ),
        "",
        f"**Decisions per second, one API vs two** ({args.decisions} waiting runs per phase, {CLIENTS} concurrent "
        f"clients, {args.rounds} phases each, alternating, each after the previous phase's runs completed; report "
        "only, no target on 2 cores):",
        "",
        "| decisions posted to | decisions/s (mean) | per phase |",
        "|---|---|---|",
        f"| API A only | {one:.1f} | {', '.join(f'{r:.1f}' for r in rates[1])} |",
        f"| API A and B, round-robin | {two:.1f} | {', '.join(f'{r:.1f}' for r in rates[2])} |",
        "",
        f"Two APIs / one: **{two / one:.2f}×**. A decision is a row lock and compare-and-swap in PostgreSQL plus a "
        "Temporal signal; a second API process adds a second event loop for the HTTP, auth and signal work, on the "
        "same two cores that PostgreSQL, Temporal, the workers and the woken sandboxes use, so this figure says "
        "little about a deployment where each replica has cores of its own.",
    ]
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> int:
    stack = Stack.ephemeral("fbxo-", {"FLUIDBOX_REPLAY_DELAY_MS": "0"})
    stack.api_processes = 2
    stack.worker_processes = 2
    api: httpx.AsyncClient | None = None
    ids: list[str] = []
    ok = False
    try:
        say("• starting the stack (2 APIs, 2 workers)")
        await stack.start()
        token = admin_token(stack.home)[0]
        headers = {"authorization": f"Bearer {token}"}
        api = httpx.AsyncClient(base_url=stack.api_urls[0], headers=headers, timeout=60)
        b = httpx.AsyncClient(base_url=stack.api_urls[1], headers=headers, timeout=60)
        deciders = [api, b]
        agent = await make_agent(api)

        say(f"• approval wake: {args.wakes} runs, decisions alternating between API A and API B")
        waiting = await start_waiting(api, agent, args.wakes + WARMUP)
        ids += list(waiting)
        same: list[float] = []
        across: list[float] = []
        posted: tuple[list[float], list[float]] = ([], [])
        load = os.getloadavg()[0]
        for n, (run_id, approval) in enumerate(waiting.items()):
            took, answered = await wake(stack, deciders, run_id, approval, n % 2)
            if n >= WARMUP:  # the first decisions through each API open its pools and its Temporal client
                (same if n % 2 == 0 else across).append(took)
                posted[n % 2].append(answered)

        completed = await wait_done(api, ids)
        # Phases alternate (A, A+B, A+B, A, …) and each starts once the last one's runs are done, so neither side
        # measures while the other's woken runs still finish.
        rates: dict[int, list[float]] = {1: [], 2: []}
        for phase in range(2 * args.rounds):
            width = 2 if phase % 4 in (1, 2) else 1
            say(f"• decisions/s: {args.decisions} runs decided through {'API A and B' if width == 2 else 'API A only'}")
            batch = await start_waiting(api, agent, args.decisions)
            ids += list(batch)
            rates[width].append(await decide_all(deciders[:width], list(batch.values())))
            completed += await wait_done(api, list(batch))
        await b.aclose()
        if completed != len(ids):
            say(f"FAIL: only {completed} of {len(ids)} runs completed")
            return 1
        gb.publish(section(args, same, across, posted, load, rates), "scale-out", args.write)
        ok = True
        return 0
    finally:
        await gb.wind_down(stack, api, [] if ok else ids, ok)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wakes", type=int, default=20, help="runs in the wake comparison (half through each API)")
    p.add_argument("--decisions", type=int, default=30, help="waiting runs per decisions/s measurement")
    p.add_argument("--rounds", type=int, default=2, help="decisions/s phases per side (alternating)")
    p.add_argument("--quick", action="store_true", help="a small run that writes nothing (smoke test)")
    p.add_argument("--write", dest="write", action="store_true", default=None, help="update docs/benchmarks.md")
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/benchmarks.md")
    args = p.parse_args()
    if args.quick:
        args.wakes, args.decisions, args.rounds = 4, 6, 1
    if args.write is None:
        args.write = not args.quick
    code = asyncio.run(bench(args))
    os._exit(code)  # Temporal's core threads can abort at interpreter exit (sdk-python#300)


if __name__ == "__main__":
    main()
