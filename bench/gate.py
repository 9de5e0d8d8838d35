"""Benchmark the tool gate (``POST /internal/sessions/{id}/permission``) against a bare request.

Starts the real embedded stack (PostgreSQL, Temporal dev server, worker, API) in a temporary home,
imports an uncapped ``bench`` policy, starts N idle replay runs and reads each run's TOOL token the
way only the host can: from ``/proc/<pid>/environ`` of the run's process (the runner deletes it
from its own ``os.environ``, but the kernel keeps the initial environment).

Then N concurrent clients (one keep-alive ``httpx.AsyncClient`` per run, over TCP) each send a fixed
number of gate requests (allows and denies interleaved, a unique ``tool_call_id`` each), and, in the
same process and with the same clients, the same number of ``GET /v1/health`` requests (no
dependencies): the baseline. Rounds alternate (baseline, gate, baseline, gate, ...) and the medians
are reported, because the machine is noisy. Every decision is checked; any mismatch exits 1.

Writes the ``bench:gate`` section of ``docs/benchmarks.md`` and prints the table.

    .venv/bin/python bench/gate.py [--runs 64] [--requests 80] [--rounds 3] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli.stack import Stack, admin_token, free_port  # noqa: E402
from core.contract import ENV_SESSION_ID, ENV_TOOL_TOKEN  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:gate -->", "<!-- /bench:gate -->"

# Targets from the issue: the gate's p50 within 5x of a bare request, its p99 under 10x.
TARGET_P50_RATIO = 5.0
TARGET_P99_RATIO = 10.0

POLICY_YAML = """\
name: bench
description: Benchmark policy. No tool-call cap; ls/cat allowed, curl denied, anything else denied.
defaults:
  tool_action: deny
budgets:
  max_wall_clock_secs: 3600
tools:
  - match: [Bash]
    action: allow
    shell:
      allow_prefixes: [ls, cat]
      deny_regex: ['\\bcurl\\b']
      on_no_match: deny
"""

ALLOW_INPUT = {"command": "ls -la"}
DENY_INPUT = {"command": "curl x"}

TERMINAL = {"completed", "failed", "cancelled", "budget_exceeded", "cancelling", "finalizing"}
INTRO = """\
# Benchmarks

Benchmarks of fluidbox's hot paths, run against the real embedded stack (PostgreSQL, the Temporal
dev server, the worker and the API, all on one machine).

* **gate** (`bench/gate.py`): the tool gate, `POST /internal/sessions/{id}/permission`: token check,
  policy decision and the ledger transaction for every call. Many concurrent runs each send
  allowed (`ls -la`) and denied (`curl x`) Bash calls over keep-alive HTTP connections. The baseline
  is `GET /v1/health`, a route that touches nothing, sent by the same clients at the same
  concurrency.

The absolute figures depend on the machine; the ones below come from a noisy 2-core machine where
the benchmark client, the API, PostgreSQL, Temporal and the sandboxes share the CPUs. Compare the
**ratios** against the baseline, which is measured in the same run (baseline and gate rounds
alternate and medians are reported).

Rerun with `make bench` (or `.venv/bin/python bench/gate.py --help` for the options); it rewrites
the section between its markers.
"""


def say(text: str) -> None:
    print(text, flush=True)


# ---------------------------------------------------------------------------------------------------
# Tokens from /proc


def _environ(pid: str) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key] = value
    return out


def scan_tool_tokens(run_ids: set[str]) -> dict[str, str]:
    """Run id -> TOOL token, from the initial environment of each run's process."""
    found: dict[str, str] = {}
    want_sid, want_tok = ENV_SESSION_ID.encode(), ENV_TOOL_TOKEN.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = _environ(entry)
        sid = env.get(want_sid, b"").decode(errors="replace")
        tok = env.get(want_tok, b"").decode(errors="replace")
        if sid in run_ids and tok:
            found[sid] = tok
    return found


async def collect_tokens(run_ids: list[str], timeout: float) -> dict[str, str]:
    wanted = set(run_ids)
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found.update(await asyncio.to_thread(scan_tool_tokens, wanted - set(found)))
        if len(found) == len(wanted):
            return found
        await asyncio.sleep(0.5)
    missing = sorted(wanted - set(found))
    raise SystemExit(f"no TOOL token found in /proc for {len(missing)} run(s), e.g. {missing[:3]}")


