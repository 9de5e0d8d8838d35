"""Runner entry point: take the credentials, then dispatch on ``FLUIDBOX_HARNESS``.

Credentials are taken (and every token variable deleted from the environment) before anything else,
so no harness and no child process can ever see a token in its environment.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import MutableMapping

from core.wire import ENV_HARNESS, EXIT_AUDIENCE_MISMATCH, EXIT_GATEWAY_GONE, EXIT_MISSING_ENV
from runner import replay
from runner.gateway import AudienceMismatch, Gateway, GatewayGone, MissingEnv, log, take_credentials

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
    try:
        credentials = take_credentials(env)
    except MissingEnv as exc:
        log(str(exc))
        return EXIT_MISSING_ENV
    gateway = Gateway.from_env(credentials, env)
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
