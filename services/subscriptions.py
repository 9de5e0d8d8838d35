"""Managing trigger subscriptions: create, edit, enable/disable, rotate the token, read fire times.

The route parses and authorizes; this module holds the rules: the agent must exist, capabilities can
only narrow, a callback URL is admitted and gets a fresh sealed secret, an event subscription needs an
active organization connection, and a schedule subscription's Temporal Schedule is changed inside the
row's transaction (so a Temporal failure stores nothing). Firing is ``services.triggers``.

The host belongs to the operator: only the operator may create or edit a subscription whose workspace (its
own, or the agent revision's default) names a control-plane host path, and the row records whether the
operator was the last to set it up (``host_paths_allowed``), which its fires check again.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core.capabilities import narrow_pins
from core.errors import BadRequest, DomainError, Forbidden, NotFound, Unavailable
from core.runspec import WorkspaceInput, host_path_refusal, workspace_doc
from core.schedule import validate_schedule
from core.triggers import (
    callback_context,
    callback_secret,
    check_name,
    check_policy,
    check_template,
    event_filter,
    subscription_kind,
    trigger_token,
)
from db.agents import Agents
from db.connections import Connections
from db.ids import new_id
from db.models.triggers import TriggerSubscription
from db.triggers import Triggers
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy, UrlRefused
from services.schedules import FireTimes, Schedules

log = logging.getLogger("fluidbox.services.subscriptions")

NO_CUSTODY = (
    "credential storage is disabled: set FLUIDBOX_CREDENTIAL_KEY (64 hex characters, e.g. from "
    "`python -c 'import secrets; print(secrets.token_hex(32))'`) and restart the server"
)
MUTABLE_AS_IS = ("name", "task_template", "allow_task_override", "allow_workspace_override", "when_unavailable")


@dataclass(frozen=True)
class ScheduleDraft:
    cron: str | None
    timezone: str | None
    missed_run_policy: str | None


@dataclass(frozen=True)
class SubscriptionDraft:
    """A new subscription as the caller asked for it (already parsed, not yet checked)."""

    agent: str
    name: str
    task_template: str | None = None
    allow_task_override: bool = False
    allow_workspace_override: bool = False
    autonomous: bool = False
    budgets: dict[str, Any] | None = None
    workspace: WorkspaceInput | None = None
    callback_url: str | None = None
    concurrency_policy: str = "allow"
    when_unavailable: str = "fail"
    schedule: ScheduleDraft | None = None
    connection: str | None = None
    repositories: list[str] | None = None
    events: list[str] | None = None
    publish: list[str] | None = None
    capabilities: list[str] | None = None


@dataclass(frozen=True)
class Created:
    row: TriggerSubscription
    token: str  # shown once
    callback_secret: str | None  # shown once


@dataclass(frozen=True)
class Patched:
    row: TriggerSubscription
    callback_secret: str | None  # a new callback URL's new secret, shown once
    changed: bool


@dataclass
class SubscriptionService:
    db: Triggers
    agents: Agents
    connections: Connections
    schedules: Schedules
    callback_policy: UrlPolicy
    sealer: Sealer | None

    async def get(self, tenant_id: str, subscription_id: str) -> TriggerSubscription:
        row = await self.db.get(tenant_id, subscription_id)
        if row is None:
            raise NotFound()
        return row

    async def fire_times(self, row: TriggerSubscription) -> FireTimes | None:
        """The Temporal Schedule is the clock, so its fire times are read from it, not stored."""
        if row.kind != "schedule":
            return None
        try:
            return await self.schedules.fire_times(str(row.id))
        except DomainError:
            # Reading a subscription must not fail because the engine is down; the times are unknown.
            log.warning("could not read the Temporal Schedule of subscription %s", row.id, exc_info=True)
            return None

    async def _check_host_paths(self, agent_id: str, workspace: dict[str, Any] | None, what: str) -> None:
        """A member may not set up a subscription whose fires would read a control-plane host path."""
        refusal = host_path_refusal(workspace)
        if refusal is None and workspace is None:
            revision = await self.agents.latest_revision_of(agent_id)
            default = revision.default_workspace if revision is not None else None
            if host_path_refusal(default) is not None:
                refusal = (
                    f"the agent's default workspace is a control-plane host path: {what} is restricted to the operator"
                )
        if refusal is not None:
            raise Forbidden(refusal)

    async def create(self, tenant_id: str, draft: SubscriptionDraft, *, operator: bool) -> Created:
        """Check and store a new subscription with its first token (and callback secret). ``operator``: the
        caller is the operator, the only one whose subscription may name a control-plane host path."""
        kind = subscription_kind(draft.schedule is not None, draft.connection is not None)
        if kind != "event" and (
            draft.events is not None or draft.repositories is not None or draft.publish is not None
        ):
            raise BadRequest("events, repositories and publish apply to event subscriptions (set `connection`)")
        check_name(draft.name)
        check_policy(draft.concurrency_policy)
        check_template(kind, draft.task_template, draft.allow_task_override)
        agent = await self.agents.find_agent(tenant_id, draft.agent)
        if agent is None:
            raise BadRequest(f"unknown agent '{draft.agent}'")
        agent_id = str(agent.id)
        await self._check_capabilities(agent_id, draft.capabilities)
        workspace = workspace_doc(draft.workspace)
        if not operator:
            await self._check_host_paths(agent_id, workspace, "a subscription of it")
        sid = new_id()
        fields: dict[str, Any] = {
            "id": sid,
            "name": draft.name,
            "agent_id": agent_id,
            "kind": kind,
            "task_template": draft.task_template or None,
            "allow_task_override": draft.allow_task_override,
            "allow_workspace_override": draft.allow_workspace_override,
            "autonomous": draft.autonomous,
            "budgets": draft.budgets,
            "workspace": workspace,
            "capabilities": draft.capabilities,
            "concurrency_policy": draft.concurrency_policy,
            "when_unavailable": draft.when_unavailable,
            "host_paths_allowed": operator,
        }
        if draft.schedule is not None:
            cron = draft.schedule.cron or ""
            validate_schedule(
                cron, draft.schedule.timezone, draft.schedule.missed_run_policy, now=dt.datetime.now(dt.UTC)
            )
            fields.update(
                schedule_cron=cron,
                schedule_timezone=draft.schedule.timezone or "UTC",
                missed_run_policy=draft.schedule.missed_run_policy or "skip",
            )
        if draft.connection is not None:
            fields["connection_id"] = await self._event_connection(tenant_id, draft.connection)
            fields["event_filter"] = event_filter(draft.events, draft.repositories, draft.publish)
        secret = None
        if draft.callback_url:
            self._custody()  # 503 before anything else when custody is off
            fields["callback_url"] = await self._admit_callback(draft.callback_url)
            secret, fields["callback_secret_sealed"], fields["callback_key_id"] = self._seal_new_secret(sid)
        token = trigger_token(secrets.token_hex(32))
        row = await self.db.create(tenant_id, fields, token, before_commit=self._schedule_sync(kind))
        return Created(row, token, secret)

    async def patch(self, tenant_id: str, subscription_id: str, given: dict[str, Any], *, operator: bool) -> Patched:
        """Apply the fields the caller set (``given``: field → value; ``schedule`` as a ScheduleDraft or
        None). A concurrent edit is a 409 from the repository. Only the operator edits a subscription whose
        fires read a host path; an operator's edit lets its fires do so (a row stored before the rule)."""
        row = await self.get(tenant_id, subscription_id)
        sid = str(row.id)
        changes: dict[str, Any] = {}
        if not operator:
            await self._check_host_paths(str(row.agent_id), row.workspace, "editing its subscriptions")
        elif not row.host_paths_allowed:
            changes["host_paths_allowed"] = True
        for field in MUTABLE_AS_IS:
            if field in given:
                value = given[field]
                if value is None and field != "task_template":
                    raise BadRequest(f"{field} cannot be null")
                changes[field] = value
        if "name" in changes:
            check_name(changes["name"])
        if "concurrency_policy" in given:
            changes["concurrency_policy"] = check_policy(given["concurrency_policy"] or "")
        template = changes.get("task_template", row.task_template) or None
        if "task_template" in changes:
            changes["task_template"] = template
        check_template(row.kind, template, bool(changes.get("allow_task_override", row.allow_task_override)))
        if "schedule" in given:
            schedule: ScheduleDraft | None = given["schedule"]
            if row.kind != "schedule" or schedule is None:
                raise BadRequest("schedule applies only to schedule subscriptions")
            cron = schedule.cron or row.schedule_cron
            timezone = schedule.timezone or row.schedule_timezone
            policy = schedule.missed_run_policy or row.missed_run_policy
            validate_schedule(cron, timezone, policy, now=dt.datetime.now(dt.UTC))
            changes.update(schedule_cron=cron, schedule_timezone=timezone, missed_run_policy=policy)
        secret = None
        if "callback_url" in given:
            if not given["callback_url"]:
                changes.update(callback_url=None, callback_secret_sealed=None, callback_key_id=None)
            else:
                self._custody()
                url = await self._admit_callback(given["callback_url"])
                if url != row.callback_url:
                    changes["callback_url"] = url
                    secret, changes["callback_secret_sealed"], changes["callback_key_id"] = self._seal_new_secret(sid)
        if not changes:
            return Patched(row, None, changed=False)
        sync = self._schedule_sync(row.kind) if "schedule" in given or "name" in changes else None
        new = await self.db.update(tenant_id, sid, changes, loaded_at=row.updated_at, before_commit=sync)
        return Patched(new, secret, changed=True)

    async def set_enabled(self, tenant_id: str, subscription_id: str, enabled: bool) -> TriggerSubscription:
        """Enable or disable; a schedule is resumed or paused in the same transaction."""
        row = await self.get(tenant_id, subscription_id)
        if row.enabled == enabled:
            return row
        return await self.db.update(
            tenant_id,
            str(row.id),
            {"enabled": enabled},
            loaded_at=row.updated_at,
            before_commit=self._schedule_sync(row.kind),
        )

    async def rotate_token(self, tenant_id: str, subscription_id: str) -> tuple[TriggerSubscription, str, int]:
        """Mint a new token (shown once) and revoke the old ones; returns (row, token, revoked)."""
        row = await self.get(tenant_id, subscription_id)
        token = trigger_token(secrets.token_hex(32))
        new, revoked = await self.db.rotate_token(tenant_id, str(row.id), token)
        return new, token, revoked

    # ---- rules -----------------------------------------------------------------------------------

    def _custody(self) -> Sealer:
        if self.sealer is None:
            raise Unavailable(NO_CUSTODY)
        return self.sealer

    async def _admit_callback(self, url: str) -> str:
        try:
            admitted = await self.callback_policy.admit(url)
        except UrlRefused as err:
            raise BadRequest(f"callback_url: {err}") from None
        return admitted.url

    def _seal_new_secret(self, subscription_id: str) -> tuple[str, bytes, str]:
        sealer = self._custody()
        secret = callback_secret(secrets.token_hex(32))
        return secret, sealer.seal(secret, context=callback_context(subscription_id)), sealer.key_id

    def _schedule_sync(self, kind: str) -> Callable[[TriggerSubscription], Awaitable[None]] | None:
        """Inside the subscription's transaction: make the Temporal Schedule match the row, so a
        Temporal failure stores nothing (503) instead of leaving the two disagreeing."""
        if kind != "schedule":
            return None

        async def sync(new_row: TriggerSubscription) -> None:
            try:
                await self.schedules.upsert(new_row)
            except DomainError:
                raise
            except Exception as exc:
                log.exception("could not sync the Temporal Schedule of subscription %s", new_row.id)
                raise Unavailable("the workflow engine is unavailable; the schedule was not changed") from exc

        return sync

    async def _check_capabilities(self, agent_id: str, keep: list[str] | None) -> None:
        if keep is None:
            return
        revision = await self.agents.latest_revision_of(agent_id)
        narrow_pins(revision.capability_bundles if revision is not None else [], keep)

    async def _event_connection(self, tenant_id: str, connection_id: str) -> str:
        try:
            uuid.UUID(connection_id)
        except ValueError:
            raise BadRequest(f"unknown connection {connection_id}") from None
        row = await self.connections.get(tenant_id, connection_id)
        if row is None or row.owner_type != "organization":
            # A personal connection is its owner's alone (and invisible to everyone else).
            raise BadRequest(f"unknown connection {connection_id}")
        if row.status != "active":
            raise BadRequest(f"connection {connection_id} is {row.status} — reconnect it first")
        return connection_id


__all__ = ["Created", "Patched", "ScheduleDraft", "SubscriptionDraft", "SubscriptionService"]