# ---------------------------------------------------------------------------------------------------
# Measurement


@dataclass
class Round:
    kind: str  # "gate" | "baseline"
    latencies: list[float] = field(default_factory=list)  # seconds
    wall: float = 0.0
    errors: int = 0

    @property
    def count(self) -> int:
        return len(self.latencies)

    def pct(self, q: int) -> float:
        cuts = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return cuts[q - 1] * 1000.0  # ms

    @property
    def rate(self) -> float:
        return self.count / self.wall if self.wall > 0 else 0.0


@dataclass
class Client:
    run_id: str
    http: httpx.AsyncClient
    seq: int = 0

    def next_id(self, tag: str) -> str:
        self.seq += 1
        return f"bench-{tag}-{self.seq}"


@dataclass
class Tally:
    allow_ok: int = 0
    deny_ok: int = 0
    mismatches: int = 0
    examples: list[str] = field(default_factory=list)

    def bad(self, text: str) -> None:
        self.mismatches += 1
        if len(self.examples) < 5:
            self.examples.append(text)


async def gate_client(cl: Client, n: int, tally: Tally, lat: list[float], tag: str) -> None:
    url = f"/internal/sessions/{cl.run_id}/permission"
    for i in range(n):
        allow = i % 2 == 0
        body = {"tool_call_id": cl.next_id(tag), "tool": "Bash", "input": ALLOW_INPUT if allow else DENY_INPUT}
        t0 = time.perf_counter()
        try:
            r = await cl.http.post(url, json=body)
        except httpx.HTTPError as exc:
            tally.bad(f"{cl.run_id}: {type(exc).__name__}: {exc}")
            continue
        lat.append(time.perf_counter() - t0)
        want = "allow" if allow else "deny"
        try:
            got = r.json().get("decision") if r.status_code == 200 else None
        except ValueError:
            got = None
        if got != want:
            tally.bad(f"{cl.run_id} {body['input']['command']!r}: HTTP {r.status_code} {r.text[:200]}")
        elif allow:
            tally.allow_ok += 1
        else:
            tally.deny_ok += 1


async def health_client(cl: Client, n: int, tally: Tally, lat: list[float]) -> None:
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            r = await cl.http.get("/v1/health")
        except httpx.HTTPError as exc:
            tally.bad(f"health: {type(exc).__name__}: {exc}")
            continue
        lat.append(time.perf_counter() - t0)
        if r.status_code != 200:
            tally.bad(f"health: HTTP {r.status_code} {r.text[:200]}")


async def run_round(kind: str, clients: list[Client], n: int, tally: Tally, tag: str) -> Round:
    rnd = Round(kind)
    if kind == "gate":
        jobs = [gate_client(cl, n, tally, rnd.latencies, tag) for cl in clients]
    else:
        jobs = [health_client(cl, n, tally, rnd.latencies) for cl in clients]
    t0 = time.perf_counter()
    await asyncio.gather(*jobs)
    rnd.wall = time.perf_counter() - t0
    return rnd


# ---------------------------------------------------------------------------------------------------
# The stack and the runs


async def setup_runs(api: httpx.AsyncClient, runs: int, timeout: float) -> list[str]:
    r = await api.post("/v1/policies", json={"name": "bench", "yaml": POLICY_YAML})
    r.raise_for_status()
    agent = {
        "name": "bench",
        "harness": "replay",
        "policy": "bench",
        "harness_config": {"script": [{"sleep_ms": 600_000}], "delay_ms": 0},
    }
    r = await api.post("/v1/agents", json=agent)
    if r.status_code != 201:
        raise SystemExit(f"creating the agent failed: HTTP {r.status_code} {r.text[:300]}")
    ids: list[str] = []
    for _ in range(runs):
        r = await api.post("/v1/sessions", json={"agent": "bench", "task": "bench"})
        if r.status_code != 201:
            raise SystemExit(f"starting a run failed: HTTP {r.status_code} {r.text[:300]}")
        ids.append(r.json()["session"]["id"])
    say(f"• started {runs} runs; waiting until all are running")
    deadline = time.monotonic() + timeout
    pending = set(ids)
    while pending and time.monotonic() < deadline:
        for rid in sorted(pending):
            r = await api.get(f"/v1/sessions/{rid}")
            status = r.json()["session"]["status"] if r.status_code == 200 else None
            if status == "running":
                pending.discard(rid)
            elif status in TERMINAL:
                raise SystemExit(f"run {rid} ended before the benchmark: {r.json()['session']}")
        if pending:
            await asyncio.sleep(0.5)
    if pending:
        raise SystemExit(f"{len(pending)} of {runs} runs were not running after {timeout:.0f}s")
    return ids


