"""Benchmark a burst of runs that each wait on a human: how many one stack holds, how fast they start and wake.

Starts the real embedded stack in a temporary home (default settings, replay delay 0) and a replay
agent whose one step (``echo ok``) needs an approval. Then, in one run of the stack:

1. **idle wake**: a few runs one at a time; each is approved once it waits, with nothing else live;
2. **burst**: N runs created at once (50 concurrent clients); the time until all N wait on their
   approval, and each run's start (row insert → ``approval.requested``), split into the phases the
   ledger records (queued → provisioning → sandbox launched → the runner's first tool call);
3. **memory** per live sandbox while all N wait: the PSS of each sandbox's processes (bwrap and the
   runner), and the host's ``MemAvailable`` drop divided by N;
4. **wake under load**: a sample of the N approved one at a time while the others stay live;
5. the rest approved at once; every run must complete.

A wake is measured in the ledger, on PostgreSQL's clock: from the decision's ``approval.decided`` to
the runner's next event (the tool's output), so the client's polling adds nothing.

Writes the ``bench:scale`` section of ``docs/benchmarks.md`` and prints it.

    .venv/bin/python bench/scale.py [--runs 200] [--idle 10] [--sample 20] [--quick] [--no-write]
                                    [--profile worker.txt]

``--profile`` records the worker with py-spy (a dev dependency) from the burst's start until every run
waits, as collapsed stacks (``--format raw``): where the worker's share of a start goes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import shutil
import signal
import statistics
import subprocess
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
from config.settings import Settings  # noqa: E402
from db.engine import asyncpg_dsn  # noqa: E402

CLIENTS = 50
POLICY = "name: {name}\ndefaults:\n  tool_action: approve\n"


def say(text: str) -> None:
    print(text, flush=True)


class BenchError(Exception):
    pass


def pct(xs: list[float], q: int) -> float:
    if not xs:
        return float("nan")
    if len(xs) < 2:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


@dataclass
class Outcome:
    runs: int = 0
    completed: int = 0
    all_waiting_s: float = 0.0
    starts: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    idle_wake: list[float] = field(default_factory=list)
    load_wake: list[float] = field(default_factory=list)
    pss_mb: list[float] = field(default_factory=list)
    avail_drop_mb: float = 0.0
    all_done_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per part, burst start → all waiting
    worker_threads: dict[str, float] = field(default_factory=dict)  # the (first) worker's, by thread name
    history: dict[str, int] = field(default_factory=dict)  # one burst run's history while it waits
    first: dict[str, list[float]] = field(default_factory=dict)  # the first step's split, from the histories


class Ledger:
    """Direct reads of the ledger (the API would add its own latency to what is measured)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def pending(self, ids: list[str]) -> int:
        return int(
            await self.conn.fetchval(
                "SELECT count(*) FROM approvals WHERE status = 'pending' AND session_id = ANY($1::uuid[])", ids
            )
        )

    async def wake(self, run_id: str) -> float | None:
        """Seconds from the approval.decided event to the runner's next event; None until that event exists."""
        rows = await self.conn.fetch(
            "SELECT type, actor, occurred_at FROM events WHERE session_id = $1 ORDER BY seq", uuid.UUID(run_id)
        )
        decided = next((r["occurred_at"] for r in rows if r["type"] == "approval.decided"), None)
        if decided is None:
            return None
        after = [r["occurred_at"] for r in rows if r["occurred_at"] > decided and r["actor"] in ("agent", "harness")]
        return (after[0] - decided).total_seconds() if after else None

    async def starts(self, ids: list[str]) -> tuple[list[float], dict[str, list[float]]]:
        """Per run: insert → approval.requested, and the phases between (from status changes in the ledger)."""
        rows = await self.conn.fetch(
            "SELECT s.id, s.created_at, e.type, e.payload, e.occurred_at FROM sessions s JOIN events e "
            "ON e.session_id = s.id WHERE s.id = ANY($1::uuid[]) ORDER BY s.id, e.seq",
            ids,
        )
        by_run: dict[str, list[asyncpg.Record]] = {}
        for r in rows:
            by_run.setdefault(str(r["id"]), []).append(r)
        starts: list[float] = []
        phases: dict[str, list[float]] = {"queued": [], "provision": [], "runner": []}
        for evs in by_run.values():
            created = evs[0]["created_at"]
            asked = next((e["occurred_at"] for e in evs if e["type"] == "approval.requested"), None)
            moved: dict[str | None, dt.datetime] = {}
            for e in evs:
                if e["type"] == "session.status_changed":
                    moved.setdefault(_to(e["payload"]), e["occurred_at"])  # the first time it got there
            provisioning, running = moved.get("provisioning"), moved.get("running")
            if asked is None or provisioning is None or running is None:
                continue
            starts.append((asked - created).total_seconds())
            phases["queued"].append((provisioning - created).total_seconds())
            phases["provision"].append((running - provisioning).total_seconds())
            phases["runner"].append((asked - running).total_seconds())
        return starts, phases


