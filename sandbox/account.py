"""The unprivileged host account sandboxes run under when the worker runs as root.

A user namespace maps the sandbox's uid onto the uid of whoever starts bubblewrap. Started by root, the
agent's uid 1000 would be host uid 0: files it writes are root's, a setuid bit it sets is honoured on the
host, and kernel interfaces that only check the owner (``/proc/sys``) are open to it. So a root worker
starts every sandbox as this account instead, created on first use like the embedded PostgreSQL's.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
from typing import NamedTuple

DEFAULT_SANDBOX_USER = "fluidbox-sandbox"
# Never made: the account has no home, no shell, no password; it exists only to own sandbox processes.
_HOME = "/nonexistent"
_LOCK = "/run/fluidbox-sandbox-account.lock"


class Account(NamedTuple):
    name: str
    uid: int
    gid: int


class AccountError(RuntimeError):
    """The sandbox account does not exist and cannot be created."""


def lookup(name: str) -> Account | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return Account(name, entry.pw_uid, entry.pw_gid)


def ensure_account(name: str) -> Account:
    """The account called ``name``, created as a locked system account if it does not exist yet.

    Raises:
        AccountError: it does not exist and this process cannot create it, or it is root.
    """
    account = lookup(name)
    if account is None:
        account = _create(name)
    if account.uid == 0 or account.gid == 0:
        raise AccountError(f"the sandbox account {name!r} is root: sandboxes must run unprivileged")
    return account


def _create(name: str) -> Account:
    os.makedirs(os.path.dirname(_LOCK), exist_ok=True)
    with open(_LOCK, "a") as lock:
        # Two workers starting their first sandbox at once must not race useradd.
        fcntl.flock(lock, fcntl.LOCK_EX)
        account = lookup(name)
        if account is not None:
            return account
        if (useradd := shutil.which("useradd") or _sbin("useradd")) is not None:
            argv = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", _HOME]
            argv += ["--shell", _nologin(), "--comment", "fluidbox sandboxes", name]
        elif (adduser := shutil.which("adduser") or _sbin("adduser")) is not None:  # busybox systems
            argv = [adduser, "-S", "-D", "-H", "-h", _HOME, "-s", _nologin(), name]
        else:
            raise AccountError(f"cannot create the sandbox account {name!r}: neither useradd nor adduser is installed")
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        account = lookup(name)
        if account is None:
            raise AccountError(f"cannot create the sandbox account {name!r}: {done.stderr.strip() or done.returncode}")
        return account


def _sbin(tool: str) -> str | None:
    for directory in ("/usr/sbin", "/sbin"):
        path = os.path.join(directory, tool)
        if os.access(path, os.X_OK):
            return path
    return None


def _nologin() -> str:
    return next((p for p in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(p)), "/bin/false")
