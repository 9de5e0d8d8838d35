"""Benchmark the policy engine with a large policy: 500 rules, regexes and globs.

Builds a deterministic 500-rule policy (seeded random, no I/O): exact-name rules over synthetic MCP
tool names, prefix-wildcard rules, shell rules (5-10 allow prefixes, 2-5 deny regexes each, with
alternations and ``\\b``), file rules (3-6 allow globs with ``**`` and ``*``, 2-4 deny globs) and a
final ``match: ["*"]`` rule. The rules that the measured calls hit sit at the end (a Bash rule, a
file rule, the catch-all), so most calls scan (almost) every rule: the worst case of a first-match
engine.

1. In process, ``core.policy.evaluate`` over a fixed mix of calls, each timed with
   ``time.perf_counter_ns``, in batches that alternate with the same mix against the seeded
   ``default`` policy (the baseline), with ``core.gate.decide`` on a RunSpec carrying each policy,
   with ``RunSpec.policy()`` alone (``decide`` calls it on every call) and with a parse of the
   policy snapshot (``Policy.model_validate``, what ``RunSpec.policy()`` does, or caches).
2. Over HTTP, like ``bench/gate.py`` (whose helpers it reuses): the real embedded stack, N idle runs
   on the small ``bench`` policy and N on the 500-rule policy, concurrent
   ``POST /internal/sessions/{id}/permission`` calls (``ls -la`` allowed, ``curl x`` denied, both
   by the late Bash rule of the large policy) against ``GET /internal/health``; baseline, small-policy and
   large-policy rounds interleave and the medians are reported. Every decision is checked.

Writes the ``bench:policy`` section of ``docs/benchmarks.md`` and prints it.

    .venv/bin/python bench/policy.py [--evals 200000] [--runs 64] [--requests 80] [--rounds 3]
                                     [--transport tcp] [--in-process] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import gc
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gate as gb  # noqa: E402
from bench.gate import say  # noqa: E402
from cli.stack import Stack, StackError  # noqa: E402
from core.gate import decide  # noqa: E402
from core.policy import Policy, evaluate, parse_policy  # noqa: E402
from core.runspec import RunSpec, WorkspaceSpec  # noqa: E402

# Target from the issue: a 500-rule evaluation under 100 µs p50, in process.
TARGET_P50_US = 100.0

SEED = 20261129
LARGE_NAME = "bench-large"
N_EXACT, N_PREFIX, N_SHELL, N_FILE = 200, 100, 100, 99  # + the catch-all: 500 rules
ACTIONS = ("allow", "approve", "deny")

SHELL_PREFIXES = [
    "cat",
    "head",
    "tail",
    "wc",
    "pwd",
    "echo",
    "grep",
    "rg",
    "find",
    "python",
    "python3 -m pytest",
    "pytest",
    "node",
    "npm test",
    "npm run lint",
    "cargo test",
    "cargo build",
    "go test",
    "go vet",
    "git status",
    "git diff",
    "git log",
    "git add",
    "git commit",
    "git show",
    "make",
    "mkdir",
    "sed -n",
    "awk",
    "sort",
    "uniq",
    "diff",
    "touch",
    "./run_tests.sh",
]
# "@" is replaced by the rule's number, so every rule also carries patterns of its own.
DENY_REGEXES = [
    r"\b(curl|wget|nc|ncat|socat|telnet)\b",
    r"rm\s+-(rf|fr|r)\s+/(\s|$)",
    r"git\s+push\s+.*(--force|-f)\b",
    r"\b(sudo|su|doas|pkexec)\b",
    r"/etc/(passwd|shadow|sudoers|group)\b",
    r"chmod\s+(-R\s+)?(777|a\+rwx)\b",
    r"\b(mkfs(\.\w+)?|dd\s+if=)",
    r"(base64\s+-d|xxd\s+-r)\s*\|\s*(ba|z|k)?sh\b",
    r">\s*/dev/(sd[a-z]|nvme\d+n\d+)\b",
    r"\b(shutdown|reboot|halt|poweroff)\b",
    r"\bssh(-keygen|-copy-id|-add)?\b",
    r"\b(scp|rsync)\b.*\w+@[\w.-]+:",
    r"\b(deploy|release)-@\b",
    r"\b(svc@|tool@)-(admin|root)\b",
    r"(^|[;&|]\s*)(kill|pkill)\s+-9\s+@\b",
    r"\bexport\s+(SECRET|TOKEN|KEY)_@=",
]
ALLOW_GLOBS = [
    "/workspace/pkg@/**",
    "/workspace/src/**/*.py",
    "/workspace/*.md",
    "/workspace/docs/**/*.rst",
    "/workspace/tests/**/test_*.py",
    "/workspace/web@/**/*.ts",
    "/workspace/build@/*/*.o",
    "/workspace/**/*.json",
    "/tmp/job@/**",
    "/workspace/svc@/*/config/*.yaml",
]
DENY_GLOBS = [
    "**/.env",
    "**/.env.*",
    "**/.git/**",
    "**/*.pem",
    "**/secrets/**",
    "**/id_rsa*",
    "/workspace/vendor@/**",
    "**/node_modules/.bin/*",
]


def build_policy(seed: int = SEED) -> dict[str, Any]:
    """The 500-rule policy document (deterministic for a seed)."""
    rng = random.Random(seed)
    names = [f"mcp__svc{n}__op{m}" for n in range(80) for m in range(8)]
    rng.shuffle(names)
    taken = iter(names)
    rules: list[dict[str, Any]] = []
    for i in range(N_EXACT):
        rule: dict[str, Any] = {"match": [next(taken) for _ in range(rng.randint(1, 3))], "action": rng.choice(ACTIONS)}
        if rule["action"] != "allow" and rng.random() < 0.5:
            rule["risk"] = f"synthetic service {i} has effects outside the run"
        rules.append(rule)
    for i in range(N_PREFIX):
        match = [f"mcp__ext{i}__*", f"plugin_{i}_*"][: rng.randint(1, 2)]
        rules.append({"match": match, "action": rng.choice(ACTIONS)})

    def shell(i: int, pinned: list[str], deny: list[str]) -> dict[str, Any]:
        prefixes = rng.sample(SHELL_PREFIXES, rng.randint(5, 10) - len(pinned)) + pinned
        own = DENY_REGEXES[12 + i % 4].replace("@", str(i))
        pool = [r for r in DENY_REGEXES[:12] if r not in deny]
        regexes = [own, *rng.sample(pool, rng.randint(2, 5) - 1 - len(deny)), *deny]
        return {"allow_prefixes": prefixes, "deny_regex": regexes, "on_no_match": rng.choice(ACTIONS)}

    def paths(i: int, pinned: list[str], deny: list[str]) -> dict[str, Any]:
        allow_pool = [g for g in ALLOW_GLOBS if g not in pinned]
        deny_pool = [g for g in DENY_GLOBS if g not in deny]
        allow = [g.replace("@", str(i)) for g in rng.sample(allow_pool, rng.randint(3, 6) - len(pinned))]
        denied = [g.replace("@", str(i)) for g in rng.sample(deny_pool, rng.randint(2, 4) - len(deny))]
        return {"allow": allow + pinned, "deny": denied + deny}

    for i in range(N_SHELL - 1):
        rules.append({"match": [f"Shell{i}", f"Shell{i}Output"], "action": "allow", "shell": shell(i, [], [])})
    for i in range(N_FILE - 1):
        rules.append({"match": [f"FileTool{i}"], "action": "allow", "paths": paths(i, [], [])})
    rng.shuffle(rules)
    # The rules the measured calls hit, last: "ls" is the last prefix and the curl pattern the last
    # regex, so an allow tries every regex and a prefix before it, and a deny tries every regex.
    n = N_SHELL - 1
    rules.append(
        {
            "match": ["Bash", "BashOutput"],
            "action": "allow",
            "shell": {**shell(n, ["ls"], [DENY_REGEXES[0]]), "on_no_match": "approve"},
        }
    )
    rules.append(
        {
            "match": ["Write", "Edit", "MultiEdit", "NotebookEdit"],
            "action": "allow",
            "paths": paths(N_FILE - 1, ["/workspace/src/**/*.py"], ["**/.env"]),
        }
    )
    rules.append({"match": ["*"], "action": "deny", "risk": "not in the tool catalogue"})
    return {
        "name": LARGE_NAME,
        "description": "Benchmark policy: 500 synthetic rules (bench/policy.py); no tool-call cap.",
        "defaults": {"tool_action": "deny"},
        "budgets": {"max_wall_clock_secs": 3600},
        "tools": rules,
    }


def load_default() -> tuple[dict[str, Any], Policy]:
    doc = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    return doc, parse_policy(doc)


# ---------------------------------------------------------------------------------------------------
# The call mix


@dataclass(frozen=True)
class Call:
    label: str
    tool: str
    input: dict[str, Any]
    rule: int | None  # the large policy's rule that must decide it
    action: str  # and its verdict


def call_mix(doc: dict[str, Any]) -> list[Call]:
    """Seven calls decided by the last three rules, one by a middle rule and one by a late one."""
    rules = doc["tools"]
    last = len(rules) - 1
    bash, files = last - 2, last - 1

    def nearest(index: int, want: Callable[[dict[str, Any]], bool]) -> int:
        return min((i for i, r in enumerate(rules) if want(r)), key=lambda i: abs(i - index))

    exact = nearest(last // 2, lambda r: "shell" not in r and "paths" not in r and "*" not in r["match"][0])
    prefix = nearest(last * 4 // 5, lambda r: r["match"][0].startswith("mcp__ext"))
    verdict = {"allow": "allow", "deny": "deny", "approve": "require_approval"}
    return [
        Call("unknown tool: the catch-all, last rule", "Unlisted", {}, last, "deny"),
        Call("Bash `ls -la`: allow prefix", "Bash", gb.ALLOW_INPUT, bash, "allow"),
        Call("Bash `curl x`: deny regex", "Bash", gb.DENY_INPUT, bash, "deny"),
        Call("Bash, no prefix: on_no_match", "Bash", {"command": "frobnicate --all ./data"}, bash, "require_approval"),
        Call("Write, allowed glob", "Write", {"file_path": "/workspace/src/app/main.py"}, files, "allow"),
        Call("Write `.env`: deny glob", "Write", {"file_path": "/workspace/.env"}, files, "deny"),
        Call("Edit outside the allow globs", "Edit", {"file_path": "/etc/hosts"}, files, "require_approval"),
        Call(f"exact MCP name, rule {exact}", rules[exact]["match"][0], {}, exact, verdict[rules[exact]["action"]]),
        Call(
            f"prefix wildcard, rule {prefix}",
            rules[prefix]["match"][0][:-1] + "x",
            {},
            prefix,
            verdict[rules[prefix]["action"]],
        ),
    ]


def check_mix(policy: Policy, calls: list[Call]) -> list[str]:
    bad = []
    for c in calls:
        v = evaluate(policy, c.tool, c.input, autonomous=False)
        if (v.rule, v.action) != (c.rule, c.action):
            bad.append(f"{c.label}: want rule {c.rule} {c.action}, got rule {v.rule} {v.action}")
    return bad


def run_spec(doc: dict[str, Any], policy: Policy) -> RunSpec:
    return RunSpec(
        run_id="00000000-0000-0000-0000-000000000001",
        tenant_id="00000000-0000-0000-0000-000000000002",
        agent_id="00000000-0000-0000-0000-000000000003",
        agent_revision_id="00000000-0000-0000-0000-000000000004",
        agent_name="bench",
        harness="replay",
        model="replay",
        task="bench",
        workspace=WorkspaceSpec(),
        autonomy="supervised",
        budgets=policy.budgets,
        policy_id="00000000-0000-0000-0000-000000000005",
        policy_name=policy.name,
        policy_version=1,
        policy_snapshot=doc,
    )


# ---------------------------------------------------------------------------------------------------
# In process


@dataclass
class Subject:
    key: str
    what: str
    policy: str
    fn: Callable[[str, dict[str, Any]], object]
    calls: list[Call]
    total: int
    ns: list[int] = field(default_factory=list)
    by_call: dict[int, list[int]] = field(default_factory=dict)

    @functools.cached_property
    def stats(self) -> gb.Round:
        """As a gate-bench Round (seconds), for its percentiles; ``wall`` is the summed call time.
        Read only once every batch has run."""
        return gb.Round(self.key, [x / 1e9 for x in self.ns], sum(self.ns) / 1e9)

    def us(self, q: int) -> float:
        return self.stats.pct(q) * 1000.0


def time_batch(s: Subject, n: int, start: int) -> None:
    fn, calls, out, by_call, clock = s.fn, s.calls, s.ns, s.by_call, time.perf_counter_ns
    m = len(calls)
    for i in range(start, start + n):
        c = calls[i % m]
        tool, inp = c.tool, c.input
        t0 = clock()
        fn(tool, inp)
        t1 = clock()
        out.append(t1 - t0)
        by_call.setdefault(i % m, []).append(t1 - t0)


def timer_overhead() -> int:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(20_000):
        t0 = clock()
        t1 = clock()
        samples.append(t1 - t0)
    return int(statistics.median(samples))


@dataclass
class InProcess:
    subjects: dict[str, Subject]
    calls: list[Call]
    rules: int
    default_rules: int
    regexes: int
    globs: int
    overhead_ns: int
    batches: int


PARSE = "`Policy.model_validate(snapshot)`"
SUBJECTS = ("eval", "decide", "snapshot", "parse")


def in_process(args: argparse.Namespace) -> InProcess:
    big_doc = build_policy()
    big = parse_policy(big_doc)  # the same strict parse the import route runs
    assert len(big.tools) == 500, len(big.tools)
    if yaml.safe_load(yaml.safe_dump(big_doc, sort_keys=False)) != big_doc:
        raise gb.BenchError("the large policy does not survive a YAML round trip")
    small_doc, small = load_default()
    calls = call_mix(big_doc)
    bad = check_mix(big, calls)
    if bad:
        raise gb.BenchError("the large policy does not decide the mix as built: " + "; ".join(bad))
    gate_calls = [c for c in calls if not c.tool.startswith("mcp__")]  # the gate denies those first
    big_spec, small_spec = run_spec(big_doc, big), run_spec(small_doc, small)
    n, nd = args.evals, args.decide_evals
    subjects = [
        Subject("eval-large", "`evaluate`", "500 rules", functools.partial(evaluate, big, autonomous=False), calls, n),
        Subject(
            "eval-default", "`evaluate`", "default", functools.partial(evaluate, small, autonomous=False), calls, n
        ),
        Subject(
            "decide-large",
            "`decide` (RunSpec)",
            "500 rules",
            functools.partial(decide, big_spec, registered_calls=1),
            gate_calls,
            nd,
        ),
        Subject(
            "decide-default",
            "`decide` (RunSpec)",
            "default",
            functools.partial(decide, small_spec, registered_calls=1),
            gate_calls,
            nd,
        ),
        Subject("snapshot-large", "`RunSpec.policy()` alone", "500 rules", lambda t, i: big_spec.policy(), calls, nd),
        Subject("snapshot-default", "`RunSpec.policy()` alone", "default", lambda t, i: small_spec.policy(), calls, nd),
        Subject("parse-large", PARSE, "500 rules", lambda t, i: Policy.model_validate(big_doc), calls, nd),
        Subject("parse-default", PARSE, "default", lambda t, i: Policy.model_validate(small_doc), calls, nd),
    ]
    say(f"• in process: warm-up, then {args.batches} interleaved batches per subject")
    for s in subjects:
        time_batch(s, max(len(s.calls), min(s.total // 10, 5_000)), 0)
        s.ns.clear()
        s.by_call.clear()
    done = dict.fromkeys((s.key for s in subjects), 0)
    t0 = time.monotonic()
    for b in range(args.batches):
        for s in subjects:
            size = s.total * (b + 1) // args.batches - done[s.key]
            gc.collect()
            time_batch(s, size, done[s.key])
            done[s.key] += size
        if (b + 1) % max(1, args.batches // 4) == 0:
            say(f"  batch {b + 1}/{args.batches} ({time.monotonic() - t0:.0f}s)")
    for s in subjects:
        say(f"  {s.key:17s} p50 {s.us(50):8.1f} µs  p99 {s.us(99):8.1f} µs  {s.stats.rate:9.0f}/s  ({s.stats.count})")
    regexes = sum(len(r["shell"]["deny_regex"]) for r in big_doc["tools"] if "shell" in r)
    globs = sum(len(r["paths"]["allow"]) + len(r["paths"]["deny"]) for r in big_doc["tools"] if "paths" in r)
    return InProcess(
        {s.key: s for s in subjects},
        calls,
        len(big.tools),
        len(small.tools),
        regexes,
        globs,
        timer_overhead(),
        args.batches,
    )


# ---------------------------------------------------------------------------------------------------
# Over HTTP


async def start_runs(api: httpx.AsyncClient, agent: str, policy: str, runs: int, ids: list[str], within: float) -> None:
    """Start ``runs`` runs of ``agent`` and wait until they run on ``policy``.

    The second half of ``bench/gate.py``'s ``setup_runs``, which cannot be called twice (it imports
    its policy and creates its agent first).
    """
    for _ in range(runs):
        r = await api.post("/v1/sessions", json={"agent": agent, "task": "bench"})
        if r.status_code != 200:
            raise gb.BenchError(f"starting a run failed: HTTP {r.status_code} {r.text[:300]}")
        ids.append(r.json()["session"]["id"])
    say(f"• started {runs} runs on {policy}; waiting until all are running")
    deadline = time.monotonic() + within
    pending = set(ids)
    while pending and time.monotonic() < deadline:
        for rid in sorted(pending):
            r = await api.get(f"/v1/sessions/{rid}")
            session = r.json()["session"] if r.status_code == 200 else {}
            if session.get("run_spec", {}).get("policy_name") not in (None, policy):
                raise gb.BenchError(f"run {rid} runs on {session['run_spec']['policy_name']}, not {policy}")
            if session.get("status") == "running":
                pending.discard(rid)
            elif session.get("status") in gb.NOT_STARTING:
                raise gb.BenchError(f"run {rid} is {session['status']} before the benchmark: {session}")
        if pending:
            await asyncio.sleep(0.5)
    if pending:
        raise gb.BenchError(f"{len(pending)} of {runs} runs were not running after {within:.0f}s")


KINDS = ("baseline", "small", "large")  # GET /internal/health; the gate on the small and on the large policy


async def reconnect(stack: Stack, transport: str, clients: list[gb.Client]) -> None:
    """Give each client a new connection, opened with one untimed ``GET /internal/health``.

    A group sits idle while the other kinds run, longer than the API's keep-alive timeout (uvicorn's
    default, 5 s): a request that races the server closing its idle connection fails with ReadError.
    """

    async def one(cl: gb.Client) -> None:
        old = cl.http
        token = old.headers["authorization"].removeprefix("Bearer ")
        cl.http = gb.make_client(stack, transport, cl.run_id, token).http  # cl keeps its tool_call_id seq
        await old.aclose()
        with contextlib.suppress(httpx.HTTPError):
            await cl.http.get("/internal/health")

    await asyncio.gather(*(one(cl) for cl in clients))


async def kind_round(
    stack: Stack, transport: str, kind: str, clients: list[gb.Client], n: int, tally: gb.Tally, tag: str
) -> gb.Round:
    await reconnect(stack, transport, clients)
    rnd = await gb.run_round("baseline" if kind == "baseline" else "gate", clients, n, tally, f"{kind}-{tag}")
    rnd.kind = kind
    return rnd


async def measure_http(
    stack: Stack,
    transport: str,
    tokens: dict[str, dict[str, str]],
    args: argparse.Namespace,
    tally: gb.Tally,
) -> gb.Result:
    groups = {k: [gb.make_client(stack, transport, rid, tok) for rid, tok in tokens[k].items()] for k in tokens}
    groups["baseline"] = groups["large"]
    try:
        say(f"• [{transport}] warm-up ({args.warmup} requests per client and kind)")
        for kind in KINDS:
            await kind_round(stack, transport, kind, groups[kind], args.warmup, tally, f"{transport}-warm")
        idle = {}
        for kind in KINDS:
            rnd = await kind_round(stack, transport, kind, groups[kind][:1], gb.IDLE_REQUESTS, tally, f"{transport}-i")
            idle[kind] = rnd.pct(50)
        say("  idle, one client: " + ", ".join(f"{k} p50 {idle[k]:.2f} ms" for k in KINDS))
        rounds: list[gb.Round] = []
        for i in range(args.rounds):
            order = KINDS if i % 2 == 0 else ("baseline", "large", "small")
            for kind in order:
                rnd = await kind_round(stack, transport, kind, groups[kind], args.requests, tally, f"{transport}-r{i}")
                rounds.append(rnd)
                say(
                    f"  round {i + 1} {kind:8s}: p50 {rnd.pct(50):7.1f} ms  p99 {rnd.pct(99):7.1f} ms  "
                    f"{rnd.rate:7.0f}/s  ({rnd.count} requests in {rnd.wall:.1f}s)"
                )
    finally:
        clients = groups["small"] + groups["large"]
        await asyncio.gather(*(cl.http.aclose() for cl in clients), return_exceptions=True)
    return gb.Result(transport, rounds, idle)


@dataclass
class OverHttp:
    results: list[gb.Result]
    tally: gb.Tally


async def over_http(args: argparse.Namespace) -> OverHttp:
    # The stack as bench/gate.py's bench() starts it (inline there, not a helper).
    stack = Stack.ephemeral("fbxp-", {"FLUIDBOX_REPLAY_DELAY_MS": "0"})
    home = stack.home
    ids: list[str] = []
    ok = False
    api: httpx.AsyncClient | None = None
    try:
        say(f"• starting the stack in {home}")
        t0 = time.monotonic()
        token = await stack.start()
        say(f"• stack up in {time.monotonic() - t0:.1f}s (API {stack.api_url})")
        api = httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=30)
        small_ids: list[str] = []
        large_ids: list[str] = []
        try:
            # The small `bench` policy, agent `bench` and its runs, exactly as bench/gate.py sets them up.
            await gb.setup_runs(api, args.runs, small_ids, within=args.start_timeout)
            r = await api.post("/v1/policies", json={"name": LARGE_NAME, "yaml": large_yaml()})
            if r.status_code != 200:
                raise gb.BenchError(f"importing the large policy failed: HTTP {r.status_code} {r.text[:300]}")
            # A new revision of the agent on the large policy; the runs started so far keep theirs.
            r = await api.post("/v1/agents/bench/revisions", json={"policy": LARGE_NAME})
            if r.status_code != 200:
                raise gb.BenchError(f"switching the agent's policy failed: HTTP {r.status_code} {r.text[:300]}")
            await start_runs(api, "bench", LARGE_NAME, args.runs, large_ids, within=args.start_timeout)
        finally:
            ids += small_ids + large_ids
        all_tokens = await gb.collect_tokens(stack.database_url or "", ids)
        tokens = {
            "small": {rid: all_tokens[rid] for rid in small_ids},
            "large": {rid: all_tokens[rid] for rid in large_ids},
        }
        say(f"• issued {len(all_tokens)} TOOL tokens")
        tally = gb.Tally()
        transports = ["tcp", "uds"] if args.transport == "both" else [args.transport]
        results = [await measure_http(stack, t, tokens, args, tally) for t in transports]
        if tally.mismatches or tally.allow_ok + tally.deny_ok != tally.sent:
            for ex in tally.examples:
                say(f"  {ex}")
            raise gb.BenchError(
                f"{tally.mismatches} responses did not match the expected decision "
                f"({tally.allow_ok + tally.deny_ok} of {tally.sent} gate decisions correct; examples above)"
            )
        ok = True
        return OverHttp(results, tally)
    finally:
        await gb.wind_down(stack, api, ids, ok)


def large_yaml() -> str:
    return yaml.safe_dump(build_policy(), sort_keys=False, width=1000)


# ---------------------------------------------------------------------------------------------------
# Report


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def render(args: argparse.Namespace, ip: InProcess, http: OverHttp | None) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    s = ip.subjects
    big, small = s["eval-large"], s["eval-default"]
    d_big, d_small, snap, parse = s["decide-large"], s["decide-default"], s["snapshot-large"], s["parse-large"]
    met = big.us(50) < TARGET_P50_US
    share = snap.us(50) / d_big.us(50)
    lines = [
        "## Policy engine with a large policy (500 rules)",
        "",
        f"Run {now}; {cpu_model()}, `nproc` {len(os.sched_getaffinity(0))}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}.",
        "",
        f"`bench/policy.py` builds a {ip.rules}-rule policy (seed {SEED}, no I/O): {N_EXACT} exact-name rules "
        f"over synthetic `mcp__svcN__opM` names, {N_PREFIX} prefix-wildcard rules, {N_SHELL} shell rules "
        f"({ip.regexes} deny regexes with alternations and `\\b`, 5-10 allow prefixes each), {N_FILE} "
        f'file rules ({ip.globs} allow and deny globs with `**` and `*`) and a final `match: ["*"]`. The '
        "rules the measured calls hit are the last three (a Bash rule, a file rule, the catch-all) plus "
        "one in the middle and one at 4/5, so most calls scan almost every rule. The baseline is the "
        f"seeded `default` policy ({ip.default_rules} rules), with the same calls, in the same run.",
        "",
        "### In process",
        "",
        f"Each call timed with `time.perf_counter_ns` (timer overhead {ip.overhead_ns} ns, included), "
        f"in {ip.batches} batches per subject that alternate between the subjects, after a warm-up; "
        "`gc.collect()` before each batch. `decide` gets the calls of the mix without the MCP ones "
        "(the gate denies those before the policy: not in the run's frozen tool set).",
        "",
        "| subject | policy | calls | p50 (µs) | p99 (µs) | calls/s | p50 vs default |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key in (f"{k}-{p}" for k in SUBJECTS for p in ("large", "default")):
        x = s[key]
        base = s[key.replace("large", "default")]
        lines.append(
            f"| {x.what} | {x.policy} | {x.stats.count} | {x.us(50):.1f} | {x.us(99):.1f} "
            f"| {x.stats.rate:,.0f} | {x.us(50) / base.us(50):.1f}x |"
        )
    lines += [
        "",
        f"Target (from the issue): a 500-rule evaluation under {TARGET_P50_US:.0f} µs p50 in process: "
        f"**{big.us(50):.1f} µs, {'met' if met else 'missed'}** ({big.us(50) / small.us(50):.1f}x the "
        f"{ip.default_rules}-rule default policy; {big.stats.rate:,.0f} evaluations/s on one core).",
        "",
        f"The gate's `decide` on a RunSpec carrying the 500-rule policy: {d_big.us(50):.0f} µs p50 "
        f"({d_big.us(50) / d_small.us(50):.0f}x the default policy's {d_small.us(50):.1f} µs). ",
    ]
    if snap.us(50) < 0.1 * parse.us(50):
        lines[-1] += (
            f"`RunSpec.policy()` returns a parse cached on the RunSpec ({snap.us(50):.1f} µs p50, "
            f"{share:.0%} of `decide`); parsing the 500-rule snapshot costs {parse.us(50):.0f} µs p50, "
            "once per RunSpec instance (the API's store caches RunSpecs per run)."
        )
    else:
        lines[-1] += (
            f"`RunSpec.policy()` validates the policy snapshot again on every call: {snap.us(50):.0f} µs "
            f"p50 alone, **{share:.0%} of `decide`** (a parse of the snapshot: {parse.us(50):.0f} µs)."
        )
    scan = big.by_call[0]
    lines += [
        "",
        "Where the time goes: the cost of an evaluation grows with the index of the rule that decides "
        "it, not with what that rule checks (table below): the first-match scan over the rules' "
        f"`match` names costs about {statistics.median(scan) / 1000 / ip.rules:.2f} µs per rule scanned "
        "(the catch-all call), whereas the deciding rule's regexes or globs add little.",
        "",
        "<details><summary>Per call of the mix (p50, µs)</summary>",
        "",
        "| call | rule (500-rule policy) | verdict | `evaluate`, 500 rules | per rule scanned | `evaluate`, default |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for i, c in enumerate(ip.calls):
        p_big = statistics.median(big.by_call[i]) / 1000
        p_small = statistics.median(small.by_call[i]) / 1000
        per_rule = p_big / ((c.rule or 0) + 1)
        lines.append(f"| {c.label} | {c.rule} | {c.action} | {p_big:.1f} | {per_rule:.2f} | {p_small:.1f} |")
    lines += ["", "</details>"]
    if http is not None:
        lines += render_http(args, http, ip.calls[1].rule, d_big.us(50) - d_small.us(50))
    return "\n".join(lines)


def render_http(args: argparse.Namespace, http: OverHttp, bash_rule: int | None, extra_us: float) -> list[str]:
    lines = [
        "",
        "### Over HTTP: the gate with the 500-rule policy",
        "",
        f"As `bench/gate.py`: {args.runs} idle runs on the small `bench` policy (one Bash rule) and "
        f"{args.runs} on the 500-rule policy, one keep-alive `httpx.AsyncClient` each; {args.requests} "
        "requests per client per round (`ls -la` allowed and `curl x` denied, interleaved: on the large "
        f"policy both decided by rule {bash_rule}); {args.rounds} rounds "
        f"of each kind (baseline `GET /internal/health`, gate on the small policy, gate on the 500-rule "
        "policy), interleaved, after a warm-up; medians of the rounds. Each kind runs alone, at "
        f"{args.runs} concurrent clients; before each of its rounds a client reconnects (one untimed "
        "`GET /internal/health`), as its group sits idle longer than the API's 5 s keep-alive timeout.",
        "",
        "| transport | 500 rules p50 (ms) | p99 (ms) | decisions/s | small p50 (ms) | p99 (ms) | decisions/s "
        "| baseline p50 (ms) | p99 (ms) | req/s | p50 500/small | p50 500/baseline | p99 500/baseline |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in http.results:
        g, m, b = res.summary("large"), res.summary("small"), res.summary("baseline")
        lines.append(
            f"| {gb.LABEL[res.transport]} | {g['p50']:.1f} | {g['p99']:.1f} | {g['rate']:.0f} | {m['p50']:.1f} "
            f"| {m['p99']:.1f} | {m['rate']:.0f} | {b['p50']:.1f} | {b['p99']:.1f} | {b['rate']:.0f} "
            f"| **{g['p50'] / m['p50']:.1f}x** | **{g['p50'] / b['p50']:.1f}x** | **{g['p99'] / b['p99']:.1f}x** |"
        )
    lines += [
        "",
        f"In process the 500-rule policy adds {extra_us:.0f} µs to a `decide` (p50, above). Over HTTP:",
        "",
    ]
    for res in http.results:
        small_p50 = [r.pct(50) for r in res.rounds if r.kind == "small"]
        spread = (max(small_p50) - min(small_p50)) / statistics.median(small_p50)
        ratio = res.summary("large")["p50"] / res.summary("small")["p50"]
        lines.append(
            f"* {gb.LABEL[res.transport]}: {extra_us / 1000 / res.idle['small']:.0%} of an idle gate request on "
            f"the small policy ({res.idle['small']:.2f} ms; {res.idle['large']:.2f} ms on the 500-rule "
            f"policy); under load the 500-rule/small p50 ratio, {ratio:.2f}x, is "
            f"{'within' if abs(ratio - 1) <= spread else 'outside'} the spread of the small policy's own "
            f"rounds ({spread:.0%})."
        )
    lines += [
        "",
        "Idle latency, p50 of one client's sequential requests with nothing else running:",
        "",
        "| transport | baseline (ms) | gate, small policy (ms) | gate, 500 rules (ms) |",
        "|---|---:|---:|---:|",
    ]
    for res in http.results:
        i = res.idle
        lines.append(f"| {gb.LABEL[res.transport]} | {i['baseline']:.2f} | {i['small']:.2f} | {i['large']:.2f} |")
    t = http.tally
    lines += [
        "",
        f"Correctness: {t.allow_ok} allows and {t.deny_ok} denies as expected (warm-up included), "
        f"{t.mismatches} mismatches.",
        "",
        "<details><summary>Per round</summary>",
        "",
        "| transport | round | kind | p50 (ms) | p99 (ms) | /s |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for res in http.results:
        for i, rnd in enumerate(res.rounds):
            lines.append(
                f"| {res.transport} | {i // 3 + 1} | {rnd.kind} | {rnd.pct(50):.1f} | {rnd.pct(99):.1f} "
                f"| {rnd.rate:.0f} |"
            )
    lines += ["", "</details>"]
    return lines


# ---------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> int:
    try:
        ip = in_process(args)
        http = None if args.in_process else asyncio.run(over_http(args))
    except (gb.BenchError, StackError) as exc:
        say(f"FAIL: {exc}")
        return 1
    gb.publish(render(args, ip, http), "policy", args.write)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Benchmark the policy engine and the gate with a 500-rule policy.")
    p.add_argument("--evals", type=int, default=200_000, help="in-process evaluations per policy (default 200000)")
    p.add_argument(
        "--decide-evals",
        type=int,
        default=20_000,
        help="in-process decide and RunSpec.policy() calls per policy (default 20000)",
    )
    p.add_argument("--batches", type=int, default=20, help="in-process batches per subject (default 20)")
    p.add_argument("--runs", type=int, default=64, help="concurrent runs per policy, one client each (default 64)")
    p.add_argument("--requests", type=int, default=80, help="requests per client per round (default 80)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each kind (default 3)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up requests per client and kind (default 10)")
    p.add_argument(
        "--transport",
        choices=["tcp", "uds", "both"],
        default="tcp",
        help="TCP to the API's bind address (default), the sandbox gateway's Unix socket, or both",
    )
    p.add_argument("--start-timeout", type=float, default=300, help="seconds to wait for the runs to start")
    p.add_argument("--in-process", action="store_true", help="only the in-process part (prints only)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small smoke run: 20000 evaluations, 8 runs, 10 requests (prints only, unless --write)",
    )
    p.add_argument(
        "--write",
        dest="write",
        action="store_true",
        default=None,
        help="update docs/benchmarks.md (the default, except with --quick and --in-process)",
    )
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/benchmarks.md")
    args = p.parse_args(argv)
    if args.quick:
        args.evals, args.decide_evals, args.batches = 20_000, 2_000, 5
        args.runs, args.requests, args.warmup = 8, 10, 4
    if args.write is None:
        args.write = not (args.quick or args.in_process)
    if args.in_process and args.write:
        p.error("--in-process only prints")
    if min(args.evals, args.decide_evals, args.batches, args.runs, args.rounds, args.warmup) < 1 or args.requests < 2:
        p.error("counts must be >= 1, --requests >= 2")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
