"""`fluidbox users` finds the embedded database of `fluidbox up` on its own, and says so when it cannot.

A real embedded PostgreSQL is started under a temporary FLUIDBOX_HOME exactly where `fluidbox up`
puts it (``$FLUIDBOX_HOME/pg``) and migrated; the command gets only FLUIDBOX_HOME.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from cli.stack import Postgres, ensure_database

FLUIDBOX = str(Path(sys.executable).parent / "fluidbox")
pytestmark = pytest.mark.stack


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUIDBOX_")}
    env["FLUIDBOX_HOME"] = str(home)
    return subprocess.run([FLUIDBOX, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
async def home_with_database() -> AsyncIterator[Path]:
    from db.engine import create_pool, migrate
    from db.identity import Identity

    home = Path(tempfile.mkdtemp(prefix="fbxu-", dir="/tmp"))
    pg = Postgres(home / "pg")
    try:
        url = await ensure_database(pg.start(), "fluidbox")
        await migrate(url)
        pool = await create_pool(url, min_size=1, max_size=1)
        try:
            await Identity(pool).boot_tenant()  # what the API does when it boots
        finally:
            await pool.close()
        yield home
    finally:
        pg.stop()
        shutil.rmtree(home, ignore_errors=True)


def test_users_add_and_token_against_the_embedded_database(home_with_database: Path) -> None:
    home = home_with_database
    added = run(home, "users", "add", "--email", "Ada@Example.com", "--name", "Ada", "--role", "admin")
    assert added.returncode == 0, added.stdout + added.stderr
    member = json.loads(added.stdout)["member"]
    assert (member["email"], member["roles"], member["status"]) == ("Ada@Example.com", ["admin"], "active")
    minted = run(home, "users", "token", "ada@example.com", "--name", "ci", "--expires-in", "1")
    assert minted.returncode == 0, minted.stdout + minted.stderr
    out = json.loads(minted.stdout)
    assert out["token"].startswith("fbx_pat_") and len(out["token"]) == len("fbx_pat_") + 64
    assert out["pat"]["name"] == "ci" and out["token"].startswith(out["pat"]["display_prefix"])
    lifetime = datetime.fromisoformat(out["pat"]["expires_at"]) - datetime.fromisoformat(out["pat"]["created_at"])
    assert round(lifetime.total_seconds()) == 60, "a lifetime under a minute is raised to the 60 s floor"
    listed = run(home, "users", "list")
    assert listed.returncode == 0 and "Ada@Example.com" in listed.stdout and "admin" in listed.stdout
    assert out["token"] not in listed.stdout
    missing = run(home, "users", "token", "nobody@example.com", "--name", "x")
    assert missing.returncode == 1 and "no user with email 'nobody@example.com'" in missing.stderr


def test_without_a_running_stack_the_command_says_what_to_do() -> None:
    home = Path(tempfile.mkdtemp(prefix="fbxu-", dir="/tmp"))
    try:
        proc = run(home, "users", "add", "--email", "a@example.com", "--name", "A")
        assert proc.returncode == 1
        assert "no running fluidbox database" in proc.stderr and "fluidbox up" in proc.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)
