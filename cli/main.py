"""The ``fluidbox`` command. Every command except ``up``/``demo`` and the local admin ``users`` talks to
the HTTP API only."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer

from cli.client import Api, CliError, home
from cli.connections import register as register_connections
from cli.render import event_line, run_line
from cli.triggers import register as register_triggers
from cli.users import users as users_cli

app = typer.Typer(add_completion=False, no_args_is_help=True, help="fluidbox: governed AI agent runs on Temporal.")
runs = typer.Typer(no_args_is_help=True, help="Start, list, inspect, watch and cancel runs.")
approvals = typer.Typer(no_args_is_help=True, help="List and decide pending approvals.")
agents = typer.Typer(no_args_is_help=True, help="Create and inspect agents.")
policies = typer.Typer(no_args_is_help=True, help="Import, inspect, publish and revert policies.")
app.add_typer(runs, name="runs")
app.add_typer(approvals, name="approvals")
app.add_typer(agents, name="agents")
app.add_typer(policies, name="policies")
app.add_typer(users_cli, name="users")  # local admin: talks to the database, see cli/users.py
register_triggers(app)  # `fluidbox triggers …` and `fluidbox invoke`
register_connections(app)  # `fluidbox connections …` (every transport)

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"completed", "failed", "cancelled", "budget_exceeded"}


def _out(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


# ---- the stack ---------------------------------------------------------------------------------


def _stack_from_env() -> Any:
    from cli.stack import Stack

    return Stack(
        home=home().resolve(),
        bind=os.environ.get("FLUIDBOX_BIND", "127.0.0.1:8787"),
        temporal_port=int(os.environ.get("FLUIDBOX_TEMPORAL_PORT", "7233")),
        ui_port=int(os.environ.get("FLUIDBOX_UI_PORT", "8233")),
        database_url=os.environ.get("FLUIDBOX_DATABASE_URL") or None,
        temporal_address=os.environ.get("FLUIDBOX_TEMPORAL_ADDRESS") or None,
        worker_processes=_positive_int("FLUIDBOX_WORKER_PROCESSES", 1),
        api_processes=_positive_int("FLUIDBOX_API_PROCESSES", 1),
    )


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name) or str(default)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        typer.echo(f"error: {name} must be a whole number of at least 1, not {raw!r}", err=True)
        raise typer.Exit(2)
    return value


async def _start(stack: Any) -> tuple[str, Path]:
    from cli.stack import admin_token

    token, path = admin_token(stack.home)
    await stack.start_backing_services()
    await stack.start_app(token)
    return token, path


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@app.command()
def up(
    destroy_sandboxes_on_stop: bool = typer.Option(
        False,
        "--destroy-sandboxes-on-stop",
        envvar="FLUIDBOX_DESTROY_SANDBOXES_ON_STOP",
        help="End every sandbox on stop (default: they keep running and their runs resume on the next start).",
    ),
) -> None:
    """Start PostgreSQL, Temporal, the worker and the API; stop them all on Ctrl-C / SIGTERM.

    Sandboxes outlive a stop: their runs continue when the stack starts again.
    """
    from cli.stack import StackError

    # A SIGTERM while the stack is still starting must stop what has started, not orphan it.
    signal.signal(signal.SIGTERM, _interrupt)
    stack = _stack_from_env()
    stack.destroy_sandboxes_on_stop = destroy_sandboxes_on_stop
    try:
        _, token_path = asyncio.run(_start(stack))
        typer.echo(f"\nfluidbox is up.\n  API:         {'  '.join(stack.api_urls)}\n  Temporal UI: {stack.ui_url}")
        typer.echo(
            f"  admin token: {'$FLUIDBOX_ADMIN_TOKEN' if os.environ.get('FLUIDBOX_ADMIN_TOKEN') else token_path}"
        )
        typer.echo(f"  logs:        {stack.logs}\nPress Ctrl-C to stop.")
        _wait_for_signal()
        typer.echo("stopping…")
    except StackError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("stopping…")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the stop short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop()


@app.command()
def worker(
    queues: str = typer.Option(
        None,
        "--queues",
        envvar="FLUIDBOX_WORKER_QUEUES",
        help="Task queue roles to poll, comma-separated: runs, sandbox, broker (default: all three).",
    ),
) -> None:
    """Run one Temporal worker against FLUIDBOX_DATABASE_URL and FLUIDBOX_TEMPORAL_ADDRESS (for scaled-out setups).

    `fluidbox up` starts its own workers; this command is for workers on other hosts or for one role only.
    """
    argv = [sys.executable, str(ROOT / "worker.py"), *(["--queues", queues] if queues else [])]
    os.execv(sys.executable, argv)  # the worker process itself: signals and exit status are its own


# ---- the demo ----------------------------------------------------------------------------------

DEMO_AGENT = "demo-fixer"
DEMO_CLAUDE_AGENT = "demo-fixer-claude"
DEMO_TASK = "Make the failing test pass, then deploy."
DEMO_CLAUDE_PROMPT = (
    "You are a careful engineer working in the repository at /workspace. Run ./run_tests.sh, fix the code so "
    "the tests pass, run the tests again, then run ./deploy.sh. Every tool call is checked by a policy and may "
    "be denied or wait for a human: if a call is denied, do not look for a way around it. Finish with a short "
    "summary of what you changed and whether the deploy ran."
)
ANTHROPIC_UPSTREAM = "https://api.anthropic.com"


def demo_harness(environ: dict[str, str]) -> tuple[str, dict[str, str], str]:
    """Which harness the demo runs: (harness, extra stack environment, a line saying why).

    A configured upstream (``FLUIDBOX_LLM_UPSTREAM_URL``: Anthropic-compatible or a LiteLLM proxy) or an
    ``ANTHROPIC_API_KEY`` selects the Claude harness; otherwise the scripted replay agent runs.

    Raises:
        CliError: an upstream is configured but no key to call it with.
    """
    upstream = environ.get("FLUIDBOX_LLM_UPSTREAM_URL", "").strip()
    key = environ.get("FLUIDBOX_LLM_UPSTREAM_KEY", "").strip() or environ.get("ANTHROPIC_API_KEY", "").strip()
    if not upstream and not key:
        return "replay", {}, "harness: replay (a scripted agent; no model, no API key)"
    if not key:
        raise CliError(
            "FLUIDBOX_LLM_UPSTREAM_URL is set but there is no key to call it with: "
            "set FLUIDBOX_LLM_UPSTREAM_KEY or ANTHROPIC_API_KEY"
        )
    extra = {} if upstream else {"FLUIDBOX_LLM_UPSTREAM_URL": ANTHROPIC_UPSTREAM}
    where = upstream or ANTHROPIC_UPSTREAM
    return "claude-agent-sdk", extra, f"harness: claude-agent-sdk (a real Claude agent; model traffic → {where})"


def _demo_workspace() -> Path:
    """A fresh copy of the demo repository (the original is never touched)."""
    import shutil

    target = home().resolve() / "demo-repo"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(ROOT / "examples" / "demo-repo", target)
    return target


def run_demo(api: Api, ui_url: str, *, approve: bool = True, harness: str = "replay") -> dict[str, Any]:
    agent = DEMO_CLAUDE_AGENT if harness == "claude-agent-sdk" else DEMO_AGENT
    try:
        api.get(f"/v1/agents/{agent}")
    except CliError:
        body: dict[str, Any] = {
            "name": agent,
            "description": "Fixes the greeting bug in the demo repository.",
            "harness": harness,
            "policy": "demo",
        }
        if harness == "claude-agent-sdk":
            body["system_prompt"] = DEMO_CLAUDE_PROMPT
        api.post("/v1/agents", body)
        typer.echo(f"✓ created agent {agent} (harness {harness}, policy demo)")
    workspace = _demo_workspace()
    created = api.post(
        "/v1/sessions",
        {
            "agent": agent,
            "task": DEMO_TASK,
            "workspace": {"kind": "local_copy", "path": str(workspace)},
        },
    )["session"]
    run_id = created["id"]
    typer.echo(
        f"✓ started run {run_id} (status {created['status']})\n"
        f"  Temporal UI: {ui_url}/namespaces/default/workflows/run-{run_id}\n"
    )
    for event in api.stream(run_id):
        typer.echo(event_line(event))
        data = event["payload"].get("data", {})
        if event["type"] == "approval.requested" and approve:
            typer.echo(f"       ↳ a human approves over HTTP: POST /v1/approvals/{data['approval_id']}/decision")
            api.post(f"/v1/approvals/{data['approval_id']}/decision", {"decision": "approve"})
        if event["type"] == "run.result":
            break
    outputs: dict[str, Any] = api.get(f"/v1/sessions/{run_id}/outputs")
    typer.echo("\n── diff ─────────────────────────────────────────")
    typer.echo(outputs["diff"] or "(none)")
    typer.echo(f"── run {outputs['status']} ── Temporal UI: {ui_url}/namespaces/default/workflows/run-{run_id}")
    return outputs


@app.command()
def demo(keep_up: bool = typer.Option(False, "--keep-up", help="Leave the stack running afterwards.")) -> None:
    """Start the embedded stack and run a governed agent end to end.

    With ANTHROPIC_API_KEY (or FLUIDBOX_LLM_UPSTREAM_URL and a key) a real Claude agent runs through the gate
    and the LLM facade; without, a scripted replay agent does (no API key needed).
    """
    from cli.stack import StackError

    try:
        harness, extra_env, says = demo_harness(dict(os.environ))
    except CliError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    stack = _stack_from_env()
    stack.extra_env.update(extra_env)
    started = time.monotonic()
    try:
        token, _ = asyncio.run(_start(stack))
        typer.echo(f"✓ stack up in {time.monotonic() - started:.1f}s — API {stack.api_url}, Temporal UI {stack.ui_url}")
        typer.echo(f"  {says}")
        outputs = run_demo(Api(stack.api_url, token), stack.ui_url, harness=harness)
        typer.echo(f"demo finished in {time.monotonic() - started:.1f}s")
        if keep_up:
            typer.echo("stack left running; press Ctrl-C to stop it.")
            _wait_for_signal()
        if outputs["status"] != "completed":
            raise typer.Exit(1)
    except (StackError, CliError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        stack.stop()


# ---- runs --------------------------------------------------------------------------------------


@runs.command("start")
def runs_start(
    agent: str = typer.Option(..., help="Agent id or name."),
    task: str = typer.Option(..., help="What the agent should do."),
    workspace: Path | None = typer.Option(None, help="A local directory to copy into the sandbox."),
    autonomous: bool = typer.Option(False, help="Never wait for a human (the policy's fallback decides)."),
) -> None:
    """Start a run and print it."""
    body: dict[str, Any] = {"agent": agent, "task": task, "autonomous": autonomous}
    if workspace is not None:
        body["workspace"] = {"kind": "local_copy", "path": str(workspace.resolve())}
    _out(Api().post("/v1/sessions", body)["session"])


@runs.command("list")
def runs_list(
    limit: int = 20,
    status: str | None = typer.Option(None, help="Only runs in this status, e.g. waiting_for_connection."),
) -> None:
    """Newest runs first (a run waiting for a connection says what to connect)."""
    query = f"/v1/sessions?limit={limit}" + (f"&status={status}" if status else "")
    for run in Api().get(query)["sessions"]:
        typer.echo(run_line(run))


@runs.command("show")
def runs_show(run_id: str) -> None:
    """A run, its usage and its outputs."""
    api = Api()
    _out({**api.get(f"/v1/sessions/{run_id}"), "outputs": api.get(f"/v1/sessions/{run_id}/outputs")})


@runs.command("watch")
def runs_watch(run_id: str, after: int = 0) -> None:
    """Follow a run's timeline live until it ends."""
    for event in Api().stream(run_id, after):
        typer.echo(event_line(event))
        if event["type"] == "run.result":
            return


