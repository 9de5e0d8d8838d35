"""Per-sandbox cgroup limits: the host-description parsers, and the limits proven on real sandboxes.

A sandbox runs a script that tries to exceed a limit and writes what happened to /workspace/report.json;
the assertions are made on the host. Every sandbox is destroyed in a ``finally``, and a module fixture
removes any cgroup of this module's runs that a failing test might have left.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.ports import SandboxHandle
from sandbox.bubblewrap import PIDFILE_NAME, BubblewrapProvider, SandboxError
from sandbox.limits import (
    MIB,
    CgroupLimiter,
    CgroupMount,
    Limits,
    OwnCgroups,
    cgroup_dir,
    cgroup_name,
    check_name,
    is_sandbox_cgroup,
    parse_mountinfo,
    parse_proc_cgroup,
    remove_dirs,
)
from tests.helpers import eventually
from tests.sandbox.test_bubblewrap import SLEEPER, make_spec, needs_bwrap, wait_exited

RUN_PREFIX = f"limits-test-{uuid.uuid4().hex[:8]}"

HYBRID_MOUNTINFO = r"""
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpu,cpuacct:/
0::/
"""
V2_MOUNTINFO = """\
24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
"""
V2_CGROUP = "0::/system.slice/fluidbox.service\n"
# A container without a cgroup namespace: the mount shows only the container's own subtree.
CONTAINER_MOUNTINFO = r"""
700 690 0:32 /docker/c0ffee /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
701 690 0:36 /docker/c0ffee /sys/fs/cgroup/my\040pids rw,nosuid master:7 - cgroup cgroup rw,pids
"""
CONTAINER_CGROUP = "4:memory:/docker/c0ffee\n8:pids:/docker/c0ffee/worker\n"


# ---------------------------------------------------------------- pure: parsing the host's description


def test_parse_mountinfo_reads_v1_hierarchies_and_the_cgroup2_mount_of_a_hybrid_host() -> None:
    mounts = parse_mountinfo(HYBRID_MOUNTINFO)

    assert [(m.mount_point, m.version, sorted(m.controllers)) for m in mounts] == [
        ("/sys/fs/cgroup/cpu,cpuacct", 1, ["cpu", "cpuacct"]),
        ("/sys/fs/cgroup/memory", 1, ["memory"]),
        ("/sys/fs/cgroup/pids", 1, ["pids"]),
        ("/sys/fs/cgroup/systemd", 1, []),
        ("/sys/fs/cgroup/unified", 2, []),
    ]
    assert all(m.root == "/" and not m.read_only for m in mounts)


def test_parse_mountinfo_reads_a_pure_cgroup2_host() -> None:
    assert parse_mountinfo(V2_MOUNTINFO) == [
        CgroupMount(mount_point="/sys/fs/cgroup", root="/", version=2, controllers=frozenset(), read_only=False)
    ]


def test_parse_mountinfo_keeps_subtree_roots_escaped_paths_and_read_only_mounts() -> None:
    memory, pids = parse_mountinfo(CONTAINER_MOUNTINFO)

    assert (memory.root, memory.read_only) == ("/docker/c0ffee", True)
    assert (pids.mount_point, pids.read_only, pids.controllers) == (
        "/sys/fs/cgroup/my pids",
        False,
        frozenset({"pids"}),
    )


def test_parse_proc_cgroup_maps_each_v1_controller_and_the_unified_path() -> None:
    assert parse_proc_cgroup(HYBRID_CGROUP) == OwnCgroups(
        v1={"pids": "/", "memory": "/process_api/abc", "cpu": "/", "cpuacct": "/"}, unified="/"
    )
    assert parse_proc_cgroup(V2_CGROUP) == OwnCgroups(v1={}, unified="/system.slice/fluidbox.service")


def test_cgroup_dir_finds_the_own_cgroup_inside_a_mount_only_when_the_mount_shows_it() -> None:
    _, pids = parse_mountinfo(CONTAINER_MOUNTINFO)
    root_mount = parse_mountinfo(HYBRID_MOUNTINFO)[1]

    assert cgroup_dir(root_mount, "/process_api/abc") == "/sys/fs/cgroup/memory/process_api/abc"
    assert cgroup_dir(root_mount, "/") == "/sys/fs/cgroup/memory"
    assert cgroup_dir(pids, "/docker/c0ffee/worker") == "/sys/fs/cgroup/my pids/worker"
    assert cgroup_dir(pids, "/docker/c0ffee") == "/sys/fs/cgroup/my pids"
    assert cgroup_dir(pids, "/docker/c0ffee2") is None
    assert cgroup_dir(pids, "/elsewhere") is None


def fake_root(tmp_path: Path, text: str) -> str:
    """``text`` with every /sys/fs/cgroup moved under ``tmp_path``."""
    return text.replace("/sys/fs/cgroup", str(tmp_path / "cg"))


def test_detection_prefers_v1_hierarchies_on_a_hybrid_host(tmp_path: Path) -> None:
    for sub in ("memory/process_api/abc", "pids", "unified"):
        (tmp_path / "cg" / sub).mkdir(parents=True)
    (tmp_path / "cg" / "unified" / "cgroup.controllers").write_text("hugetlb\n")

    placements, missing = CgroupLimiter(
        mountinfo=fake_root(tmp_path, HYBRID_MOUNTINFO), proc_cgroup=HYBRID_CGROUP
    ).detect()

    assert missing == {}
    assert {c: (p.version, p.parent) for c, p in placements.items()} == {
        "memory": (1, str(tmp_path / "cg/memory/process_api/abc/fluidbox")),
        "pids": (1, str(tmp_path / "cg/pids/fluidbox")),
    }


def test_detection_uses_cgroup2_only_for_the_controllers_it_offers(tmp_path: Path) -> None:
    own = tmp_path / "cg" / "system.slice" / "fluidbox.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io pids\n")

    placements, missing = CgroupLimiter(mountinfo=fake_root(tmp_path, V2_MOUNTINFO), proc_cgroup=V2_CGROUP).detect()

    assert {c: (p.version, p.base) for c, p in placements.items()} == {"pids": (2, str(own))}
    assert "memory" in missing and "cpu io pids" in missing["memory"]


def test_detection_explains_a_cgroup_root_that_does_not_exist(tmp_path: Path) -> None:
    placements, missing = CgroupLimiter(
        mountinfo=fake_root(tmp_path, HYBRID_MOUNTINFO), proc_cgroup=HYBRID_CGROUP
    ).detect()

    assert placements == {}
    assert set(missing) == {"memory", "pids"}
    assert "not visible" in missing["memory"] and str(tmp_path) in missing["memory"]


def test_detection_without_any_cgroup_mount_says_so() -> None:
    placements, missing = CgroupLimiter(mountinfo="", proc_cgroup="").detect()

    assert placements == {}
    assert missing == {c: "no cgroup hierarchy on this host offers it" for c in ("memory", "pids")}


def test_cgroup_names_are_safe_distinct_and_tied_to_their_run() -> None:
    uuid_run = "3f2b8c1e-0d4a-4c55-9a51-0f7e2d1c9b10"
    first, second = cgroup_name(uuid_run), cgroup_name(uuid_run)
    odd = cgroup_name("../../etc/x y")

    assert first != second and first.startswith(uuid_run + "-")
    assert check_name(first) == first and check_name(odd) == odd
    assert "/" not in odd and "." not in odd
    assert cgroup_name("a/b")[:-9] != cgroup_name("a-b")[:-9]
    for bad in ("", "../x", "a/b", "a b", "x" * 101):
        with pytest.raises(ValueError, match="invalid cgroup name"):
            check_name(bad)
    assert is_sandbox_cgroup(f"/sys/fs/cgroup/pids/fluidbox/{first}")
    assert not is_sandbox_cgroup("/sys/fs/cgroup/pids/other/x")
    assert not is_sandbox_cgroup("/home/fluidbox/..")


def test_limits_describe_themselves_in_mib() -> None:
    assert Limits(2048 * MIB, 512).wanted() == {"memory": "memory=2048MiB", "pids": "pids=512"}
    assert Limits(pids=32).wanted() == {"pids": "pids=32"}
    assert Limits().wanted() == {}


def test_removing_something_that_is_not_a_sandbox_cgroup_touches_nothing(tmp_path: Path) -> None:
    victim = tmp_path / "empty"
    victim.mkdir()

    assert not remove_dirs([str(victim)])
    assert victim.is_dir()
    assert remove_dirs([str(tmp_path / "fluidbox" / "already-gone")])


# ---------------------------------------------------------------- real cgroups, real sandboxes


def host_controllers() -> tuple[set[str], str]:
    """The controllers this host really lets us limit (by creating and removing a cgroup), and why not."""
    limiter = CgroupLimiter()
    name = f"{RUN_PREFIX}-probe"
    prepared = limiter.prepare(name, Limits(64 * MIB, 64))
    remove_dirs(prepared.dirs)
    usable = {a.split("=")[0] for a in prepared.applied}
    return usable, "; ".join(f"{c}: {r}" for c, r in prepared.missing.items())


USABLE, UNUSABLE_WHY = host_controllers()


def needs_cgroup(controller: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        controller not in USABLE, reason=f"this host offers no usable {controller} cgroup ({UNUSABLE_WHY})"
    )


def leftovers() -> list[str]:
    placements, _ = CgroupLimiter().detect()
    found = []
    for placement in placements.values():
        if os.path.isdir(placement.parent):
            found += [os.path.join(placement.parent, n) for n in os.listdir(placement.parent) if RUN_PREFIX in n]
    return sorted(found)


@pytest.fixture(scope="module", autouse=True)
def no_cgroup_left_behind() -> Iterator[None]:
    yield
    left = leftovers()
    remove_dirs(left)
    assert not left, f"cgroups left behind: {left}"


def run_id() -> str:
    return f"{RUN_PREFIX}-{uuid.uuid4().hex[:8]}"


def cgroups_of(handle: SandboxHandle) -> list[str]:
    dirs: list[str] = json.loads(handle.extra.get("cgroups", "[]"))
    return dirs


async def report_of(workspace: str, log_path: str) -> dict[str, object]:
    path = Path(workspace) / "report.json"

    async def written() -> bool:
        return await asyncio.to_thread(path.exists)

    try:
        await eventually(written, timeout=30.0, interval=0.01)
    except AssertionError:
        pytest.fail(f"no report; sandbox log: {await asyncio.to_thread(Path(log_path).read_text)}")
    report: dict[str, object] = json.loads(await asyncio.to_thread(path.read_text))
    return report


FORKER = r"""
import json, os, subprocess, time