def _to(payload: object) -> str | None:
    import json

    doc = json.loads(payload) if isinstance(payload, str) else payload
    return doc.get("data", {}).get("to") if isinstance(doc, dict) else None


def sandbox_pids(home: Path) -> list[int]:
    from core.ports import SandboxHandle

    pids = []
    for pidfile in (home / "runs").glob("*/sandbox.pid"):
        try:
            pids.append(SandboxHandle.model_validate_json(pidfile.read_text()).pid)
        except (OSError, ValueError):
            continue
    return pids


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except OSError:
                continue
    return out


def pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PARTS = ("runners (sandboxes)", "worker", "Temporal", "PostgreSQL", "API")


@dataclass(frozen=True)
class Proc:
    cmd: str
    ppid: int
    cpu: float  # seconds: its own plus its waited-for children's


def processes() -> dict[int, Proc]:
    out: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        f = stat.rsplit(")", 1)[1].split()
        out[int(entry.name)] = Proc(cmd, int(f[1]), sum(int(x) for x in f[11:15]) / CLOCK_TICKS)
    return out


def session_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for pair in env:
        if pair.startswith(b"FLUIDBOX_SESSION_ID="):
            return pair.split(b"=", 1)[1].decode()
    return None


def part_of(pid: int, procs: dict[int, Proc], stack: Stack, runs: set[str]) -> str | None:
    """Which part of the stack ``pid`` belongs to, by ancestry (a sandbox: by its run's id)."""
    roots = {p.pid: name for name, p in stack.procs.items()}
    home = str(stack.home)
    seen = 0
    cur: int | None = pid
    while cur and cur in procs and seen < 64:
        if cur in roots:
            name = roots[cur]
            return {"api": "API", "temporal": "Temporal"}.get(name, "worker" if name.startswith("worker") else None)
        if "postgres" in procs[cur].cmd and home in procs[cur].cmd:
            return "PostgreSQL"
        cur, seen = procs[cur].ppid, seen + 1
    return "runners (sandboxes)" if session_of(pid) in runs else None


def cpu_by_part(before: dict[int, Proc], after: dict[int, Proc], stack: Stack, runs: set[str]) -> dict[str, float]:
    """CPU seconds each part of the stack used between two snapshots of /proc."""
    used = dict.fromkeys(PARTS, 0.0)
    for pid, proc in after.items():
        part = part_of(pid, after, stack, runs)
        if part is None:
            continue
        prior = before.get(pid)
        used[part] += proc.cpu - (prior.cpu if prior is not None and prior.cmd == proc.cmd else 0.0)
    return used


