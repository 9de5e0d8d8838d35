"""Run creation: one path for every entry point (HTTP, trigger invoke, schedule fire).

Freeze the RunSpec, bind requirements fail-closed, record the run as ``created`` together with
anything the caller must commit atomically with it (``also``), then start its workflow.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from config.settings import Settings
from core.bindings import covering, freeze_binding, quarantined, same_url
from core.capabilities import frozen_entry, narrow_pins
from core.errors import BadRequest, Forbidden, Unavailable, Unprocessable
from core.harnesses import RUNNABLE
from core.policy import Budgets
from core.runner_env import runner_env
from core.runspec import (
    InvocationContext,
    RunSpec,
    WorkspaceSpec,
    freeze,
    host_path_refusal,
    repository_in_scope,
)
from core.states import RunStatus
from db._base import Conn
from db.agents import Agents
from db.capabilities import Capabilities
from db.connections import Connections
from db.ids import new_id
from db.models.runs import Run
from db.parks import Parks
from db.policies import Policies
from db.runs import Runs
from services.run_control import RunControl, WorkflowExists

log = logging.getLogger("fluidbox.services.runs")

MAX_RUNNER_ENV_BYTES = 512 * 1024
# A run still 'created' this long after its insert has no workflow: its starter died in between.
STRANDED_AFTER_SECS = 60.0


@dataclass(frozen=True)
class RunRequest:
    """What a caller asks for; everything else comes from the agent's latest revision."""

    agent: str
    task: str
    workspace: dict[str, Any] | None = None
    autonomous: bool = False
    budgets: Budgets | None = None
    bindings: dict[str, str] | None = None
    capabilities: list[str] | None = None
    result_destinations: list[dict[str, Any]] = field(default_factory=list)
    # What an unbindable requirement does when it does not say: park (API runs) or fail (subscriptions' default).
    when_unavailable: str = "fail"