async def cancel_runs(api: httpx.AsyncClient, ids: list[str]) -> None:
    for rid in ids:
        with contextlib.suppress(Exception):
            await api.post(f"/v1/sessions/{rid}/cancel", timeout=10)


async def wait_cancelled(api: httpx.AsyncClient, ids: list[str], timeout: float) -> int:
    """Bounded wait for the runs to wind down (so the sandboxes exit before the stack stops)."""
    deadline = time.monotonic() + timeout
    pending = set(ids)
    while pending and time.monotonic() < deadline:
        for rid in sorted(pending):
            with contextlib.suppress(Exception):
                r = await api.get(f"/v1/sessions/{rid}", timeout=5)
                if r.json()["session"]["status"] in ("cancelled", "failed", "completed", "budget_exceeded"):
                    pending.discard(rid)
        if pending:
            await asyncio.sleep(0.5)
    return len(pending)


# ---------------------------------------------------------------------------------------------------
# Report


def med(values: list[float]) -> float:
    return statistics.median(values)


def summarize(rounds: list[Round]) -> dict[str, float]:
    return {
        "p50": med([r.pct(50) for r in rounds]),
        "p99": med([r.pct(99) for r in rounds]),
        "rate": med([r.rate for r in rounds]),
    }


def render(args: argparse.Namespace, gate: dict[str, float], base: dict[str, float], tally: Tally,
           per_round: list[Round]) -> str:  # fmt: skip
    r50, r99 = gate["p50"] / base["p50"], gate["p99"] / base["p99"]
    ok50, ok99 = r50 <= TARGET_P50_RATIO, r99 < TARGET_P99_RATIO
    mark = {True: "met", False: "**missed**"}
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    py = platform.python_version()
    lines = [
        "## Tool gate vs a bare request",
        "",
        f"Run {now} on {os.cpu_count()} CPUs (`nproc` {len(os.sched_getaffinity(0))}), "
        f"Python {py}, {platform.system()} {platform.release()}.",
        f"{args.runs} concurrent runs, one keep-alive HTTP client each over TCP; {args.requests} requests "
        f"per client per round (gate: allows and denies interleaved); {args.rounds} baseline and "
        f"{args.rounds} gate rounds, interleaved, after a warm-up; medians of the rounds.",
        "",
        "| | p50 (ms) | p99 (ms) | throughput (/s) |",
        "|---|---:|---:|---:|",
        f"| gate `POST /internal/sessions/{{id}}/permission` | {gate['p50']:.1f} | {gate['p99']:.1f} "
        f"| {gate['rate']:.0f} decisions/s |",
        f"| baseline `GET /v1/health` | {base['p50']:.1f} | {base['p99']:.1f} | {base['rate']:.0f} req/s |",
        f"| **ratio gate / baseline** | **{r50:.1f}x** | **{r99:.1f}x** | {gate['rate'] / base['rate']:.2f}x |",
        "",
        f"Targets: gate p50 within {TARGET_P50_RATIO:.0f}x of the bare request: {mark[ok50]} ({r50:.1f}x); "
        f"gate p99 under {TARGET_P99_RATIO:.0f}x: {mark[ok99]} ({r99:.1f}x).",
        "",
        f"Correctness: {tally.allow_ok} allows and {tally.deny_ok} denies as expected, "
        f"{tally.mismatches} mismatches.",
        "",
        "<details><summary>Per round</summary>",
        "",
        "| round | kind | p50 (ms) | p99 (ms) | /s |",
        "|---:|---|---:|---:|---:|",
    ]
    for i, rnd in enumerate(per_round, 1):
        lines.append(f"| {i} | {rnd.kind} | {rnd.pct(50):.1f} | {rnd.pct(99):.1f} | {rnd.rate:.0f} |")
    lines += ["", "</details>"]
    return "\n".join(lines)


def write_doc(section: str) -> None:
    block = f"{BEGIN}\n{section}\n{END}"
    text = DOC.read_text() if DOC.exists() else INTRO
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)