def threads_of(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of ``pid`` (its own threads; children not included), and its children's."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / CLOCK_TICKS
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["(waited-for children)"] = (int(f[13]) + int(f[14])) / CLOCK_TICKS
    except OSError:
        pass
    return out


async def history_of(stack: Stack, run_id: str) -> dict[str, int]:
    """What one waiting run's start cost Temporal: its history's events, workflow tasks and activity tasks."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    from contracts import temporal as c

    client = await Client.connect(stack.temporal_address or "", namespace="default")
    events = [e async for e in client.get_workflow_handle(c.workflow_id(run_id)).fetch_history_events()]
    kinds = [e.event_type for e in events]
    return {
        "events": len(kinds),
        "workflow tasks": kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        "activity tasks": kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
        "markers": kinds.count(EventType.EVENT_TYPE_MARKER_RECORDED),
    }


async def first_steps(stack: Stack, conn: asyncpg.Connection, ids: list[str]) -> dict[str, list[float]]:
    """Where "insert → provisioning" goes, per run, from its workflow history and its rows: the API until Temporal
    started the workflow; Temporal and the worker's pollers until the worker took the first workflow task; the
    worker until the run was marked provisioning (the task, then the provisioning local activity's first reads)."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    from contracts import temporal as c

    client = await Client.connect(stack.temporal_address or "", namespace="default")
    rows = await conn.fetch(
        "SELECT s.id, s.created_at, e.payload, e.occurred_at FROM sessions s JOIN events e ON e.session_id = s.id "
        "WHERE s.id = ANY($1::uuid[]) AND e.type = 'session.status_changed' ORDER BY s.id, e.seq",
        ids,
    )
    provisioning: dict[str, tuple[dt.datetime, dt.datetime]] = {}
    for r in rows:
        if _to(r["payload"]) == "provisioning":
            provisioning.setdefault(str(r["id"]), (r["created_at"], r["occurred_at"]))
    out: dict[str, list[float]] = {"api": [], "dispatch": [], "worker": []}
    for run_id, (created, marked) in provisioning.items():
        handle = client.get_workflow_handle(c.workflow_id(run_id))
        started = took = None
        async for e in handle.fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                started = e.event_time.ToDatetime(dt.UTC)
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                took = e.event_time.ToDatetime(dt.UTC)
                break
        if started is None or took is None:
            continue
        out["api"].append((started - created).total_seconds())
        out["dispatch"].append((took - started).total_seconds())
        out["worker"].append((marked - took).total_seconds())
    return out


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def profile_worker(stack: Stack, path: str) -> subprocess.Popen[bytes]:
    """py-spy recording the (first) worker process until it is sent SIGINT."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise BenchError("--profile needs py-spy (make install puts it in .venv)")
    pid = stack.procs["worker"].pid
    argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--nonblocking", "--output", path]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attached before the burst starts
    return proc


async def wait_until(check, within: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not happen within {within:.0f}s")
        await asyncio.sleep(0.05)


async def start_run(api: httpx.AsyncClient, agent: str) -> str:
    r = await api.post("/v1/sessions", json={"agent": agent, "task": "scale"})
    if r.status_code != 200:
        raise BenchError(f"starting a run failed: HTTP {r.status_code} {r.text[:300]}")
    return str(r.json()["session"]["id"])


async def approve_one(api: httpx.AsyncClient, run_id: str) -> None:
    rows = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
    pending = [a for a in rows if a["status"] == "pending"]
    if not pending:
        raise BenchError(f"run {run_id} has no pending approval")
    r = await api.post(f"/v1/approvals/{pending[0]['id']}/decision", json={"decision": "approve"})
    if r.status_code != 200:
        raise BenchError(f"approving failed: HTTP {r.status_code} {r.text[:300]}")


async def wake_of(api: httpx.AsyncClient, ledger: Ledger, run_id: str) -> float:
    """Approve the run's pending approval and return its wake (seconds) once the runner has answered."""
    await approve_one(api, run_id)
    got: list[float] = []

    async def woke() -> bool:
        w = await ledger.wake(run_id)
        if w is not None:
            got.append(w)
        return w is not None

    await wait_until(woke, 120, f"the wake of run {run_id}")
    return got[0]


async def statuses(api: httpx.AsyncClient, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for rid in ids:
        r = await api.get(f"/v1/sessions/{rid}")
        out[rid] = r.json()["session"]["status"] if r.status_code == 200 else "?"
    return out


async def bench(args: argparse.Namespace) -> int:
    env = {"FLUIDBOX_REPLAY_DELAY_MS": "0", "FLUIDBOX_LOG_LEVEL": "WARNING"}
    stack = Stack.ephemeral("fbxsc-", env)
    stack.worker_processes = args.workers
    api: httpx.AsyncClient | None = None
    ids: list[str] = []
    ok = False
    out = Outcome(runs=args.runs)
    conn: asyncpg.Connection | None = None
    try:
        say(f"• starting the stack in {stack.home}")
        admin = await stack.start()
        api = httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {admin}"}, timeout=120)
        conn = await asyncpg.connect(asyncpg_dsn(stack.database_url or ""))
        ledger = Ledger(conn)
        name = f"scale-{uuid.uuid4().hex[:6]}"
        r = await api.post("/v1/policies", json={"name": name, "yaml": POLICY.format(name=name)})
        if r.status_code != 200:
            raise BenchError(f"importing the policy failed: HTTP {r.status_code} {r.text[:300]}")
        script = [{"tool": "Bash", "input": {"command": "echo ok"}}]
        r = await api.post(
            "/v1/agents",
            json={"name": name, "harness": "replay", "policy": name, "harness_config": {"script": script}},
        )
        if r.status_code != 200:
            raise BenchError(f"creating the agent failed: HTTP {r.status_code} {r.text[:300]}")

        say(f"• idle wake: {args.idle} runs, one at a time")
        for _ in range(args.idle):
            rid = await start_run(api, name)
            ids.append(rid)
            await wait_until(lambda rid=rid: ledger.pending([rid]), 120, "an idle run's approval")  # type: ignore[misc]
            out.idle_wake.append(await wake_of(api, ledger, rid))

        avail_before = mem_available_mb()
        say(f"• burst: {args.runs} runs at once ({CLIENTS} clients)")
        burst: list[str] = []
        sem = asyncio.Semaphore(CLIENTS)

        async def one() -> None:
            async with sem:
                burst.append(await start_run(api, name))  # type: ignore[arg-type]

        spy = profile_worker(stack, args.profile) if args.profile else None
        t0 = time.monotonic()
        cpu_before = processes()
        worker_pid = stack.procs["worker"].pid
        threads_before = threads_of(worker_pid)
        await asyncio.gather(*(one() for _ in range(args.runs)))
        ids.extend(burst)
        say(f"  created in {time.monotonic() - t0:.1f}s; waiting until every run waits on its approval")

        async def all_waiting() -> bool:
            return await ledger.pending(burst) == len(burst)

        await wait_until(all_waiting, args.within, f"all {args.runs} runs waiting")
        out.all_waiting_s = time.monotonic() - t0
        out.cpu = cpu_by_part(cpu_before, processes(), stack, set(burst))
        threads_after = threads_of(worker_pid)
        out.worker_threads = {name: used - threads_before.get(name, 0.0) for name, used in threads_after.items()}
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it recorded and exits
            spy.wait(timeout=60)
            say(f"  worker profile written to {args.profile}")
        say(f"  all {args.runs} waiting after {out.all_waiting_s:.1f}s")
        out.starts, out.phases = await ledger.starts(burst)
        out.history = await history_of(stack, burst[0])
        out.first = await first_steps(stack, conn, burst)

        pids = sandbox_pids(stack.home)
        live = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        out.pss_mb = [sum(pss_kb(p) for p in tree(pid)) / 1024 for pid in live]
        out.avail_drop_mb = (avail_before - mem_available_mb()) / max(len(burst), 1)
        say(f"  {len(live)} live sandboxes; PSS p50 {pct(out.pss_mb, 50):.1f} MB each")

        sample = burst[: args.sample]
        say(f"• wake under load: {len(sample)} runs approved one at a time, {len(burst)} live")
        for rid in sample:
            out.load_wake.append(await wake_of(api, ledger, rid))
        say("• approving the rest at once")
        for rid in burst[args.sample :]:
            await approve_one(api, rid)

        async def all_done() -> bool:
            left = int(
                await conn.fetchval(  # type: ignore[union-attr]
                    "SELECT count(*) FROM sessions WHERE id = ANY($1::uuid[]) AND status NOT IN "
                    "('completed', 'failed', 'cancelled', 'budget_exceeded')",
                    burst,
                )
            )
            return left == 0

        await wait_until(all_done, args.within, f"all {args.runs} runs ending")
        out.all_done_s = time.monotonic() - t0
        final = await statuses(api, burst)
        out.completed = sum(1 for s in final.values() if s == "completed")
        problems = [] if out.completed == len(burst) else [f"only {out.completed} of {len(burst)} runs completed"]
        if gb.failed(problems):
            return 1
        gb.publish(render(args, out), "scale", args.write and not args.quick)
        ok = True
        return 0
    except BenchError as exc:
        say(f"FAIL: {exc}")
        return 1
    finally:
        if conn is not None:
            await conn.close()
        await gb.wind_down(stack, api, [] if ok else ids, ok)


def render(args: argparse.Namespace, out: Outcome) -> str:
    cfg = Settings()
    ms = 1000.0
    ph = out.phases
    lines = [
        "## A burst of runs that each wait on a human (`bench/scale.py`)",
        "",
        f"{out.runs} replay runs created at once by {CLIENTS} clients against one stack "
        f"({args.workers} worker process{'es' if args.workers > 1 else ''}; worker slots each: "
        f"{cfg.worker_max_activities} activities, {cfg.worker_max_local_activities} local activities, "
        f"{cfg.worker_max_workflow_tasks} workflow tasks; sandbox maximum: {cfg.max_sandboxes or 'none'}; "
        f"liveness check every {cfg.liveness_check_secs:g} s), each "
        "waiting on one approval; then approved, a sample one at a time (wake under load) and the rest at once. "
        f"Idle wake: {len(out.idle_wake)} runs approved one at a time before the burst, nothing else live. "
        "Wakes are read from the ledger on PostgreSQL's clock: `approval.decided` → the runner's next event.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| runs completed | **{out.completed} of {out.runs}** |",
        f"| burst: all {out.runs} waiting on their approval after | {out.all_waiting_s:.1f} s |",
        f"| start (row insert → `approval.requested`) p50 / p95 | "
        f"{pct(out.starts, 50):.1f} s / {pct(out.starts, 95):.1f} s |",
        f"| · waiting for the workflow's first step (insert → `provisioning`) p50 / p95 | "
        f"{pct(ph['queued'], 50):.1f} s / {pct(ph['queued'], 95):.1f} s |",
        *(
            f"| ·· {what} p50 / p95 | {pct(out.first[key], 50):.1f} s / {pct(out.first[key], 95):.1f} s |"
            for key, what in (
                ("api", "insert → Temporal started the workflow (API)"),
                ("dispatch", "→ the worker took its first workflow task (Temporal, the worker's pollers)"),
                ("worker", "→ `provisioning` (the task, the provisioning local activity's first reads)"),
            )
            if out.first.get(key)
        ),
        f"| · provisioning (tokens, workspace, bwrap → `running`) p50 / p95 | "
        f"{pct(ph['provision'], 50):.1f} s / {pct(ph['provision'], 95):.1f} s |",
        f"| · runner start to its first tool call (`running` → `approval.requested`) p50 / p95 | "
        f"{pct(ph['runner'], 50):.1f} s / {pct(ph['runner'], 95):.1f} s |",
        f"| approval wake, idle, p50 / p95 | "
        f"{pct(out.idle_wake, 50) * ms:.0f} ms / {pct(out.idle_wake, 95) * ms:.0f} ms |",
        f"| approval wake with {out.runs} runs live, p50 / p95 ({len(out.load_wake)} samples) | "
        f"{pct(out.load_wake, 50) * ms:.0f} ms / {pct(out.load_wake, 95) * ms:.0f} ms |",
        f"| memory per live sandbox (PSS of bwrap + runner) p50 / max | "
        f"{pct(out.pss_mb, 50):.1f} MB / {max(out.pss_mb, default=float('nan')):.1f} MB |",
        f"| host `MemAvailable` drop per run while all wait | {out.avail_drop_mb:.1f} MB |",
        f"| burst start → every run ended | {out.all_done_s:.1f} s |",
        "",
        f"Where a run's start goes: CPU used from the burst's start until all {out.runs} runs waited, per part "
        "of the stack (from `/proc`; sandboxes counted by their run's id), divided by the runs. The machine's "
        f"{os.cpu_count()} CPUs give {os.cpu_count() or 1} CPU-seconds per second; a burst is bound by their sum.",
        "",
        "| part | CPU per run |",
        "|---|---|",
        *(f"| {part} | {used / max(out.runs, 1) * ms:.0f} ms |" for part, used in out.cpu.items()),
        f"| **all parts** | **{sum(out.cpu.values()) / max(out.runs, 1) * ms:.0f} ms** |",
        "",
        "One burst run's history while it waits: "
        + ", ".join(f"{n} {what}" for what, n in out.history.items())
        + " (markers: local activities and patches).",
        "",
        "The worker's share by thread (the Python event loop is `python`; Temporal's core runs in `tokio-rt-worker`;"
        " git and the sandbox launcher are its waited-for children):",
        "",
        "| worker thread | CPU per run |",
        "|---|---|",
        *(
            f"| {name} | {used / max(out.runs, 1) * ms:.0f} ms |"
            for name, used in sorted(out.worker_threads.items(), key=lambda kv: -kv[1])
            if used / max(out.runs, 1) * ms >= 0.5
        ),
        "",
        f"<sub>{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, `bench/scale.py --runs {out.runs}`</sub>",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Benchmark a burst of runs that each wait on an approval.")
    p.add_argument("--runs", type=int, default=200, help="runs in the burst (default 200)")
    p.add_argument("--idle", type=int, default=10, help="runs approved one at a time before the burst (default 10)")
    p.add_argument("--sample", type=int, default=20, help="burst runs approved one at a time (default 20)")
    p.add_argument("--within", type=float, default=600, help="seconds allowed for the burst to wait / end")
    p.add_argument("--workers", type=int, default=1, help="worker processes (FLUIDBOX_WORKER_PROCESSES, default 1)")
    p.add_argument("--profile", metavar="PATH", help="record the worker with py-spy during the burst (raw stacks)")
    p.add_argument("--quick", action="store_true", help="a small smoke run (20 runs) that only prints")
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/benchmarks.md")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.idle, args.sample = 20, 3, 5
    args.sample = min(args.sample, args.runs)
    code = asyncio.run(bench(args))
    # The Temporal core threads can abort at interpreter exit (sdk-python#300): leave at once.
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
