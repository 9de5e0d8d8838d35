"""The sandbox account: created on first use by a root worker, reused after, never root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox.account import AccountError, ensure_account, lookup
from sandbox.bubblewrap import BubblewrapProvider
from tests.sandbox.test_bubblewrap import make_spec, needs_bwrap, wait_exited

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating a host account needs root")


@pytest.fixture
def fresh_name() -> Iterator[str]:
    """A name no account has yet; the account is deleted again afterwards."""
    name = f"fbxt-{uuid.uuid4().hex[:8]}"
    assert lookup(name) is None
    yield name
    if lookup(name) is not None and (userdel := shutil.which("userdel")):
        subprocess.run([userdel, name], check=False, capture_output=True)


@as_root
def test_the_account_is_created_once_even_when_asked_for_concurrently(fresh_name: str) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        accounts = list(pool.map(lambda _: ensure_account(fresh_name), range(4)))

    assert len(set(accounts)) == 1
    account = accounts[0]
    assert account.uid != 0 and account.gid != 0
    assert lookup(fresh_name) == account
    assert ensure_account(fresh_name) == account


def test_root_is_never_accepted_as_the_sandbox_account() -> None:
    with pytest.raises(AccountError, match="is root"):
        ensure_account("root")


@as_root
@needs_bwrap
async def test_a_root_worker_starts_sandboxes_as_the_account_it_created(tmp_path: Path, fresh_name: str) -> None:
    provider = BubblewrapProvider(sandbox_user=fresh_name)
    spec = make_spec(tmp_path, [sys.executable, "-c", "open('/workspace/out', 'w').write('x')"])
    handle = await provider.create(spec)
    try:
        await wait_exited(provider, handle)
        account = lookup(fresh_name)
        assert account is not None, "the account was created on first use"
        # Until the sandbox is destroyed, what it wrote is the account's: it ran as that account.
        assert os.lstat(Path(spec.workspace_dir) / "out").st_uid == account.uid
    finally:
        await provider.destroy(handle)

    assert handle.extra["user"] == fresh_name
    # Taken back after destroy: the file the sandbox wrote is the control plane's again.
    assert (Path(spec.workspace_dir) / "out").read_text() == "x"
    assert os.lstat(Path(spec.workspace_dir) / "out").st_uid == os.geteuid()
