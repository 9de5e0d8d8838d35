"""``fluidbox triggers …`` (admin token) and ``fluidbox invoke`` (a subscription's trigger token)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import typer

from cli.client import Api, CliError, api_url

app = typer.Typer(no_args_is_help=True, help="Trigger subscriptions: create, inspect, enable, rotate, fire.")


def _out(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} must be key=value (got {item!r})")
        out[key] = value
    return out


@app.command("list")
def triggers_list() -> None:
    """Every subscription: id, name, kind, enabled, concurrency policy."""
    for sub in Api().get("/v1/triggers")["subscriptions"]:
        state = "enabled" if sub["enabled"] else "disabled"
        typer.echo(f"{sub['id']}  {sub['name']}  {sub['kind']}  {state}  {sub['concurrency_policy']}")


@app.command("show")
def triggers_show(subscription: str) -> None:
    """A subscription with its recent runs, deliveries and invocations (never a secret)."""
    _out(Api().get(f"/v1/triggers/{subscription}"))


@app.command("create")
def triggers_create(
    agent: str = typer.Option(..., help="Agent id or name."),
    name: str = typer.Option(..., help="Unique per tenant."),
    template: str | None = typer.Option(None, "--template", help="Task template with {{key}} placeholders."),
    callback_url: str | None = typer.Option(None, help="Signed result webhook (needs FLUIDBOX_CREDENTIAL_KEY)."),
    policy: str = typer.Option("allow", "--policy", help="allow | skip_if_running | replace"),
    workspace: Path | None = typer.Option(None, help="A local directory copied into each run's sandbox."),
    cron: str | None = typer.Option(None, help="Make it a schedule (5-field cron, or 6/7 with seconds)."),
    timezone: str = typer.Option("UTC", help="IANA timezone of the cron."),
    missed: str = typer.Option("skip", help="Missed-run policy: skip | catch_up"),
    allow_task_override: bool = typer.Option(False, help="Invocations may replace the task."),
    allow_workspace_override: bool = typer.Option(False, help="Invocations may narrow the workspace."),
) -> None:
    """Create a subscription; prints the trigger token (and callback secret) — shown only this once."""
    body: dict[str, Any] = {
        "agent": agent,
        "name": name,
        "task_template": template,
        "concurrency_policy": policy,
        "allow_task_override": allow_task_override,
        "allow_workspace_override": allow_workspace_override,
    }
    if callback_url:
        body["callback_url"] = callback_url
    if workspace is not None:
        body["workspace"] = {"kind": "local_copy", "path": str(workspace.resolve())}
    if cron:
        body["schedule"] = {"cron": cron, "timezone": timezone, "missed_run_policy": missed}
    made = Api().post("/v1/triggers", body)
    _out(made)
    typer.echo("\nThe token (and callback secret) above are shown only once: store them now.", err=True)


@app.command("enable")
def triggers_enable(subscription: str) -> None:
    """Enable; a schedule resumes."""
    _out(Api().post(f"/v1/triggers/{subscription}/enable")["subscription"])


@app.command("disable")
def triggers_disable(subscription: str) -> None:
    """Disable; invokes get 409 and a schedule pauses."""
    _out(Api().post(f"/v1/triggers/{subscription}/disable")["subscription"])


@app.command("rotate")
def triggers_rotate(subscription: str) -> None:
    """Mint a new trigger token (shown once) and revoke the old ones."""
    _out(Api().post(f"/v1/triggers/{subscription}/rotate_token"))


@app.command("run-now")
def triggers_run_now(subscription: str) -> None:
    """Fire now, as the operator ({{fire_time}} = now; the concurrency policy applies)."""
    _out(Api().post(f"/v1/triggers/{subscription}/run-now"))


def invoke(
    subscription: str = typer.Argument(..., help="Subscription id."),
    token: str | None = typer.Option(None, help="The trigger token (default: $FLUIDBOX_TRIGGER_TOKEN)."),
    context: list[str] = typer.Option([], "--context", "-c", help="key=value for the task template (repeatable)."),
    task: str | None = typer.Option(None, help="Replace the task (only if the subscription allows it)."),
    key: str | None = typer.Option(None, "--key", help="Idempotency-Key: the same key returns the same run."),
) -> None:
    """Invoke a subscription with its trigger token, as an external system would."""
    token = token or os.environ.get("FLUIDBOX_TRIGGER_TOKEN")
    if not token:
        raise CliError("no trigger token: pass --token or set FLUIDBOX_TRIGGER_TOKEN")
    body: dict[str, Any] = {"context": _pairs(context, "--context")}
    if task is not None:
        body["task"] = task
    headers = {"authorization": f"Bearer {token}"}
    if key:
        headers["idempotency-key"] = key
    base = api_url()
    try:
        r = httpx.post(f"{base}/v1/triggers/{subscription}/invoke", json=body, headers=headers, timeout=30)
    except httpx.ConnectError:
        raise CliError(f"cannot reach the fluidbox API at {base} (is `fluidbox up` running?)") from None
    except httpx.HTTPError as exc:
        raise CliError(f"invoke failed: {exc}") from None
    if r.status_code >= 400:
        try:
            message = r.json().get("error", r.text)
        except ValueError:
            message = r.text
        raise CliError(f"invoke → {r.status_code}: {message}")
    _out(r.json())


def register(root: typer.Typer) -> None:
    """Attach ``triggers`` and ``invoke`` to the root command."""
    root.add_typer(app, name="triggers")
    root.command("invoke")(invoke)
