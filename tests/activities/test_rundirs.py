"""Run directories: private while a run lives, removed once it is recorded (at once or after the retention)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from activities import rundirs


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def a_run(runs: Path, name: str) -> Path:
    run_dir = runs / name
    rundirs.make_private(runs, run_dir)
    (run_dir / "workspace").mkdir()
    (run_dir / "workspace" / "app.py").write_text("print('hi')\n")
    (run_dir / "sandbox.log").write_text("log\n")
    return run_dir


def test_runs_and_each_run_directory_are_private(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    run_dir = a_run(runs, "run-1")

    assert (mode(runs), mode(run_dir)) == (0o700, 0o700)


def test_without_retention_the_directory_goes_at_once_and_symlinks_are_not_followed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run's")
    run_dir = a_run(runs, "run-1")
    (run_dir / "workspace" / "link").symlink_to(outside)

    rundirs.retire(runs, run_dir, 0)

    assert not run_dir.exists()
    assert (outside / "keep.txt").read_text() == "not the run's"


def test_with_retention_finished_directories_stay_until_they_age_out_and_live_ones_never_go(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old, recent, live = a_run(runs, "old"), a_run(runs, "recent"), a_run(runs, "live")
    rundirs.retire(runs, old, 3600, now=1_000.0)
    os.utime(old / rundirs.FINISHED_MARK, (1_000.0, 1_000.0))

    rundirs.retire(runs, recent, 3600, now=1_000.0 + 3599)
    assert old.exists() and recent.exists() and live.exists()

    rundirs.retire(runs, recent, 3600, now=1_000.0 + 3600)
    assert not old.exists()
    assert recent.exists() and live.exists(), "only what aged out goes; a run without the mark is live"

    assert rundirs.sweep(runs, 3600, now=(recent / rundirs.FINISHED_MARK).stat().st_mtime + 3600) == ["recent"]
    assert live.exists()


def test_retiring_a_directory_that_is_already_gone_is_fine(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    rundirs.retire(runs, runs / "gone", 0)
    rundirs.retire(runs, runs / "gone", 60)
    assert list(runs.iterdir()) == []