@runs.command("cancel")
def runs_cancel(run_id: str) -> None:
    """Cancel a run (no-op when it already ended)."""
    _out(Api().post(f"/v1/sessions/{run_id}/cancel"))


# ---- approvals ---------------------------------------------------------------------------------


@approvals.command("list")
def approvals_list() -> None:
    """Pending approvals, oldest first."""
    for row in Api().get("/v1/approvals")["approvals"]:
        typer.echo(f"{row['id']}  run {row['session_id']}  {row['summary']}  (expires {row['expires_at']})")


@approvals.command("approve")
def approvals_approve(approval_id: str, session: bool = typer.Option(False, help="Approve for the whole run.")) -> None:
    """Approve a pending tool call."""
    _out(
        Api().post(f"/v1/approvals/{approval_id}/decision", {"decision": "approved_session" if session else "approve"})
    )


@approvals.command("deny")
def approvals_deny(approval_id: str) -> None:
    """Deny a pending tool call."""
    _out(Api().post(f"/v1/approvals/{approval_id}/decision", {"decision": "deny"}))


# ---- agents ------------------------------------------------------------------------------------


@agents.command("list")
def agents_list() -> None:
    """Every agent."""
    for agent in Api().get("/v1/agents")["agents"]:
        typer.echo(f"{agent['id']}  {agent['name']}")


