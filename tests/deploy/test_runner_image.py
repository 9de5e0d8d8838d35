"""Every shipped sandbox-class catalog entry launches a command that exists where the sandbox runs it: in the
runner image (``deploy/runner/Dockerfile``'s file list) and in a bubblewrap sandbox (the code dirs it binds)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from activities.runs import RUNNER_CODE_DIRS
from sandbox.bubblewrap import CODE_ROOT

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "runner" / "Dockerfile").read_text()
SANDBOX_ENTRIES = [
    e for e in yaml.safe_load((ROOT / "catalog" / "connectors.yaml").read_text()) if e.get("sandbox_launch")
]


def image_files() -> dict[str, Path]:
    """Image path → the repository directory the Dockerfile copies there (``COPY <src> <dst>``)."""
    return {dst.rstrip("/"): ROOT / src for src, dst in re.findall(r"^COPY\s+(\S+)\s+(\S+)\s*$", DOCKERFILE, re.M)}


def resolve(path: str, copies: dict[str, Path]) -> Path | None:
    for dst, src in copies.items():
        if path == dst or path.startswith(dst + "/"):
            return src / path[len(dst) :].lstrip("/")
    return None


def test_the_catalog_ships_sandbox_class_entries() -> None:
    assert {e["slug"] for e in SANDBOX_ENTRIES} >= {"workspace-info"}


@pytest.mark.parametrize("entry", SANDBOX_ENTRIES, ids=lambda e: e["slug"])
def test_a_sandbox_entrys_command_and_files_exist_in_the_runner_image_and_in_bubblewrap(
    entry: dict[str, object],
) -> None:
    launch = entry["sandbox_launch"]
    assert isinstance(launch, dict)
    command, args = launch["command"], list(launch.get("args") or [])
    # The image's interpreter (python:3.11 on PATH as python3), the one a bubblewrap sandbox finds first on PATH too.
    assert command in ("python3", "python") and DOCKERFILE.startswith("#") and "FROM python:3.11" in DOCKERFILE
    assert "-m" not in args, "a capability server gets no PYTHONPATH: start it by path"
    copies = image_files()
    bound = {f"{CODE_ROOT}/{d.name}": d for d in RUNNER_CODE_DIRS}
    for arg in (a for a in args if a.startswith("/")):
        in_image = resolve(arg, copies)
        assert in_image is not None and in_image.is_file(), f"{arg} is not in the runner image"
        in_sandbox = resolve(arg, bound)
        assert in_sandbox is not None and in_sandbox.is_file(), f"{arg} is not bound into a bubblewrap sandbox"
        # What it imports beyond the standard library is installed in the image.
        for module in re.findall(r"^(?:from|import) (\w+)", in_image.read_text(), re.M):
            if module not in {"__future__", "json", "os", "stat", "sys", "re", "pathlib", "typing"}:
                assert re.search(rf"pip install [^\n]*\"{module}[>=<]", DOCKERFILE), f"{arg} imports {module}"
