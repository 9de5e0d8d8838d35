"""Run directories on the control plane's host: private while a run lives, removed once it is recorded.

``<runs_dir>/<run id>/`` holds the workspace copy the sandbox works on, the baseline git directory the
diff is taken against and the sandbox log. Nobody but the control plane has business there: both levels
are 0700. Once the run's diff and artifacts are in PostgreSQL the directory is removed, at once or after
``FLUIDBOX_RUN_DIR_RETENTION_SECS`` (kept for debugging; a sweep at each later finalization removes
what has aged out).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from sandbox import hostfs

FINISHED_MARK = ".finished"


def make_private(runs_dir: Path, run_dir: Path) -> None:
    """Create ``run_dir`` (and ``runs_dir``) readable by the control plane alone."""
    for path in (runs_dir, run_dir):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)


def retire(runs_dir: Path, run_dir: Path, retention_secs: float, *, now: float | None = None) -> None:
    """The run is recorded: remove its directory now, or mark it finished and sweep those aged out."""
    if retention_secs <= 0:
        _remove(run_dir)
        return
    if run_dir.is_dir():
        (run_dir / FINISHED_MARK).touch()
    sweep(runs_dir, retention_secs, now=now)


def sweep(runs_dir: Path, retention_secs: float, *, now: float | None = None) -> list[str]:
    """Remove every run directory marked finished more than ``retention_secs`` ago; returns their names."""
    current = time.time() if now is None else now
    removed: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(runs_dir):
            try:
                finished = os.stat(os.path.join(entry.path, FINISHED_MARK)).st_mtime
            except OSError:
                continue  # a live run, or not a run directory
            if current - finished >= retention_secs:
                _remove(Path(entry.path))
                removed.append(entry.name)
    return removed


def _remove(path: Path) -> None:
    # Never follows a symlink the agent left, and walks by descriptor without recursing: shutil.rmtree
    # raises RecursionError on a workspace 1,500 directories deep, whatever ignore_errors says.
    with contextlib.suppress(OSError):
        hostfs.remove_tree(str(path))
