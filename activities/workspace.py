"""Workspace preparation and diff collection, control-plane side.

The agent's copy is diffed against a baseline git directory that lives outside the sandbox, so the
agent's own ``.git`` (if any) is never trusted and the original directory is never touched.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fluidbox",
    "GIT_AUTHOR_EMAIL": "fluidbox@localhost",
    "GIT_COMMITTER_NAME": "fluidbox",
    "GIT_COMMITTER_EMAIL": "fluidbox@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
}
MAX_DIFF_BYTES = 1024 * 1024


class WorkspaceError(Exception):
    pass


async def _git(baseline: Path, worktree: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "git",
        f"--git-dir={baseline}",
        f"--work-tree={worktree}",
        "-c",
        "safe.directory=*",
        "-c",
        "core.autocrlf=false",
        "-c",
        "commit.gpgsign=false",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GIT_ENV},
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise WorkspaceError(f"git {args[0]} failed: {err.decode(errors='replace').strip()[:500]}")
    return out.decode(errors="replace")


def _copy(source: Path | None, dest: Path, baseline: Path) -> int:
    if source is not None and (not source.is_absolute() or not source.is_dir()):
        raise WorkspaceError(f"workspace path {source} is not an existing absolute directory")
    for stale in (dest, baseline):  # a retried preparation starts over
        if stale.exists():
            shutil.rmtree(stale)
    if source is not None:
        shutil.copytree(source, dest, symlinks=True)
    else:
        dest.mkdir(parents=True)
    dest.chmod(0o755)
    return sum(len(files) for _, _, files in os.walk(dest))


async def prepare(run_dir: Path, source: str | None) -> tuple[str, int]:
    """Copy ``source`` (or nothing, for scratch) into ``run_dir/workspace`` and commit a baseline."""
    worktree, baseline = run_dir / "workspace", run_dir / "baseline.git"
    files = await asyncio.to_thread(_copy, Path(source) if source else None, worktree, baseline)
    await _git(baseline, worktree, "init", "-q")
    await _git(baseline, worktree, "add", "-A")
    await _git(baseline, worktree, "commit", "-q", "--allow-empty", "-m", "fluidbox baseline")
    return (await _git(baseline, worktree, "rev-parse", "HEAD")).strip(), files


async def diff(run_dir: Path) -> tuple[str, bool]:
    """The workspace's changes against the baseline as a binary-safe patch, and whether it was cut."""
    worktree, baseline = run_dir / "workspace", run_dir / "baseline.git"
    if not await asyncio.to_thread(lambda: baseline.exists() and worktree.exists()):
        raise WorkspaceError("workspace is gone")
    await _git(baseline, worktree, "add", "-A")
    patch = await _git(baseline, worktree, "diff", "--cached", "--binary", "HEAD")
    if len(patch.encode()) > MAX_DIFF_BYTES:
        return patch.encode()[:MAX_DIFF_BYTES].decode(errors="ignore") + "\n(diff truncated)\n", True
    return patch, False
