"""Trigger firing: the ONE path from a subscription to a run (API invoke, run-now, schedule fire).

``TriggerService.fire`` renders the task, applies opt-in narrowing overrides, and creates the run
through ``services.runs.RunFactory`` with the invocation claim bound in the run's own transaction
(``also=``). Under the subscription row lock taken there it re-checks ``enabled`` and enforces the
concurrency policy, so two simultaneous fires under ``skip_if_running`` create exactly one run and
a ``replace`` commits its cancellation intents together with the replacement run.

It holds no FastAPI objects, so a worker activity (the schedule fire) builds it from the same parts.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from core.errors import BadRequest, DomainError, NotFound, Unprocessable
from core.policy import Budgets
from core.runspec import InvocationContext, RunSpec
from core.schedule import (
    FireRecord,
    covered_until,
    fire_key,
    fire_key_time,
    parse_cron,
    parse_timezone,
    unaccounted_fire,
)
from core.templates import render
from core.triggers import FireOutcome, check_task_override, is_within, narrow_workspace
from db._base import Conn
from db.agents import Agents
from db.errors import UniqueViolation
from db.models.triggers import TriggerInvocation, TriggerSubscription
from db.runs import Runs
from db.triggers import Existing, Refused, Triggers
from services.runs import RunFactory, RunRequest

log = logging.getLogger("fluidbox.services.triggers")

FireKind = Literal["api", "schedule", "event", "manual"]
INVOKED_BY = {"api": "trigger", "schedule": "schedule", "event": "webhook", "manual": "operator"}
BODY_DRIFT = "Idempotency-Key was already used with a different request body"


@dataclass(frozen=True)
class Overrides:
    """Opt-in narrowing overrides of one invocation (refused unless the subscription allows them)."""

    task: str | None = None
    workspace: dict[str, Any] | None = None


@dataclass
class TriggerService:
    db: Triggers
    agents: Agents
    run_records: Runs
    runs: RunFactory

    async def fire(
        self,
        tenant_id: str,
        subscription_id: str,
        *,
        kind: FireKind,
        idempotency_key: str,
        variables: dict[str, str],
        body_digest: str | None = None,
        catch_up: bool = False,
        overrides: Overrides | None = None,
    ) -> FireOutcome:
        """Fire a subscription once per ``idempotency_key``.

        Raises:
            NotFound: no such subscription in the tenant.
            Unprocessable: the key was used before with a different ``body_digest``.
            BadRequest / Unprocessable: the run cannot be built (template, override, agent, ...). For
                ``schedule`` and ``event`` fires this is recorded as a skip row ``error: …`` and
                returned as ``skipped`` instead, because nobody is there to read a 400.
        """
        db = self.db
        sub = await db.get(tenant_id, subscription_id)
        if sub is None:
            raise NotFound()
        existing = await db.claim(subscription_id, idempotency_key)
        if existing is not None:
            return await self._existing(existing, body_digest)
        skip: dict[str, Any] = {"key": idempotency_key, "kind": kind, "catch_up": catch_up}
        if not sub.enabled:
            return await self._skip(tenant_id, subscription_id, "disabled", body_digest, **skip)
        try:
            spec = await self.prepare(sub, kind, idempotency_key, variables, catch_up, overrides)
        except DomainError as err:
            if kind in ("schedule", "event"):
                return await self._skip(tenant_id, subscription_id, f"error: {err.message}", body_digest, **skip)
            raise
        for attempt in (1, 2):
            replaced: list[str] = []
            try:
                row = await self.runs.start(
                    spec,
                    invoked_by_kind=INVOKED_BY[kind],
                    also=self._binder(spec, sub, kind, idempotency_key, body_digest, catch_up, replaced),
                )
            except Existing as found:
                return await self._existing(found.claim, body_digest)
            except UniqueViolation:
                # A simultaneous fire with the same key committed first (possible under ``allow``).
                claim = await db.claim(subscription_id, idempotency_key)
                if claim is None:
                    raise
                return await self._existing(claim, body_digest)
            except Refused as refused:
                if refused.reason == "policy_changed" and attempt == 1:
                    fresh = await db.get(tenant_id, subscription_id)
                    if fresh is None:
                        raise NotFound() from None
                    sub = fresh
                    continue
                return await self._skip(
                    tenant_id, subscription_id, refused.reason, body_digest, active=refused.active_run_id, **skip
                )
            if replaced:
                # The cancellation intents committed with the replacement; the signals only wake the runs.
                await self.runs.control.wake_cancelled(replaced)
            return FireOutcome("created", run=row)
        raise AssertionError("unreachable")  # pragma: no cover

    def _binder(
        self,
        spec: RunSpec,
        sub: TriggerSubscription,
        kind: str,
        key: str,
        digest: str | None,
        catch_up: bool,
        replaced: list[str],
    ) -> Callable[[Conn], Awaitable[None]]:
        """The ``also=`` step: claim the key bound to the run under the subscription lock."""

        async def bind(conn: Conn) -> None:
            replaced[:] = await self.db.bind(
                conn,
                str(sub.tenant_id),
                str(sub.id),
                run_id=spec.run_id,
                key=key,
                kind=kind,
                digest=digest,
                catch_up=catch_up,
                policy=sub.concurrency_policy,
                check_enabled=True,
            )

        return bind

    async def record_skip(
        self,
        tenant_id: str,
        subscription_id: str,
        *,
        kind: FireKind,
        idempotency_key: str,
        reason: str,
        catch_up: bool = False,
    ) -> FireOutcome:
        """A visible skip row (e.g. ``missed`` for a schedule gap) under the same claim key space."""
        row = await self.db.record_skip(
            tenant_id, subscription_id, key=idempotency_key, kind=kind, reason=reason, catch_up=catch_up
        )
        return await self._existing(row, row.request_digest)

    async def unaccounted_fire(
        self, sub: TriggerSubscription, fire_time: datetime, *, recorded_before: datetime, now: datetime
    ) -> datetime | None:
        """The oldest fire time before ``fire_time`` that the schedule dropped with nothing recorded
        for it (a gap absorbed by a fire that stayed open through an outage), or None.

        Only fires recorded before ``recorded_before`` (when this fire's processing first began) count,
        so a retry finds the same gap as its first attempt did and its record collapses into a replay.
        A disabled subscription misses nothing; a fire already recorded is a replay, not a new look.
        """
        if not sub.enabled or not sub.schedule_cron or await self.db.claim(str(sub.id), fire_key(fire_time)):
            return None
        records = []
        for row in await self.db.schedule_fires(str(sub.id), recorded_before):
            at = fire_key_time(row.idempotency_key)
            if at is not None:
                late = row.skip_reason == "missed" or row.catch_up
                records.append(FireRecord(fire_time=at, late=late, recorded_at=row.created_at))
        covered = covered_until(records, sub.updated_at)
        cron, tz = parse_cron(sub.schedule_cron), parse_timezone(sub.schedule_timezone)
        return unaccounted_fire(cron, tz, covered, fire_time, now)

    # ---- building the run ----------------------------------------------------------------------

    async def prepare(
        self,
        sub: TriggerSubscription,
        kind: FireKind,
        key: str,
        variables: dict[str, str],
        catch_up: bool,
        overrides: Overrides | None,
    ) -> RunSpec:
        overrides = overrides or Overrides()
        if overrides.task is not None:
            if not sub.allow_task_override:
                raise BadRequest("this subscription does not allow task override")
            task = check_task_override(overrides.task)
        elif sub.task_template:
            task = render(sub.task_template, variables)
        else:
            raise BadRequest("this subscription has no task_template: the invocation must provide `task`")
        workspace = sub.workspace
        if overrides.workspace is not None:
            if not sub.allow_workspace_override:
                raise BadRequest("this subscription does not allow workspace override")
            workspace = await self._narrow(sub, overrides.workspace)
        destinations = []
        if sub.callback_url:
            destinations.append(
                {
                    "kind": "webhook",
                    "subscription_id": str(sub.id),
                    "url": sub.callback_url,
                    "token_generation": sub.token_generation,
                }
            )
        request = RunRequest(
            agent=str(sub.agent_id),
            task=task,
            workspace=workspace,
            autonomous=sub.autonomous,
            budgets=Budgets.model_validate(sub.budgets) if sub.budgets else None,
            capabilities=sub.capabilities,
            result_destinations=destinations,
            when_unavailable=sub.when_unavailable or "fail",
        )
        # A host path (the subscription's, an override narrowing it, or the revision's default) only when the
        # operator set the subscription up: an admin member's trigger must not read the host on its behalf.
        return await self.runs.prepare(
            str(sub.tenant_id),
            request,
            invocation(sub, kind, key, variables, catch_up),
            host_paths=sub.host_paths_allowed,
        )

    async def _narrow(self, sub: TriggerSubscription, override: dict[str, Any]) -> dict[str, Any]:
        base = sub.workspace
        if base is None:
            revision = await self.agents.latest_revision_of(str(sub.agent_id))
            base = revision.default_workspace if revision else None
        narrowed = narrow_workspace(base, override)
        assert base is not None
        # The run copies the resolved directory: a symlink swapped in after this check changes nothing.
        resolved = await asyncio.to_thread(_check_on_disk, base["path"], narrowed["path"])
        return {**narrowed, "path": resolved}

    # ---- outcomes ------------------------------------------------------------------------------

    async def _existing(self, claim: TriggerInvocation, digest: str | None) -> FireOutcome:
        if claim.request_digest != digest:
            raise Unprocessable(BODY_DRIFT)
        if claim.session_id:
            run = await self.run_records.get_run(None, str(claim.session_id))
            return FireOutcome("replay", run=run, earlier=True)
        if claim.skip_reason:
            return FireOutcome("skipped", reason=claim.skip_reason, earlier=True)
        return FireOutcome("in_flight", earlier=True)

    async def _skip(
        self,
        tenant_id: str,
        subscription_id: str,
        reason: str,
        digest: str | None,
        *,
        key: str,
        kind: str,
        catch_up: bool,
        active: str | None = None,
    ) -> FireOutcome:
        row = await self.db.record_skip(
            tenant_id, subscription_id, key=key, kind=kind, reason=reason, digest=digest, catch_up=catch_up
        )
        if row.skip_reason == reason[:500] and not row.session_id:
            return FireOutcome("skipped", reason=reason, active_run_id=active)
        return await self._existing(row, digest)  # somebody else claimed the key meanwhile


def _check_on_disk(base: str, wanted: str) -> str:
    """The override's real path, if it is a directory inside the real base (else a 400)."""
    # Lexical containment is not enough on a real file system: a symlink inside the base could
    # point anywhere on the control-plane host.
    try:
        root, path = os.path.realpath(base), os.path.realpath(wanted)
    except ValueError as exc:  # e.g. an embedded NUL
        raise BadRequest(f"workspace.path is not a usable path: {exc}") from None
    if not is_within(root, path):
        raise BadRequest(f"workspace.path must stay inside the subscription's workspace {base}")
    if not os.path.isdir(path):
        raise BadRequest(f"workspace.path {wanted} is not a directory inside the workspace")
    return path


def invocation(
    sub: TriggerSubscription, kind: FireKind, key: str, variables: dict[str, str], catch_up: bool
) -> InvocationContext:
    """Who fired the run and how, frozen into the RunSpec (domain §4: actors per invocation kind)."""
    name, sid = sub.name, str(sub.id)
    if kind == "schedule":
        attributes: dict[str, Any] = {
            "cron": sub.schedule_cron,
            "timezone": sub.schedule_timezone,
            "fire_time": variables.get("fire_time"),
            "catch_up": catch_up,
        }
        return InvocationContext(kind="schedule", actor=f"schedule:{name}", attributes=attributes, subscription_id=sid)
    if kind == "manual":
        attributes = {"run_now": True, "fire_time": variables.get("fire_time")}
        return InvocationContext(kind="manual", actor="operator", attributes=attributes, subscription_id=sid)
    if kind == "event":
        author = variables.get("pr_author") or name
        attributes = {k: variables[k] for k in ("repository", "pr_number", "event", "head_sha") if k in variables}
        return InvocationContext(kind="event", actor=f"github:{author}", attributes=attributes, subscription_id=sid)
    return InvocationContext(
        kind="api", actor=f"trigger:{name}", attributes={"idempotency_key": key}, subscription_id=sid
    )


__all__ = ["BODY_DRIFT", "FireOutcome", "Overrides", "TriggerService", "invocation"]