# ---------------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> int:
    home = Path(tempfile.mkdtemp(prefix="fbxb-", dir="/tmp"))
    stack = Stack(
        home=home,
        bind=f"127.0.0.1:{free_port()}",
        temporal_port=free_port(),
        ui_port=free_port(),
        extra_env={"FLUIDBOX_REPLAY_DELAY_MS": "0"},
        quiet=True,
    )
    ids: list[str] = []
    ok = False
    api: httpx.AsyncClient | None = None
    try:
        say(f"• starting the stack in {home}")
        t0 = time.monotonic()
        await stack.start_backing_services()
        token, _ = admin_token(stack.home)
        await stack.start_app(token)
        say(f"• stack up in {time.monotonic() - t0:.1f}s (API {stack.api_url})")
        api = httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=30)
        ids = await setup_runs(api, args.runs, timeout=args.start_timeout)
        tokens = await collect_tokens(ids, timeout=30)
        say(f"• read {len(tokens)} TOOL tokens from /proc/<pid>/environ")

        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=300)
        clients = [
            Client(rid, httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {tokens[rid]}"},
                                          timeout=60, limits=limits))  # fmt: skip
            for rid in ids
        ]
        tally = Tally()
        try:
            say(f"• warm-up ({args.warmup} requests per client, both kinds)")
            await run_round("baseline", clients, args.warmup, tally, "warm")
            await run_round("gate", clients, args.warmup, tally, "warm")
            warm_allow, warm_deny = tally.allow_ok, tally.deny_ok
            rounds: list[Round] = []
            for i in range(args.rounds):
                for kind in ("baseline", "gate"):
                    rnd = await run_round(kind, clients, args.requests, tally, f"r{i}")
                    rounds.append(rnd)
                    say(f"  round {i + 1} {kind:8s}: p50 {rnd.pct(50):7.1f} ms  p99 {rnd.pct(99):7.1f} ms  "
                        f"{rnd.rate:7.0f}/s  ({rnd.count} requests in {rnd.wall:.1f}s)")  # fmt: skip
        finally:
            await asyncio.gather(*(cl.http.aclose() for cl in clients), return_exceptions=True)

        if tally.mismatches:
            say(f"FAIL: {tally.mismatches} gate/baseline responses did not match the expected decision:")
            for ex in tally.examples:
                say(f"  {ex}")
            return 1
        expected = args.runs * args.rounds * args.requests
        measured_allow, measured_deny = tally.allow_ok - warm_allow, tally.deny_ok - warm_deny
        if measured_allow + measured_deny != expected:
            say(f"FAIL: {measured_allow + measured_deny} decisions checked, expected {expected}")
            return 1
        gate = summarize([r for r in rounds if r.kind == "gate"])
        base = summarize([r for r in rounds if r.kind == "baseline"])
        section = render(args, gate, base, tally, rounds)
        say("")
        say(section)
        if args.write:
            write_doc(section)
            say(f"\n• wrote {DOC.relative_to(ROOT)}")
        ok = True
        return 0
    finally:
        if api is not None:
            if ids:
                say(f"• cancelling {len(ids)} runs")
                await cancel_runs(api, ids)
                left = await wait_cancelled(api, ids, timeout=60)
                if left:
                    say(f"  {left} runs still winding down; stopping anyway")
            await api.aclose()
        say("• stopping the stack")
        stack.stop()
        if ok:
            shutil.rmtree(home, ignore_errors=True)
        else:
            say(f"  logs kept in {stack.logs}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=64, help="concurrent runs, one client each (default 64)")
    p.add_argument("--requests", type=int, default=80,
                   help="requests per client per round; gate rounds alternate allow/deny (default 80)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="baseline and gate rounds each, interleaved (default 3)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up requests per client and kind (default 10)")
    p.add_argument("--start-timeout", type=float, default=300, help="seconds to wait for all runs to be running")
    p.add_argument("--quick", action="store_true",
                   help="a small smoke run: 8 runs, 10 requests (prints only, unless --write)")  # fmt: skip
    p.add_argument("--write", dest="write", action="store_true", default=None,
                   help="update docs/benchmarks.md (the default, except with --quick)")  # fmt: skip
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/benchmarks.md")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.requests, args.warmup = 8, 10, 4
    if args.write is None:
        args.write = not args.quick
    if args.runs < 1 or args.requests < 2 or args.rounds < 1:
        p.error("--runs >= 1, --requests >= 2 and --rounds >= 1 are required")
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
