"""Benchmark deferred discovery's ``tool_search`` over 1,000 frozen tools, in process.

Builds a deterministic RunSpec with four brokered surfaces of 250 tools each (``<verb>_<noun>`` names, one-line
descriptions, verb-dependent input schemas: the shape real MCP servers photograph), then times, call by call with
``time.perf_counter_ns``, in batches that alternate so machine noise hits every subject alike:

* ``core.discovery.search`` over a fixed mix of queries (exact names, natural phrases, parameter names, a query
  that matches nothing), the index warm (it is built once per RunSpec and cached, as the API caches RunSpecs);
* baseline 1, a linear substring scan: every tool's lower-cased name and description checked against every query
  word, first 10 hits kept (what a search without an index does);
* baseline 2, building the eager tool list: the JSON of every frozen schema that an eager run hands its sandbox
  (``FLUIDBOX_CAPABILITIES``) and its model, which a deferred run replaces with three tools.

It also times building the index (once per run). Every query's top hit is checked; a miss exits 1.

Writes the ``bench:discovery`` section of ``docs/benchmarks.md`` and prints it.

    .venv/bin/python bench/discovery.py [--calls 20000] [--rounds 5] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gate import write_doc  # noqa: E402
from core import discovery  # noqa: E402
from core.policy import Budgets  # noqa: E402
from core.runspec import RunSpec, WorkspaceSpec  # noqa: E402

TARGET_P50_MS = 2.0
SLOTS = ("crm", "desk", "ops", "git")
VERBS = ("create", "list", "get", "update", "delete", "archive", "restore", "export", "share", "watch")
NOUNS = tuple(
    f"{base}{suffix}"
    for suffix in ("", "_item", "_group", "_note", "_link")
    for base in ("invoice", "customer", "ticket", "project", "deployment", "alert", "report", "channel", "order",
                 "payment", "webhook", "bucket", "pipeline", "release", "comment", "contact", "campaign", "domain",
                 "volume", "team")
)  # fmt: skip
# (query, expected top hit)
QUERIES: list[tuple[str, str | None]] = [
    ("archive an invoice", "mcp__crm__archive_invoice"),
    ("mcp__ops__restore_pipeline_note", "mcp__ops__restore_pipeline_note"),
    ("share_webhook_link", "mcp__git__share_webhook_link"),
    ("export every payment group to a file", "mcp__desk__export_payment_group"),
    ("watch deployment alerts", None),
    ("delete customer note", "mcp__ops__delete_customer_note"),
    ("campaign_item_id", None),
    ("xyzzy frobnicate", None),
]


def tool(verb: str, noun: str) -> dict[str, Any]:
    words = noun.replace("_", " ")
    key = {"type": "string", "description": f"the {words}'s id"}
    props: dict[str, Any] = {f"{noun}_id": key} if verb not in ("create", "list") else {"title": {"type": "string"}}
    if verb == "export":
        props["format"] = {"type": "string", "enum": ["csv", "json"]}
    return {
        "name": f"{verb}_{noun}",
        "description": f"{verb.capitalize()} a {words}" + (" to a CSV or JSON file." if verb == "export" else "."),
        "input_schema": {"type": "object", "properties": props, "required": list(props)[:1]},
    }


def make_spec() -> RunSpec:
    tools = [tool(v, n) for n in NOUNS for v in VERBS]
    assert len(tools) == 1000
    brokered = [
        {"slot": slot, "connection_id": f"conn-{slot}", "tools": tools[i * 250 : (i + 1) * 250]}
        for i, slot in enumerate(SLOTS)
    ]
    return RunSpec(
        run_id="bench-discovery", tenant_id="t", agent_id="a", agent_revision_id="r", agent_name="bench",
        harness="replay", model="replay", task="bench", workspace=WorkspaceSpec(), autonomy="supervised",
        budgets=Budgets(), policy_id="p", policy_name="p", policy_version=1, policy_snapshot={"name": "p"},
        brokered=brokered, tool_discovery="deferred",
    )  # fmt: skip


def substring_scan(spec: RunSpec, query: str, limit: int = 10) -> list[str]:
    words = [w for w in query.lower().split() if w]
    hits = []
    for surface in spec.brokered:
        for t in surface["tools"]:
            text = (t["name"] + " " + t["description"]).lower()
            if any(w in text for w in words):
                hits.append(f"mcp__{surface['slot']}__{t['name']}")
                if len(hits) == limit:
                    return hits
    return hits


def eager_list(spec: RunSpec) -> str:
    servers = [
        {"class": "brokered", "name": b["slot"], "tools": [
            {k: t.get(k) for k in ("name", "description", "input_schema")} for t in b["tools"]
        ]}
        for b in spec.brokered
    ]  # fmt: skip
    return json.dumps({"servers": servers})


@dataclass
class Subject:
    key: str
    what: str
    fn: Callable[[str], object]
    ns: list[int] = field(default_factory=list)

    def ms(self, q: int) -> float:
        if q == 50:
            return statistics.median(self.ns) / 1e6
        return statistics.quantiles(self.ns, n=100, method="inclusive")[q - 1] / 1e6


def time_batch(subject: Subject, n: int) -> None:
    fn, out, clock = subject.fn, subject.ns, time.perf_counter_ns
    queries = [q for q, _ in QUERIES]
    m = len(queries)
    for i in range(n):
        q = queries[i % m]
        t0 = clock()
        fn(q)
        out.append(clock() - t0)


def check(spec: RunSpec) -> list[str]:
    bad = []
    for query, want in QUERIES:
        got = discovery.search(spec, query)
        top = got[0]["name"] if got else None
        if want is not None and top != want:
            bad.append(f"{query!r}: want {want}, got {top}")
        if query == "xyzzy frobnicate" and got:
            bad.append(f"{query!r}: matched {top}")
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="timed calls per subject")
    parser.add_argument("--rounds", type=int, default=5, help="alternating batches per subject")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()

    spec = make_spec()
    problems = check(spec)
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        return 1
    eager_bytes = len(eager_list(spec))
    subjects = [
        Subject("search", "`core.discovery.search` (warm index), top 10", lambda q: discovery.search(spec, q)),
        Subject("scan", "baseline: linear substring scan, first 10", lambda q: substring_scan(spec, q)),
        Subject("eager", f"baseline: eager tool list JSON ({eager_bytes:,} bytes)", lambda q: eager_list(spec)),
    ]
    builds: list[int] = []
    gc.disable()
    try:
        per_batch = max(1, args.calls // args.rounds)
        for _ in range(args.rounds):
            for subject in subjects:
                time_batch(subject, per_batch)
            for _ in range(20):
                t0 = time.perf_counter_ns()
                discovery.build_index(spec)
                builds.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()

    search = subjects[0]
    lines = [
        "## tool_search over 1,000 frozen tools (deferred discovery)",
        "",
        f"`bench/discovery.py`, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
        f"(Python {platform.python_version()}), in process. 1,000 tools on 4 brokered surfaces; "
        f"{len(QUERIES)} queries in rotation; {per_batch * args.rounds} timed calls per subject in "
        f"{args.rounds} alternating batches. Target: search p50 under {TARGET_P50_MS:g} ms.",
        "",
        "| subject | p50 (ms) | p99 (ms) | p50 vs search |",
        "|---|---:|---:|---:|",
    ]
    for subject in subjects:
        ratio = subject.ms(50) / search.ms(50)
        lines.append(f"| {subject.what} | {subject.ms(50):.3f} | {subject.ms(99):.3f} | {ratio:.1f}x |")
    build_p50 = statistics.median(builds) / 1e6
    lines += [
        "",
        f"Building the index (once per RunSpec, then cached): p50 {build_p50:.1f} ms over {len(builds)} builds. "
        f"Search p50 **{search.ms(50):.3f} ms** "
        f"({'meets' if search.ms(50) < TARGET_P50_MS else 'MISSES'} the {TARGET_P50_MS:g} ms target); the expected "
        "top hits were checked first.",
    ]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_doc(section, "discovery")
    return 0


if __name__ == "__main__":
    sys.exit(main())