@agents.command("show")
def agents_show(ref: str) -> None:
    """An agent and its revisions."""
    _out(Api().get(f"/v1/agents/{ref}"))


@agents.command("create")
def agents_create(
    name: str = typer.Option(...),
    harness: str = typer.Option("replay"),
    policy: str = typer.Option("default"),
    model: str | None = typer.Option(None),
    script: Path | None = typer.Option(None, help="A replay script (JSON array of steps)."),
) -> None:
    """Create an agent."""
    body: dict[str, Any] = {"name": name, "harness": harness, "policy": policy}
    if model:
        body["model"] = model
    if script is not None:
        body["harness_config"] = {"script": json.loads(script.read_text())}
    _out(Api().post("/v1/agents", body))


@agents.command("revise")
def agents_revise(
    ref: str,
    policy: str | None = typer.Option(None),
    model: str | None = typer.Option(None),
    system_prompt: str | None = typer.Option(None, "--system-prompt"),
    script: Path | None = typer.Option(None, help="A new replay script (JSON array of steps)."),
) -> None:
    """Append a revision; omitted fields inherit from the latest one."""
    body: dict[str, Any] = {}
    if policy:
        body["policy"] = policy
    if model:
        body["model"] = model
    if system_prompt is not None:
        body["system_prompt"] = system_prompt
    if script is not None:
        body["harness_config"] = {"script": json.loads(script.read_text())}
    _out(Api().post(f"/v1/agents/{ref}/revisions", body))