@dataclass
class RunFactory:
    agents: Agents
    policies: Policies
    runs: Runs
    parks: Parks
    connections: Connections
    capabilities: Capabilities
    settings: Settings
    control: RunControl

    async def freeze_capabilities(self, pins: list[dict[str, Any]], keep: list[str] | None) -> list[dict[str, Any]]:
        """The revision's pinned bundles, narrowed (remove-only) by the run's keep-list; ``[]`` strips all."""
        pins = narrow_pins(pins, keep)
        rows = await self.capabilities.by_ids([p["id"] for p in pins])
        frozen = [frozen_entry(rows[p["id"]].model_dump()) for p in pins]
        aliases = [s["name"] for b in frozen for s in b["servers"]]
        clash = sorted({a for a in aliases if aliases.count(a) > 1})
        if clash:
            raise BadRequest(
                f"capability-server alias collision: {', '.join(clash)} is defined by more than one bundle"
            )
        return frozen

    async def resolve_bindings(
        self,
        tenant_id: str,
        requirements: list[dict[str, Any]],
        explicit: dict[str, str] | None,
        invoker_user_id: str | None = None,
        when_unavailable: str = "fail",
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Bind every requirement to one active connection whose latest snapshot covers the required
        tools (``core.bindings``). ``organization`` slots take an organization connection; ``invoking_user``
        slots take the invoker's own personal connection (``invoker_user_id``; None for operator and trigger
        runs). Returns the frozen surfaces and the requirements left to wait for.

        A requirement with no usable connection to its URL (none, or only revoked, in error or not yet
        authorized ones) is returned as pending when it parks (its ``when_unavailable``, else the caller's
        default); otherwise it refuses the run before anything provisions or spends. A usable connection that
        lacks a required tool, or a personal slot without a user, always refuses: no sign-in would fix it."""
        explicit = explicit or {}
        unknown = sorted(set(explicit) - {r["slot"] for r in requirements})
        if unknown:
            raise BadRequest(f"unknown requirement slot(s) in bindings: {', '.join(unknown)}")
        frozen: list[dict[str, Any]] = []
        pending: list[dict[str, Any]] = []
        for req in requirements:
            slot, url, needed = req["slot"], req["connector"]["url"], list(req["required_tools"])
            personal = req.get("binding_mode") == "invoking_user"
            if personal and invoker_user_id is None:
                # Personal connections belong to signed-in users; an operator-started run has no user.
                raise BadRequest(
                    f"requirement slot '{slot}' binds to the invoking user's personal connection, and a run "
                    "started with the operator token has no user"
                )
            owner = invoker_user_id if personal else None
            candidates = [c for c in await self.connections.candidates(tenant_id, owner) if same_url(c.base_url, url)]
            kind = "personal connection of yours" if personal else "organization connection"
            parks = (req.get("when_unavailable") or when_unavailable) == "park"
            if slot in explicit:
                candidates = [c for c in candidates if str(c.id) == explicit[slot]]
                if not candidates:
                    # Waiting makes sense only on an existing connection of the right owner and URL.
                    named = await self._unusable(tenant_id, owner, url, explicit[slot]) if parks else None
                    if named is None or named["connection_id"] is None:
                        raise BadRequest(
                            f"binding for slot '{slot}': connection {explicit[slot]} is not an active {kind} to {url}"
                        )
                    pending.append({**req, "owner_user_id": owner, **named})
                    continue
            chosen = covering(candidates, url, needed)
            if chosen is None:
                held = quarantined(candidates, needed)
                if held:
                    raise BadRequest(
                        f"requirement slot '{slot}' cannot be bound: tool definitions changed and await an admin's "
                        f"review ({'; '.join(held)}): see GET /v1/connections/{{id}}/tools/changes"
                    )
                where = "personal connection of the invoking user" if personal else "connection"
                message = (
                    f"requirement slot '{slot}' cannot be bound: no active {where} covers {', '.join(needed)} on {url}"
                )
                if candidates or not parks:
                    raise BadRequest(message)
                waiting = await self._unusable(tenant_id, owner, url, explicit.get(slot))
                pending.append({**req, "owner_user_id": owner, **waiting})
                continue
            frozen.append(freeze_binding(req, chosen, new_id(), when_unavailable))
        return frozen, pending

    async def _unusable(self, tenant_id: str, owner: str | None, url: str, connection_id: str | None) -> dict[str, Any]:
        """Why no connection to ``url`` is usable, and the one to wait for when there is one (newest first)."""
        rows = [
            r
            for r in await self.connections.all(tenant_id, owner)
            if same_url(r.base_url, url)
            and (r.owner_user_id is None) == (owner is None)
            and (connection_id is None or str(r.id) == connection_id)
        ]
        if not rows:
            return {"connection_id": None, "reason": f"no connection to {url} exists yet"}
        row = rows[0]
        reason = {
            "pending": "the connection is not authorized yet",
            "revoked": "the connection was revoked",
            "error": "the connection's authorization failed (reconnect it)",
        }.get(row.status, f"the connection is {row.status}")
        return {"connection_id": str(row.id), "reason": reason}

    async def prepare(
        self,
        tenant_id: str,
        req: RunRequest,
        invocation: InvocationContext,
        invoker_user_id: str | None = None,
        *,
        host_paths: bool | None = None,
    ) -> RunSpec:
        """Validate and freeze; nothing is written. Every refusal here is a 4xx naming the problem.
        ``invoker_user_id``: the signed-in user starting the run (None for the operator and triggers).
        ``host_paths``: whether the workspace may name a control-plane host path (default: only without a user;
        a trigger passes whether the operator set it up)."""
        agent = await self.agents.find_agent(tenant_id, req.agent)
        if agent is None:
            raise BadRequest(f"unknown agent '{req.agent}'")
        revision = await self.agents.latest_revision_of(str(agent.id))
        if revision is None:
            raise BadRequest("agent has no revisions")
        policy_row = await self.policies.policy_head_of(str(revision.policy_id))
        capabilities = await self.freeze_capabilities(revision.capability_bundles or [], req.capabilities)
        brokered, pending = await self.resolve_bindings(
            tenant_id, revision.connection_requirements or [], req.bindings, invoker_user_id, req.when_unavailable
        )
        sandbox_aliases = {s["name"] for b in capabilities for s in b["servers"]}
        for surface in brokered:
            if surface["slot"] in sandbox_aliases:
                raise BadRequest(
                    f"requirement slot '{surface['slot']}' collides with a sandbox capability server of the same "
                    "alias — rename the slot"
                )
        if revision.harness not in RUNNABLE:
            raise Unprocessable(
                f"harness '{revision.harness}' cannot run in this build yet (runnable: {', '.join(sorted(RUNNABLE))})"
            )
        spec = freeze(
            run_id=new_id(),
            tenant_id=tenant_id,
            agent=agent,
            revision=revision,
            policy_row=policy_row,
            task=req.task,
            workspace=WorkspaceSpec.model_validate(req.workspace) if req.workspace else None,
            autonomous=req.autonomous,
            budget_override=req.budgets,
            invocation=invocation,
            brokered=brokered,
            capabilities=capabilities,
        )
        if req.result_destinations:
            spec = spec.model_copy(update={"result_destinations": list(req.result_destinations)})
        if pending:
            spec = spec.model_copy(update={"pending_requirements": pending})
        # Asked for, or the revision's default: either way it would read a control-plane host path.
        may_name_host = invoker_user_id is None if host_paths is None else host_paths
        refusal = None if may_name_host else host_path_refusal(spec.workspace)
        if refusal is not None:
            raise Forbidden(refusal)
        if spec.workspace.kind == "git_repository":
            await self.check_repository(tenant_id, spec.workspace.url or "", spec.workspace.credential, invoker_user_id)
        size = sum(len(k) + len(v) + 2 for k, v in runner_env(spec, self.settings).items())
        if size > MAX_RUNNER_ENV_BYTES:
            raise Unprocessable(
                f"runner environment is {size} bytes, over the {MAX_RUNNER_ENV_BYTES} byte ceiling — "
                "shorten the task/system prompt or the replay script"
            )
        return spec

    async def check_repository(
        self, tenant_id: str, url: str, credential: str | None, invoker_user_id: str | None
    ) -> None:
        """A git_repository workspace the run may clone: plain http only to a loopback test server (and only with
        FLUIDBOX_ALLOW_LOOPBACK_CONNECTORS); a ``credential`` names an active ``git`` connection of this tenant
        that the invoker may use (an organization one, or their own personal one) and whose ``base_url`` covers
        the repository, so a stored secret is never sent anywhere its owner did not give it for."""
        if url.startswith("http:") and not self.settings.allow_loopback_connectors:
            raise BadRequest(
                "a git_repository `url` is https:// (plain http:// only to a loopback test server, with "
                "FLUIDBOX_ALLOW_LOOPBACK_CONNECTORS)"
            )
        if credential is None:
            return
        row = await self.connections.get(tenant_id, credential)
        if row is None or row.transport != "git":
            raise BadRequest(f"unknown git credential '{credential}' (create a connection with transport: git)")
        if row.owner_type == "user" and str(row.owner_user_id) != invoker_user_id:
            raise Forbidden(
                f"git credential '{credential}' is a personal connection: only runs its owner starts may use it"
            )
        if row.status != "active":
            raise Unprocessable(f"git credential '{credential}' is {row.status}: replace its token first")
        if not repository_in_scope(row.base_url, url):
            raise BadRequest(f"git credential '{credential}' is for repositories under {row.base_url}, not {url}")

    async def start(
        self,
        spec: RunSpec,
        *,
        invoked_by_kind: str,
        invoked_by_user_id: str | None = None,
        also: Callable[[Conn], Awaitable[None]] | None = None,
    ) -> Run:
        """Record the run (with its bindings and whatever ``also`` writes, in one transaction) and start
        its workflow. If the workflow cannot start, the run is finalized ``failed`` and 503 is raised."""
        brokered = spec.brokered

        async def _also(conn: Conn) -> None:
            if invoked_by_user_id is not None:
                await self.runs.set_invoker(conn, spec.run_id, invoked_by_user_id)
            await self.connections.insert_bindings(conn, spec.tenant_id, spec.run_id, brokered)
            if spec.pending_requirements:
                # Parked before anything provisions or spends: the workflow starts waiting.
                parked["action"] = await self.parks.park_up_front(conn, spec)
            if also is not None:
                await also(conn)

        parked: dict[str, Any] = {}
        row = await self.runs.create_run(spec, invoked_by_kind=invoked_by_kind, also=_also)
        if parked:  # the row as committed: waiting_for_connection with its pending action
            row = await self.runs.get_run(None, spec.run_id) or row
        if invoked_by_user_id is not None:
            row.invoked_by_user_id = uuid.UUID(invoked_by_user_id)  # ``_also`` set it after the RETURNING
        try:
            await self.control.start(spec)
        except WorkflowExists:
            pass  # the stranded-run check got there first (this process was slow): the run has its workflow
        except Exception as exc:
            log.exception("could not start the workflow of run %s", spec.run_id)
            reason = f"could not start the run workflow: {type(exc).__name__}"
            with contextlib.suppress(Exception):
                await self.runs.request_finalization(spec.run_id, "failed", reason=reason)
                await self.runs.transition(spec.run_id, RunStatus.FINALIZING, reason)
                await self.runs.finish(spec.run_id, RunStatus.FAILED, reason, None, "failed", [], [])
            raise Unavailable("the workflow engine is unavailable; the run was not started") from exc
        return row

    async def start_stranded(self, older_than_secs: float = STRANDED_AFTER_SECS) -> int:
        """Start the workflow of every run still ``created`` a while after its insert, with no wind-down
        intent: the process that inserted it died before (or while) starting the workflow. Starting
        twice is harmless (the workflow id is the run's), so every API replica may run this."""
        started = 0
        for run_id in await self.runs.stranded(older_than_secs):
            try:
                await self.control.start(await self.runs.run_spec(run_id))
            except WorkflowExists:
                continue  # it has one (its worker may just be slow to move it on)
            log.warning("run %s was stranded in 'created' without a workflow; started it now", run_id)
            started += 1
        return started

    async def create(
        self,
        tenant_id: str,
        req: RunRequest,
        invocation: InvocationContext,
        *,
        invoked_by_kind: str,
        invoked_by_user_id: str | None = None,
        also: Callable[[Conn], Awaitable[None]] | None = None,
    ) -> Run:
        spec = await self.prepare(tenant_id, req, invocation, invoked_by_user_id)
        return await self.start(spec, invoked_by_kind=invoked_by_kind, invoked_by_user_id=invoked_by_user_id, also=also)
