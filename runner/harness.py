"""Runner entry point: take the credentials, then dispatch on ``FLUIDBOX_HARNESS``.

Credentials are taken (and every token variable deleted from the environment) before anything else,
so no harness and no child process can ever see a token in its environment.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from core.wire import ENV_BOOTSTRAP_FILE, ENV_HARNESS, EXIT_AUDIENCE_MISMATCH, EXIT_GATEWAY_GONE, EXIT_MISSING_ENV
from runner import replay
from runner.gateway import AudienceMismatch, Gateway, GatewayGone, MissingEnv, log, take_credentials

if TYPE_CHECKING:
    from runner import remote

DEFAULT_HARNESS = "replay"
CLAUDE_HARNESS = "claude-agent-sdk"
# Harnesses planned but not built yet: fail the run loudly instead of silently replaying.
PENDING_HARNESSES = frozenset({"codex"})


PR_SET_DUMPABLE = 4


def guard_memory() -> None:
    """Make this process non-dumpable before it reads its tokens.

    The agent's tools run as the same uid, as descendants of the runner; without this they could read
    the tokens out of ``/proc/<runner>/mem`` (or ptrace it). Non-dumpable processes refuse both to
    anyone without CAP_SYS_PTRACE, which nothing in the sandbox has. Children start dumpable again
    (the flag resets on execve), so the tools themselves are unaffected.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            log(f"prctl(PR_SET_DUMPABLE, 0) failed: errno {ctypes.get_errno()}")
    except (OSError, AttributeError) as exc:  # not Linux: nothing to guard this way
        log(f"cannot make the runner non-dumpable: {exc}")


def load_site_packages() -> None:
    """Add the interpreter's site-packages when it was started with ``-S`` (a no-op otherwise)."""
    if sys.flags.no_site:
        import site

        site.main()


def main(environ: MutableMapping[str, str] | None = None) -> int:
    """Run the configured harness; returns the process exit code (see ``core.contract`` EXIT_*)."""
    env = os.environ if environ is None else environ
    if environ is None:
        guard_memory()
    remote_run: remote.Exchanged | None = None
    if env.get(ENV_BOOTSTRAP_FILE):
        # A Pod off the worker's host: its run tokens come from spending the bootstrap credential, and its
        # workspace over the runner plane. Imported only here: tarfile, hashlib and http.client would cost
        # every local run's start CPU it never uses (issue 12).
        from runner import remote

        try:
            remote_run = remote.exchange(env)
        except remote.RemoteError as exc:
            log(str(exc))
            return EXIT_MISSING_ENV
    try:
        credentials = take_credentials(env, remote_run.tokens if remote_run else None)
    except MissingEnv as exc:
        log(str(exc))
        return EXIT_MISSING_ENV
    gateway = Gateway.from_env(credentials, env)
    if remote_run is not None:
        workspace_token = remote_run.workspace_token
        try:
            size = remote.fetch_workspace(env, workspace_token)
        except remote.RemoteError as exc:
            log(str(exc))
            return replay.report_failure(gateway, f"workspace unavailable: {exc}")
        log(f"workspace fetched ({size} bytes, digest verified)")

        def upload() -> None:
            try:
                remote.upload_workspace(env, workspace_token)
            except remote.RemoteError as exc:  # the result still goes: the control plane reports the missing diff
                log(str(exc))

        gateway.before_result = upload
    try:
        harness = (env.get(ENV_HARNESS) or DEFAULT_HARNESS).strip()
        if harness == DEFAULT_HARNESS:
            return replay.run(gateway, env)
        if harness == CLAUDE_HARNESS:
            # Imported here: the SDK is only loaded by runs that use it, from the site-packages the
            # sandbox starts without (``python -S``: the replay runner needs the standard library only).
            load_site_packages()
            from runner import claude

            return claude.run(gateway, credentials, env)
        if harness in PENDING_HARNESSES:
            message = f"harness {harness} is not available in this build yet"
        else:
            message = f"unknown harness {harness!r}"
        return replay.report_failure(gateway, message)
    except AudienceMismatch as exc:
        log(f"{exc}; exiting without a result")
        return EXIT_AUDIENCE_MISMATCH
    except GatewayGone as exc:
        log(f"{exc}; giving up")
        return EXIT_GATEWAY_GONE
    finally:
        gateway.close()
