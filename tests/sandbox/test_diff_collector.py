"""The diff collector treats the agent's tree as plain data: nothing in it can hide, rewrite or run anything.

Each test prepares a real baseline from a small source tree, plays the agent (a backdoor in app.py plus
one trick that would make git hide, skip, transform or execute something), collects the diff with real
git, and requires the backdoor and the trick itself in the patch. Tricks that could run a command point
it at a marker file; no marker may ever appear.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from activities import workspace
from tests.helpers import eventually

BACKDOOR = 'if user == "mallory": return True  # BACKDOOR'
APP = 'def allowed(user):\n    return user == "admin"\n'
HOSTILE_CONFIG = (
    "[core]\n\tfsmonitor = {cmd}\n\thooksPath = hooks\n"
    '[filter "pwn"]\n\tclean = {cmd}\n\tsmudge = {cmd}\n\tprocess = {cmd}\n\trequired = true\n'
    '[diff "pwn"]\n\tcommand = {cmd}\n\ttextconv = {cmd}\n'
)


def git(cwd: Path, *args: str) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@a",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@a",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "source"
    src.mkdir()
    (src / "app.py").write_text(APP)
    (src / "README.md").write_text("# demo\n")
    return src


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """A file that only an executed agent-configured command would create."""
    return tmp_path / "pwned"


def plant_backdoor(ws: Path) -> None:
    (ws / "app.py").write_text(APP.replace("    return", f"    {BACKDOOR}\n    return"))


async def collect(tmp_path: Path, source: Path, agent: Callable[[Path], None]) -> str:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await workspace.prepare(run_dir, str(source))
    ws = run_dir / "workspace"
    plant_backdoor(ws)
    agent(ws)
    patch, truncated = await workspace.diff(run_dir)
    assert not truncated
    assert f"+    {BACKDOOR}" in patch, patch
    return patch


def hostile_repo(path: Path, marker: Path, *, commit: bool) -> None:
    """A nested repository whose config, hooks and attributes would all create ``marker`` if obeyed."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    cmd = f"touch {marker}"
    (path / ".git" / "config").write_text(HOSTILE_CONFIG.format(cmd=cmd))
    for hook in ("pre-commit", "post-checkout", "post-index-change", "fsmonitor-watchman"):
        script = path / ".git" / "hooks" / hook
        script.write_text(f"#!/bin/sh\n{cmd}\n")
        script.chmod(0o755)
    (path / "hidden.py").write_text("HIDDEN_PAYLOAD = 1\n")
    if commit:
        git(path, "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "add", "hidden.py")
        git(path, "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "commit", "-qm", "x")


async def test_a_nested_repository_without_commits_cannot_suppress_the_diff(tmp_path: Path, source: Path) -> None:
    def agent(ws: Path) -> None:  # the finding: three plain writes, no shell
        (ws / "zz" / ".git" / "objects").mkdir(parents=True)
        (ws / "zz" / ".git" / "refs" / "heads").mkdir(parents=True)
        (ws / "zz" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")

    patch = await collect(tmp_path, source, agent)
    assert "diff --git a/zz/.git/HEAD b/zz/.git/HEAD\nnew file mode 100644" in patch
    assert "+ref: refs/heads/main" in patch


async def test_a_nested_repository_with_commits_is_diffed_as_files_not_a_gitlink(
    tmp_path: Path, source: Path, marker: Path
) -> None:
    patch = await collect(tmp_path, source, lambda ws: hostile_repo(ws / "vendor", marker, commit=True))
    assert "+HIDDEN_PAYLOAD = 1" in patch
    assert "b/vendor/.git/HEAD" in patch and "b/vendor/.git/config" in patch
    assert "Subproject commit" not in patch and "160000" not in patch
    assert not marker.exists()


async def test_a_gitdir_file_is_a_plain_file_and_its_target_is_never_read(tmp_path: Path, source: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    git(elsewhere, "init", "-q")

    def agent(ws: Path) -> None:
        (ws / "sub").mkdir()
        (ws / "sub" / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n")
        (ws / "sub" / "payload.py").write_text("PAYLOAD = 1\n")
        (ws / ".gitmodules").write_text(f'[submodule "sub"]\n\tpath = sub\n\turl = {elsewhere}\n')

    patch = await collect(tmp_path, source, agent)
    assert f"+gitdir: {elsewhere / '.git'}" in patch
    assert "+PAYLOAD = 1" in patch and "b/.gitmodules" in patch


async def test_an_agent_written_gitignore_and_exclude_hide_nothing(tmp_path: Path, source: Path) -> None:
    def agent(ws: Path) -> None:
        (ws / ".gitignore").write_text("*\n!.gitignore\n")
        (ws / "evil.py").write_text("EVIL = 1\n")
        (ws / ".git" / "info").mkdir(parents=True)
        (ws / ".git" / "info" / "exclude").write_text("*\n")
        (ws / ".git" / "stash.py").write_text("STASHED = 1\n")

    patch = await collect(tmp_path, source, agent)
    assert "+*" in patch and "+EVIL = 1" in patch
    assert "b/.git/info/exclude" in patch and "+STASHED = 1" in patch


async def test_gitattributes_neither_transform_hide_nor_run_anything(
    tmp_path: Path, source: Path, marker: Path
) -> None:
    def agent(ws: Path) -> None:
        (ws / ".gitattributes").write_text(
            "* filter=pwn diff=pwn merge=pwn -text eol=crlf working-tree-encoding=UTF-16\n"
            "app.py -diff binary export-ignore linguist-generated\n"
        )
        # Configuration that would define the drivers, everywhere git might look inside the tree.
        (ws / ".git").mkdir()
        (ws / ".git" / "config").write_text(HOSTILE_CONFIG.format(cmd=f"touch {marker}"))
        (ws / ".gitconfig").write_text(HOSTILE_CONFIG.format(cmd=f"touch {marker}"))
        (ws / "notes.txt").write_text("line one\nline two\n")

    patch = await collect(tmp_path, source, agent)
    assert "+line one\n+line two\n" in patch  # no eol or encoding conversion
    assert "Binary files" not in patch and "GIT binary patch" not in patch
    assert not marker.exists()


async def test_hooks_and_fsmonitor_in_the_tree_never_run(tmp_path: Path, source: Path, marker: Path) -> None:
    def agent(ws: Path) -> None:
        hostile_repo(ws, marker, commit=False)  # the workspace root itself becomes a hostile repository
        hostile_repo(ws / "nested", marker, commit=False)

    patch = await collect(tmp_path, source, agent)
    assert "b/.git/hooks/pre-commit" in patch and "b/nested/.git/config" in patch
    assert not marker.exists()


async def test_a_symlink_named_git_is_recorded_as_a_link_and_never_followed(tmp_path: Path, source: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    git(elsewhere, "init", "-q")

    def agent(ws: Path) -> None:
        (ws / ".git").symlink_to(elsewhere / ".git")
        (ws / "lib").mkdir()
        (ws / "lib" / ".git").symlink_to("/")
        (ws / "lib" / "mod.py").write_text("MOD = 1\n")

    patch = await collect(tmp_path, source, agent)
    assert "diff --git a/.git b/.git\nnew file mode 120000" in patch
    assert "diff --git a/lib/.git b/lib/.git\nnew file mode 120000" in patch
    assert "+MOD = 1" in patch


async def test_odd_file_names_and_special_files_are_listed_not_fatal(tmp_path: Path, source: Path) -> None:
    def agent(ws: Path) -> None:
        (ws / "new\nline.py").write_text("NEWLINE = 1\n")
        os.mkfifo(ws / "pipe")  # reading it would block forever
        (ws / os.fsdecode(b"bad\xffname.py")).write_bytes(b"BYTES = 1\n")
        (ws / "-rf").write_text("DASH = 1\n")

    patch = await collect(tmp_path, source, agent)
    assert '"b/new\\nline.py"' in patch and "+NEWLINE = 1" in patch
    assert '"b/bad\\377name.py"' in patch and "+BYTES = 1" in patch
    assert "b/pipe" in patch and "+DASH = 1" in patch


async def test_unreadable_files_and_directories_are_still_diffed(tmp_path: Path, source: Path) -> None:
    def agent(ws: Path) -> None:
        (ws / "locked").mkdir()
        (ws / "locked" / "inner.py").write_text("INNER = 1\n")
        (ws / "locked").chmod(0)
        (ws / "app.py").chmod(0)

    patch = await collect(tmp_path, source, agent)
    assert "+INNER = 1" in patch


async def test_a_tree_deeper_than_any_path_limit_is_noted_and_the_rest_diffed(tmp_path: Path, source: Path) -> None:
    def agent(ws: Path) -> None:
        # 250 levels of 200-byte names: far past PATH_MAX and the walk's depth bound.
        fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for _ in range(250):
                os.mkdir("d" * 200, dir_fd=fd)
                inner = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = inner
            os.close(os.open("deep.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        finally:
            os.close(fd)

    patch = await collect(tmp_path, source, agent)
    assert f"+(fluidbox: directory not walked: deeper than {workspace.MAX_DEPTH} levels)" in patch


async def test_a_huge_file_is_recorded_by_size_and_digest(tmp_path: Path, source: Path) -> None:
    size = workspace.MAX_BLOB_BYTES + 1

    def agent(ws: Path) -> None:
        with (ws / "big.bin").open("wb") as fh:
            fh.truncate(size)  # sparse: costs no disk

    patch = await collect(tmp_path, source, agent)
    assert f"{size} bytes" in patch and "sha256" in patch


async def test_a_baseline_with_ignored_files_and_nested_repos_is_recorded_whole(
    tmp_path: Path, source: Path, marker: Path
) -> None:
    (source / ".gitignore").write_text("*.log\nsecrets/\n")
    (source / "build.log").write_text("old log\n")
    hostile_repo(source / "vendor", marker, commit=True)

    def agent(ws: Path) -> None:
        (ws / "build.log").write_text("old log\nexfiltrated\n")
        (ws / "vendor" / "hidden.py").write_text("HIDDEN_PAYLOAD = 2\n")

    patch = await collect(tmp_path, source, agent)
    assert "--- a/build.log\n+++ b/build.log" in patch and "+exfiltrated" in patch
    assert "--- a/vendor/hidden.py\n+++ b/vendor/hidden.py" in patch and "+HIDDEN_PAYLOAD = 2" in patch
    assert "b/vendor/.git/HEAD" not in patch  # it was in the baseline, untouched
    assert not marker.exists()


async def test_an_unchanged_workspace_gives_an_empty_patch(tmp_path: Path, source: Path, marker: Path) -> None:
    hostile_repo(source / "vendor", marker, commit=False)
    (source / ".gitattributes").write_text("* filter=pwn\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base, files = await workspace.prepare(run_dir, str(source))
    assert len(base) == 40 and files > 3
    assert await workspace.diff(run_dir) == ("", False)
    assert not marker.exists()


async def test_the_baseline_written_without_git_is_a_repository_git_checks_clean(tmp_path: Path, source: Path) -> None:
    (source / "bin").mkdir()
    (source / "bin" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (source / "bin" / "run.sh").chmod(0o755)
    (source / "link").symlink_to("README.md")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base, files = await workspace.prepare(run_dir, str(source))
    repo = run_dir / "baseline.git"
    env = {"PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}

    def read(*args: str) -> str:
        done = subprocess.run(["git", f"--git-dir={repo}", *args], env=env, check=True, capture_output=True)
        return done.stdout.decode()

    read("fsck", "--strict", "--no-dangling")  # every object well formed and reachable from HEAD
    assert read("rev-parse", "HEAD").strip() == base
    assert read("log", "--format=%an <%ae>|%s", "HEAD") == "fluidbox <fluidbox@localhost>|fluidbox baseline\n"
    listed = read("ls-tree", "-r", "HEAD").splitlines()
    assert len(listed) == files == 4
    assert any(line.startswith("100755 blob") and line.endswith("\tbin/run.sh") for line in listed), listed
    assert any(line.startswith("120000 blob") and line.endswith("\tlink") for line in listed), listed
    assert read("show", "HEAD:app.py") == APP
    (run_dir / "workspace" / "bin" / "run.sh").write_text("#!/bin/sh\necho changed\n")
    patch, _ = await workspace.diff(run_dir)
    assert "-echo hi\n+echo changed" in patch and "app.py" not in patch


async def test_without_a_baseline_the_listing_still_names_what_changed(tmp_path: Path, source: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await workspace.prepare(run_dir, str(source))
    ws = run_dir / "workspace"
    plant_backdoor(ws)
    (ws / "README.md").unlink()
    (ws / "zz" / ".git").mkdir(parents=True)
    (ws / "zz" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    shutil.rmtree(run_dir / "baseline.git")
    with pytest.raises(workspace.WorkspaceError):
        await workspace.diff(run_dir)
    listing = await workspace.listing(run_dir)
    lines = listing.splitlines()
    assert any(line.startswith("modified") and line.endswith(" app.py") for line in lines), listing
    assert any(line.startswith("deleted") and line.endswith(" README.md") for line in lines), listing
    assert any(line.startswith("added") and line.endswith(" zz/.git/HEAD") for line in lines), listing


async def test_a_workspace_replaced_by_a_symlink_is_refused_not_followed(tmp_path: Path, source: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await workspace.prepare(run_dir, str(source))
    shutil.rmtree(run_dir / "workspace")
    (run_dir / "workspace").symlink_to(source)
    with pytest.raises(workspace.WorkspaceError, match="not a readable directory"):
        await workspace.diff(run_dir)


# ---- issue 24, finding 4: nothing the agent leaves makes a collection unbounded ------------------------

SPARSE_15T = 15 << 40  # what `truncate -s 15T` makes: 15 TiB long, nothing allocated


def sparse(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)


async def test_a_15_terabyte_sparse_file_is_noted_by_size_and_never_read(tmp_path: Path, source: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await workspace.prepare(run_dir, str(source))
    sparse(run_dir / "workspace" / "huge.bin", SPARSE_15T)
    allocated = os.lstat(run_dir / "workspace" / "huge.bin").st_blocks * 512

    # Bounded wait: main read all 15 TiB to hash them (hours); the cap makes it a note at once.
    patch, truncated = await asyncio.wait_for(workspace.diff(run_dir), 60)
    assert not truncated
    assert "diff --git a/huge.bin b/huge.bin\nnew file mode 100644" in patch
    assert (
        f"+(fluidbox: file not read: {SPARSE_15T} bytes ({allocated} allocated), over the"
        f" {workspace.MAX_HASH_BYTES}-byte limit per file; not hashed)"
    ) in patch
    listing = await asyncio.wait_for(workspace.listing(run_dir), 60)
    assert f"unread    100644 {SPARSE_15T} {'-':<64} huge.bin" in listing.splitlines()


async def test_a_collection_past_its_time_budget_notes_the_rest_and_says_it_was_cut(
    tmp_path: Path, source: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await workspace.prepare(run_dir, str(source))
    plant_backdoor(run_dir / "workspace")

    patch, truncated = await workspace.diff(run_dir, workspace.Budget.collection(secs=0))
    assert truncated
    assert patch.startswith(
        "# fluidbox: the collection stopped early (its 0s time budget was spent); what it did not reach is noted\n"
    )
    # Nothing was compared, and nothing passes for unchanged: every entry is there, as a note.
    note = "+(fluidbox: not collected: the collection stopped early (its 0s time budget was spent); not compared)"
    assert patch.count(note) == 2 and "b/app.py" in patch and "b/README.md" in patch
    listing = await workspace.listing(run_dir, workspace.Budget.collection(secs=0))
    assert "# the walk stopped early (its 0s time budget was spent)" in listing
    assert {line.split()[0] for line in listing.splitlines() if not line.startswith("#")} == {"unread"}


async def test_a_collection_past_its_byte_budget_reads_no_further(tmp_path: Path, source: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await workspace.prepare(run_dir, str(source))
    ws = run_dir / "workspace"
    (ws / "a_first.txt").write_text("read\n")  # names are walked in byte order
    sparse(ws / "b_big.bin", 1024 * 1024)

    patch, truncated = await workspace.diff(run_dir, workspace.Budget.collection(total_bytes=1024))
    assert truncated
    assert "(its 1024-byte read budget was spent)" in patch.splitlines()[0]
    assert "+read\n" in patch
    assert "diff --git a/b_big.bin b/b_big.bin" in patch and "not collected: the collection stopped early" in patch


async def test_cancelled_collections_stop_and_never_hold_the_default_thread_pool(tmp_path: Path) -> None:
    # Collections that would hash 15 TiB each (a per-file cap far above the default): as many as the collector
    # has threads, and more than the event loop's default executor has (min(32, cpus + 4)).
    count = max(workspace.COLLECTOR_THREADS, (os.cpu_count() or 1) + 5)
    budgets = [workspace.Budget(file_bytes=1 << 60) for _ in range(count)]
    runs = []
    for i in range(count):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        await workspace.prepare(run_dir, None)
        sparse(run_dir / "workspace" / "huge.bin", SPARSE_15T)
        runs.append(run_dir)
    tasks = [asyncio.create_task(workspace.diff(run, budget)) for run, budget in zip(runs, budgets, strict=True)]
    try:

        async def reading() -> bool:
            return sum(b.read > 0 for b in budgets) == workspace.COLLECTOR_THREADS

        await eventually(reading, timeout=30, interval=0.01)
        # Every collector thread is busy hashing, and the worker's other threads are not touched.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 30) == "free"
        assert not any(task.done() for task in tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert all(b.stop.is_set() for b in budgets)
    # The cancelled walks stopped between chunks: the collector's threads serve a new collection at once.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    await workspace.prepare(fresh, None)
    (fresh / "workspace" / "new.txt").write_text("NEW\n")
    patch, _ = await asyncio.wait_for(workspace.diff(fresh), 60)
    assert "+NEW" in patch
