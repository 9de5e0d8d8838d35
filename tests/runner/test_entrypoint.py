"""The runner's start: one fresh interpreter per run, so what it imports is paid at every start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_replay_runner_starts_on_the_standard_library_alone() -> None:
    # Together they cost a start about 0.3 s of CPU; a burst of runs pays that once per run.
    probe = (
        "import sys, runner.harness, runner.replay, runner.gateway, runner.heartbeat, runner.tools\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'httpx', 'pydantic_core'))\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe],  # as a sandbox starts it: no site-packages
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == ""
