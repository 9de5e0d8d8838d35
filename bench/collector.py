"""What the diff collector costs per file and per MB, before and after it was bounded (issue 24).

The collector (``activities/workspace.py``) walks the agent's tree at the end of a run, stores every entry as
a git object next to the baseline and lets git compare the two trees; ``prepare`` does the same walk for the
baseline at the start. Two implementations are measured in the same run, rounds interleaved so the machine's
noise falls on both alike:

* **before**: ``activities/workspace.py`` as it is on the merge base with ``main`` (read with ``git show``
  and imported as a module of its own: it imports nothing of ours);
* **after**: this tree's, with its budget, its executor of its own and its progress reports.

Per file, a tree of 20,000 small files (100 directories of 200, 70 bytes each): ``prepare`` (copy and
baseline), ``diff`` of the tree unchanged (every file read, hashed and found stored) and ``diff`` of the same
files all new (every one stored, and git's patch cut at 1 MiB). Per MB, one new file of random bytes: 200 MB
(over ``MAX_BLOB_BYTES``: hashed only) and 16 MB (stored as a blob: zlib at level 1). The files are in the page
cache when they are read: this is the collector's CPU, not the disk's. Reported: the median of the rounds, in
µs per file or ms per MB.

    .venv/bin/python bench/collector.py [--rounds 3] [--files 20000] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from activities import workspace  # noqa: E402
from bench import gate as gb  # noqa: E402
from bench.gate import say  # noqa: E402

MB = 1024 * 1024
BIG_MB = 200
BLOB_MB = 16


def before_module(tmp: Path) -> tuple[ModuleType, str]:
    """``activities/workspace.py`` as on the merge base with main, imported under a name of its own."""
    base = subprocess.run(
        ["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    source = subprocess.run(
        ["git", "show", f"{base}:activities/workspace.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    path = tmp / "workspace_before.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("workspace_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module, base[:7]


def small_tree(top: Path, files: int) -> None:
    per_dir = 200
    for d in range((files + per_dir - 1) // per_dir):
        (top / f"d{d:03}").mkdir(parents=True)
        for f in range(min(per_dir, files - d * per_dir)):
            (top / f"d{d:03}" / f"f{f:03}.txt").write_text(f"line {d} {f}\n" * 5)


async def timed(step: Callable[[], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    await step()
    return time.perf_counter() - t0


async def one_round(impl: ModuleType, tmp: Path, src: Path, blobs: dict[int, bytes]) -> dict[str, float]:
    files = sum(1 for _ in src.rglob("*.txt"))
    out: dict[str, float] = {}
    tmp.mkdir(parents=True)
    run = tmp / "unchanged"
    run.mkdir()
    out["prepare (copy + baseline), per file"] = await timed(lambda: impl.prepare(run, str(src))) / files * 1e6
    out["diff, tree unchanged, per file"] = await timed(lambda: impl.diff(run)) / files * 1e6
    run = tmp / "new"
    run.mkdir()
    await impl.prepare(run, None)
    shutil.copytree(src, run / "workspace", dirs_exist_ok=True)
    out["diff, every file new, per file"] = await timed(lambda: impl.diff(run)) / files * 1e6
    for size, data in blobs.items():
        run = tmp / f"big{size}"
        run.mkdir()
        await impl.prepare(run, None)
        (run / "workspace" / "big.bin").write_bytes(data)
        kind = "hashed" if size * MB > workspace.MAX_BLOB_BYTES else "stored"
        out[f"diff, one new {size} MB file ({kind}), per MB"] = await timed(partial(impl.diff, run)) / size * 1e3
    shutil.rmtree(tmp)
    return out


async def measure(rounds: int, files: int) -> tuple[dict[str, dict[str, list[float]]], str]:
    with tempfile.TemporaryDirectory(prefix="fbxcol-") as scratch:
        base = Path(scratch)
        before, commit = before_module(base)
        impls = {f"before ({commit})": before, "after": workspace}
        src = base / "src"
        small_tree(src, files)
        blobs = {BIG_MB: os.urandom(BIG_MB * MB), BLOB_MB: os.urandom(BLOB_MB * MB)}
        out: dict[str, dict[str, list[float]]] = {name: {} for name in impls}
        order = list(impls)
        for i in range(rounds):
            for name in order:
                got = await one_round(impls[name], base / f"r{i}-{name[:6]}", src, blobs)
                for key, value in got.items():
                    out[name].setdefault(key, []).append(value)
            say(f"• round {i + 1}/{rounds}")
            order.reverse()
    return out, commit


def render(rounds: int, files: int, out: dict[str, dict[str, list[float]]]) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    names = list(out)
    keys = list(out[names[0]])
    rows = []
    for key in keys:
        medians = [statistics.median(out[name][key]) for name in names]
        unit = "ms" if key.endswith("per MB") else "µs"
        cells = " | ".join(f"{m:.1f} {unit}" for m in medians)
        rows.append(f"| {key} | {cells} | {medians[1] / medians[0]:.2f}x |")
    return "\n".join(
        [
            "## Diff collector: cost per file and per MB",
            "",
            f"Run {now}; `nproc` {len(os.sched_getaffinity(0))}, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}.",
            f"Median of {rounds} interleaved rounds; {files} small files in 100 directories, one {BIG_MB} MB and "
            f"one {BLOB_MB} MB file of random bytes, read from the page cache.",
            "",
            f"| step | {' | '.join(names)} | after / before |",
            "|---|" + "---:|" * (len(names) + 1),
            *rows,
            "",
            f"At these rates the collection's {workspace.COLLECT_SECS:g} s time budget covers the walk of about "
            f"{workspace.COLLECT_SECS / statistics.median(out[names[1]][keys[1]]) * 1e6:,.0f} unchanged files, "
            f"and its {workspace.MAX_READ_BYTES // MB // 1024} GiB read budget costs about "
            f"{statistics.median(out[names[1]][keys[3]]) * workspace.MAX_READ_BYTES / MB / 1e3:.0f} s in files "
            f"hashed only and {statistics.median(out[names[1]][keys[4]]) * workspace.MAX_READ_BYTES / MB / 1e3:.0f} s "
            "in files stored as blobs. "
            "A file over the per-file cap "
            f"({workspace.MAX_HASH_BYTES // MB // 1024} GiB) costs one lstat, whatever its size.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Measure the diff collector's cost per file and per MB.")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every measurement (default 3)")
    p.add_argument("--files", type=int, default=20000, help="small files in the tree (default 20000)")
    p.add_argument("--write", dest="write", action="store_true", default=True, help="update docs/benchmarks.md")
    p.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/benchmarks.md")
    args = p.parse_args(argv)
    say(f"• {args.rounds} rounds, {args.files} files")
    out, _ = asyncio.run(measure(args.rounds, args.files))
    gb.publish(render(args.rounds, args.files, out), "collector", args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
