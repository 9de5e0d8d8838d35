"""The runner's start: one fresh interpreter per run, so what it imports is paid at every start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Standard-library modules a local replay run never needs at its start, each a few ms of CPU that a burst of
# runs pays once per run (issue 12): the Pod path's transfer machinery (runner.remote: tarfile, hashlib) and
# http.client with the email parser and ssl it loads (the gateway's socket speaks its own small HTTP/1.1), and
# dataclasses with the inspect it loads (the runner's value types are NamedTuples or plain classes), and
# importlib.resources with tempfile, shutil and zipfile (the baked transcript is read with open()), and
# pathlib and urllib until a tool touches a file or the control URL has a path.
NOT_AT_START = (
    *("runner.remote", "tarfile", "hashlib", "http", "email", "ssl", "dataclasses", "inspect"),
    *("importlib.resources", "tempfile", "shutil", "zipfile", "traceback", "pathlib", "urllib", "ipaddress"),
)


def _loaded_at_start(names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` (top-level packages or exact modules) a replay runner's start has loaded."""
    probe = (
        "import sys, runner.harness, runner.replay, runner.gateway, runner.heartbeat, runner.tools\n"
        # The gateway a local run builds at its start (core.runner_env's URL and socket).
        "env = {'FLUIDBOX_CONTROL_URL': 'http://fluidbox', 'FLUIDBOX_CONTROL_SOCKET': '/run/fluidbox/api.sock'}\n"
        "runner.gateway.Gateway.from_env(runner.gateway.Credentials('s', 'c', 't', 'l'), env)\n"
        f"names = {names!r}\n"
        "hit = sorted(m for m in sys.modules if m in names or m.split('.')[0] in names)\n"
        "print(','.join(hit))\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe],  # as a sandbox starts it: no site-packages
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_the_replay_runner_starts_on_the_standard_library_alone() -> None:
    # Together they cost a start about 0.3 s of CPU; a burst of runs pays that once per run.
    assert _loaded_at_start(("pydantic", "httpx", "pydantic_core")) == []


def test_the_replay_runner_start_leaves_what_only_other_paths_need_unloaded() -> None:
    assert _loaded_at_start(NOT_AT_START) == []