started, errors = [], []
for _ in range(64):
    try:
        started.append(subprocess.Popen(["sleep", "30"]))
    except OSError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
with open("/workspace/report.tmp", "w") as f:
    json.dump({"started": len(started), "failed": len(errors), "first_error": errors[:1]}, f)
os.rename("/workspace/report.tmp", "/workspace/report.json")
# Keep the children (and the pids they hold) until the host has looked.
while not os.path.exists("/workspace/go"):
    time.sleep(0.01)
"""

# The allocation runs in a child, so the sandbox outlives it and reports how it ended.
ALLOCATOR = r"""
import json, subprocess, sys

grab = (
    "chunks = [bytearray(b'x') * (1 << 20) for _ in range(256)]\n"
    "open('/workspace/allocated', 'w').write(str(len(chunks)))\n"
    "print('allocated 256 MiB', flush=True)\n"
)
done = subprocess.run([sys.executable, "-c", grab])
with open("/workspace/report.tmp", "w") as f:
    json.dump({"returncode": done.returncode}, f)
import os
os.rename("/workspace/report.tmp", "/workspace/report.json")
"""


@needs_bwrap
@needs_cgroup("pids")
async def test_a_fork_bomb_stops_at_the_pids_limit_while_the_host_still_forks(tmp_path: Path) -> None:
    provider = BubblewrapProvider(limits_mode="required", limits=Limits(pids=32))
    spec = make_spec(tmp_path, [sys.executable, "-c", FORKER], run_id=run_id())
    handle = await provider.create(spec)
    try:
        assert handle.extra["limits"] == "pids=32"
        report = await report_of(spec.workspace_dir, spec.log_path)

        assert 0 < int(str(report["started"])) < 32
        assert int(str(report["failed"])) > 0, report
        # The sandbox still holds its children, and the host is unaffected.
        assert await provider.status(handle) == "running"
        host = await asyncio.create_subprocess_exec("true")
        assert await host.wait() == 0
        (Path(spec.workspace_dir) / "go").touch()
    finally:
        await provider.destroy(handle)

    assert cgroups_of(handle) and not any(os.path.exists(d) for d in cgroups_of(handle))


@needs_bwrap
@needs_cgroup("memory")
async def test_an_allocation_beyond_the_memory_limit_is_killed(tmp_path: Path) -> None:
    provider = BubblewrapProvider(limits_mode="required", limits=Limits(memory_bytes=64 * MIB))
    spec = make_spec(tmp_path, [sys.executable, "-c", ALLOCATOR], run_id=run_id())
    handle = await provider.create(spec)
    try:
        assert handle.extra["limits"] == "memory=64MiB"
        report = await report_of(spec.workspace_dir, spec.log_path)
        await wait_exited(provider, handle)

        assert report == {"returncode": -9}  # SIGKILL, from the OOM killer of the sandbox's cgroup
        assert not (Path(spec.workspace_dir) / "allocated").exists()
        assert "allocated 256 MiB" not in Path(spec.log_path).read_text()
    finally:
        await provider.destroy(handle)

    assert cgroups_of(handle) and not any(os.path.exists(d) for d in cgroups_of(handle))


@needs_bwrap
async def test_off_applies_no_limit_so_the_same_allocation_succeeds(tmp_path: Path) -> None:
    before = leftovers()
    provider = BubblewrapProvider(limits_mode="off", limits=Limits(memory_bytes=64 * MIB, pids=32))
    spec = make_spec(tmp_path, [sys.executable, "-c", ALLOCATOR], run_id=run_id())
    handle = await provider.create(spec)
    try:
        assert handle.extra["limits"] == "off"
        assert "cgroups" not in handle.extra
        assert leftovers() == before
        report = await report_of(spec.workspace_dir, spec.log_path)

        assert report == {"returncode": 0}
        assert (Path(spec.workspace_dir) / "allocated").read_text() == "256"
    finally:
        await provider.destroy(handle)


@needs_bwrap
@needs_cgroup("pids")
async def test_a_provider_started_afresh_finds_the_sandbox_and_removes_its_cgroups(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, SLEEPER, run_id=run_id())
    handle = await BubblewrapProvider(limits=Limits(memory_bytes=256 * MIB, pids=64)).create(spec)
    dirs = cgroups_of(handle)
    try:
        assert dirs and all(os.path.isdir(d) for d in dirs)

        # As after a worker restart: nothing but the run id and where its log goes.
        restarted = BubblewrapProvider()
        found = await restarted.find(spec.run_id, spec.log_path)
        assert found is not None and cgroups_of(found) == dirs
        await restarted.destroy(found)

        assert await restarted.status(handle) == "exited"
        assert not any(os.path.exists(d) for d in dirs)
        assert not (tmp_path / "run" / PIDFILE_NAME).exists()
    finally:
        await BubblewrapProvider().destroy(handle)


def impossible_limiter(tmp_path: Path) -> CgroupLimiter:
    return CgroupLimiter(mountinfo=fake_root(tmp_path / "no-such-root", HYBRID_MOUNTINFO), proc_cgroup=HYBRID_CGROUP)


@needs_bwrap
async def test_required_limits_that_the_host_cannot_give_refuse_the_sandbox(tmp_path: Path) -> None:
    provider = BubblewrapProvider(
        limits_mode="required", limits=Limits(64 * MIB, 32), limiter=impossible_limiter(tmp_path)
    )
    marker = "open('/workspace/started', 'w').close()"
    spec = make_spec(tmp_path, [sys.executable, "-c", marker], run_id=run_id())

    with pytest.raises(SandboxError, match="required") as refused:
        await provider.create(spec)

    assert "memory:" in str(refused.value) and "pids:" in str(refused.value)
    assert not (tmp_path / "run" / PIDFILE_NAME).exists()
    assert not Path(spec.log_path).exists()  # bwrap never ran: its output would go there
    assert not (Path(spec.workspace_dir) / "started").exists()


@needs_bwrap
async def test_best_effort_starts_without_limits_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider = BubblewrapProvider(limits=Limits(64 * MIB, 32), limiter=impossible_limiter(tmp_path))
    handles = []
    try:
        with caplog.at_level(logging.WARNING, logger="sandbox.bubblewrap"):
            for name in ("a", "b"):
                spec = make_spec(tmp_path / name, SLEEPER, run_id=run_id())
                handles.append(await provider.create(spec))

        for handle in handles:
            assert await provider.status(handle) == "running"
            assert handle.extra["limits"].startswith("none: memory:")
            assert "cgroups" not in handle.extra
        warnings = [r.getMessage() for r in caplog.records if r.name == "sandbox.bubblewrap"]
        assert len(warnings) == 1
        assert "memory" in warnings[0] and "pids" in warnings[0] and "best-effort" in warnings[0]
    finally:
        for handle in handles:
            await provider.destroy(handle)


def test_an_unknown_limits_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="best-effort"):
        BubblewrapProvider(limits_mode="sometimes")


@needs_bwrap
@needs_cgroup("pids")
async def test_a_new_sandbox_clears_empty_cgroups_left_by_its_run_and_only_its_run(tmp_path: Path) -> None:
    limiter = CgroupLimiter()
    rid = run_id()
    # As if a worker had died between creating these cgroups and recording them.
    stale = limiter.prepare(cgroup_name(rid), Limits(pids=8))
    other = limiter.prepare(cgroup_name(rid + "-1"), Limits(pids=8))
    provider = BubblewrapProvider(limits=Limits(pids=64), limiter=limiter)
    handle = None
    try:
        assert stale.dirs and all(os.path.isdir(d) for d in stale.dirs + other.dirs)

        handle = await provider.create(make_spec(tmp_path, SLEEPER, run_id=rid))

        assert not any(os.path.exists(d) for d in stale.dirs)
        assert all(os.path.isdir(d) for d in other.dirs)
        assert all(os.path.isdir(d) for d in cgroups_of(handle))
    finally:
        if handle is not None:
            await provider.destroy(handle)
        remove_dirs(stale.dirs + other.dirs)