# ---- policies ----------------------------------------------------------------------------------


def _policy_file(path: Path) -> tuple[str, dict[str, Any]]:
    import yaml

    try:
        text = path.read_text()
        doc = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise CliError(f"{path} is not a policy document (a mapping with a `name`)")
    return text, doc


@policies.command("list")
def policies_list() -> None:
    """Every policy with its head version and how many agents use it."""
    for row in Api().get("/v1/policies")["policies"]:
        auto = row["autonomy_summary"]
        typer.echo(
            f"{row['name']:<20} v{row['version']:<4} agents {row['agents_using']:<3} "
            f"autonomy {'permitted' if auto['permitted'] else 'forbidden'} (fallback {auto['default_fallback']})"
        )


@policies.command("show")
def policies_show(name: str, matrix: bool = typer.Option(False, help="Print the per-tool verdict matrix.")) -> None:
    """A policy's head, its versions and (optionally) its matrix."""
    detail = Api().get(f"/v1/policies/{name}")
    if matrix:
        for row in detail["matrix"]:
            verdict = row["status"]
            rule = f"rule {verdict['rule']}" if verdict.get("rule") is not None else "default"
            typer.echo(f"{row['tool']:<22} {verdict['action']:<8} {verdict['status']:<14} {rule}")
        return
    detail.pop("matrix")
    _out(detail)


@policies.command("import")
def policies_import(path: Path) -> None:
    """Create or update a policy from a YAML file (identical content appends nothing)."""
    text, doc = _policy_file(path)
    _out(Api().post("/v1/policies", {"name": doc["name"], "yaml": text}))


@policies.command("validate")
def policies_validate(path: Path) -> None:
    """Check a YAML policy strictly without storing it."""
    text, _ = _policy_file(path)
    _out(Api().post("/v1/policies/validate", {"yaml": text}))


@policies.command("publish")
def policies_publish(
    name: str,
    path: Path,
    base: int = typer.Option(..., "--base", help="The version your edit started from."),
    summary: str = typer.Option(..., help="What changed and why."),
) -> None:
    """Publish a new version; refused if someone published since --base."""
    _, doc = _policy_file(path)
    _out(Api().post(f"/v1/policies/{name}/publish", {"content": doc, "summary": summary, "base_version": base}))


@policies.command("revert")
def policies_revert(name: str, version: int, base: int = typer.Option(..., "--base")) -> None:
    """Make an old version the head again (as a new version)."""
    _out(Api().post(f"/v1/policies/{name}/revert", {"version": version, "base_version": base}))


@policies.command("preview")
def policies_preview(path: Path) -> None:
    """What a draft would do to every tool; stores nothing."""
    _, doc = _policy_file(path)
    for row in Api().post("/v1/policies/preview", {"content": doc})["matrix"]:
        typer.echo(f"{row['tool']:<22} {row['status']['action']:<8} {row['status']['status']}")


def main() -> None:
    import click

    code = 0
    try:
        result = app(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except CliError as exc:
        typer.echo(f"error: {exc}", err=True)
        code = exc.code
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except click.Abort:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    # Temporal's core threads can abort at interpreter exit (sdk-python#300).
    os._exit(code)
