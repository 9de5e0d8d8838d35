"""Every side effect of a run: status writes, the sandbox, the workspace, approvals, finalization.

Activities are idempotent: each one checks where the run already is before acting, so a retry after
a worker crash repeats nothing that was committed.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import secrets
import shutil
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities import rundirs, workspace
from activities.delivery import start_deliveries
from config.settings import Settings
from contracts import temporal as c
from core import contract as wire
from core import events as ev
from core.digests import sha256_hex
from core.errors import InvalidTransition, NotFound
from core.ports import ExecutionProvider, Resources, SandboxHandle, SandboxSpec, WorkspaceRef
from core.runner_env import runner_env, runner_secrets
from core.runspec import RunSpec
from core.states import RunStatus, is_terminal, outcome_status
from core.tokens import BOOTSTRAP_AUDIENCE, RUN_AUDIENCES
from db.approvals import ApprovalRecord, Approvals
from db.connections import Connections, credential_context
from db.deliveries import Deliveries
from db.ledger import Ledger
from db.models.runs import Run
from db.parks import end_all
from db.runs import LiveRun, Runs, UnfinishedRun
from db.tokens import RunTokens
from db.workspaces import WorkspaceArchives
from integrations.sealing import Sealer, SealingError
from integrations.urls import UrlPolicy
from sandbox.limits import MIB
from sandbox.manifests import BOOTSTRAP_FILE

ROOT = Path(__file__).resolve().parent.parent
# What a sandbox mounts to run the runner (read-only, no bytecode written inside).
RUNNER_CODE_DIRS = (ROOT / "runner", ROOT / "core")
# What Temporal's workflow sandbox imports afresh for every workflow instance it creates.
WORKFLOW_CODE_DIRS = (ROOT / "workflows",)


def precompile_code() -> None:
    """Write bytecode once, at worker start, for code that is otherwise compiled again and again: a
    sandbox can write none (read-only mounts), so every run's interpreter would compile the runner
    (about 40 ms of CPU a start), and a worker started with ``PYTHONDONTWRITEBYTECODE`` would compile
    the workflow module for every workflow instance."""
    for code_dir in (*RUNNER_CODE_DIRS, *WORKFLOW_CODE_DIRS):
        compileall.compile_dir(code_dir, quiet=1)


LAUNCH_ORDER = [RunStatus.CREATED, RunStatus.PROVISIONING, RunStatus.INITIALIZING, RunStatus.RUNNING]
# Why the liveness sweep ended a run in its workflow's place (nothing else ever would).
WORKFLOW_LOST = "its workflow no longer exists (Temporal's data was lost, or the workflow was deleted)"
WORKFLOW_TERMINATED = "its workflow was terminated outside fluidbox (from the Temporal UI or CLI)"
# How many runs the sweep looks up in Temporal (and ends, when their workflow is gone) at once.
_SWEEP_CONCURRENCY = 16
# From this many started runs up, all of them missing from Temporal at once ends none (see the sweep).
LOST_ALL_MINIMUM = 3
# Finalization heartbeats this often (the workflow gives it a heartbeat timeout: a lost worker is seen in
# a minute, not at the end of the activity's five).
PULSE_SECS = 10.0
# In the run's directory: how many finalize attempts started collecting the workspace and never finished
# (timed out, cancelled, their worker died). At COLLECT_ATTEMPTS the run ends without a diff, saying why,
# instead of retrying a collection that keeps failing.
COLLECT_MARK = ".collect-attempts"
COLLECT_ATTEMPTS = 2
LISTING_SECS = 60.0  # the git-free listing's own time budget, after a diff that could not be produced


class RunActivities:
    def __init__(
        self,
        *,
        runs: Runs,
        ledger: Ledger,
        tokens: RunTokens,
        approvals: Approvals,
        connections: Connections,
        archives: WorkspaceArchives,
        deliveries: Deliveries,
        provider: ExecutionProvider,
        settings: Settings,
        sealer: Sealer | None,
        url_policy: UrlPolicy,
    ) -> None:
        self.runs = runs
        self.ledger = ledger
        self.tokens = tokens
        self.approvals = approvals
        self.connections = connections
        self.archives = archives
        self.deliveries = deliveries
        self.pool = runs.pool
        self.provider = provider
        self.settings = settings
        self.started = time.monotonic()
        # Opens a git_repository workspace's sealed credential for the clone (None: credential storage is off).
        self._sealer = sealer
        self.url_policy = url_policy
        self._orphans_swept = float("-inf")

    def _run_dir(self, run_id: str) -> Path:
        return self.settings.runs_dir / run_id

    async def _status(self, run_id: str) -> str:
        row = await self.runs.get_run(None, run_id)
        if row is None:
            raise ApplicationError(f"run {run_id} does not exist", non_retryable=True)
        return row.status

    async def _advance(self, run_id: str, to: RunStatus, extra: list[ev.NewEvent] | None = None) -> bool:
        """Move forward along the launch order; a retry that finds the run further along is a no-op."""
        current = RunStatus(await self._status(run_id))
        if current not in LAUNCH_ORDER or LAUNCH_ORDER.index(current) >= LAUNCH_ORDER.index(to):
            return False
        await self.runs.transition(run_id, to, extra=extra)
        return True

    def _handle(self, row: Run | LiveRun | None) -> SandboxHandle | None:
        raw = row.sandbox_handle if row is not None else None
        return SandboxHandle.model_validate(raw) if raw else None

    @activity.defn(name=c.CLAIM_SANDBOX)
    async def claim_sandbox(self, ref: c.RunRef) -> c.ClaimOut:
        """A place under FLUIDBOX_MAX_SANDBOXES for this run, or "wait" (the workflow looks again later)."""
        if self.settings.max_sandboxes <= 0:
            return c.ClaimOut(claimed=True, live=0)
        claimed, live = await self.runs.claim_sandbox(ref.run_id, self.settings.max_sandboxes)
        return c.ClaimOut(claimed=claimed, live=live)

    @activity.defn(name=c.PROVISION)
    async def provision(self, ref: c.RunRef) -> c.StatusOut:
        run_id = ref.run_id
        row = await self.runs.get_run(None, run_id)
        if row is None:
            raise ApplicationError(f"run {run_id} does not exist", non_retryable=True)
        if row.status not in LAUNCH_ORDER:
            return c.StatusOut(status=row.status)  # cancelled or finalizing already
        handle = self._handle(row)
        if handle is not None and await self.provider.status(handle) == "running":
            await self._advance(run_id, RunStatus.RUNNING)
            return c.StatusOut(status=await self._status(run_id))
        spec = await self.runs.run_spec(run_id)
        run_dir = self._run_dir(run_id)
        orphan = await self.provider.find(run_id, str(run_dir / "sandbox.log"))
        if orphan is not None:
            # An earlier attempt started this sandbox but died before recording it. Its tokens are
            # about to be replaced and its workspace rebuilt, so it cannot be adopted: end it first.
            await self.provider.destroy(orphan)
            await self.ledger.append_events(
                run_id, [ev.system_message("replaced a sandbox left by an interrupted provisioning attempt")]
            )
        await self._advance(run_id, RunStatus.PROVISIONING)
        randoms = {aud.value: secrets.token_hex(16) for aud in RUN_AUDIENCES}
        tokens = await self.tokens.mint_tokens(spec.tenant_id, run_id, self.settings.token_ttl_secs, randoms)
        await self._advance(run_id, RunStatus.INITIALIZING)
        await asyncio.to_thread(rundirs.make_private, self.settings.runs_dir, run_dir)
        source = spec.workspace.path if spec.workspace.kind == "local_copy" else None
        data: dict[str, object] = {}
        try:
            if spec.workspace.kind == "git_repository" and spec.workspace.url:
                auth = await self._git_auth(spec) if spec.workspace.credential else None
                data.update(
                    await self._fetch_repository(spec.workspace.url, spec.workspace.ref, run_dir / "repo", auth)
                )
                if spec.workspace.credential:
                    data["credential"] = spec.workspace.credential  # the connection's id, never its secret
                source = str(run_dir / "repo")
            base, files = await workspace.prepare(run_dir, source)
        except workspace.WorkspaceError as err:
            raise ApplicationError(str(err), type="WorkspaceError", non_retryable=True) from err
        finally:
            if spec.workspace.kind == "git_repository":
                await asyncio.to_thread(shutil.rmtree, run_dir / "repo", True)
        await self.runs.set_fields(run_id, base_commit=base)
        data.update({"base_commit": base, "files": files})
        if source and spec.workspace.kind == "local_copy":
            data["path"] = source
        await self.ledger.append_events(run_id, [ev.NewEvent(type=ev.WORKSPACE_INITIALIZED, data=data)])
        if self.provider.workspace_transfer == "archive":
            sandbox = await self._remote_spec(spec, run_dir)
        else:
            sandbox = SandboxSpec(
                run_id=run_id,
                workspace_dir=str(run_dir / "workspace"),
                socket_dir=str(self.settings.socket_path.parent),
                code_dirs=[str(d) for d in RUNNER_CODE_DIRS],
                env=runner_env(spec, self.settings),
                secrets=runner_secrets(tokens),
                # -S: no site-packages (and their .pth hooks) at start; the harness adds them if it needs them.
                argv=[sys.executable, "-S", "-m", "runner"],
                log_path=str(run_dir / "sandbox.log"),
            )
        try:
            handle = await self.provider.create(sandbox)
        except (OSError, RuntimeError, ValueError) as err:
            raise ApplicationError(f"sandbox did not start: {err}", type="SandboxError") from err
        await self.runs.set_fields(run_id, sandbox_handle=handle.model_dump())
        await self._advance(
            run_id,
            RunStatus.RUNNING,
            [ev.system_message(f"sandbox launched ({self.provider.describe(handle)})")],
        )
        return c.StatusOut(status=await self._status(run_id))

    async def _git_auth(self, spec: RunSpec) -> workspace.GitAuth:
        """The git_repository workspace's credential, opened here and only for the clone: its ``git`` connection
        must still be active (a revoked or replaced-then-revoked one fails the run, naming the connection)."""
        cid = spec.workspace.credential or ""
        row = await self.connections.get(spec.tenant_id, cid)
        if self._sealer is None:
            raise workspace.WorkspaceError("credential storage is disabled on this worker (FLUIDBOX_CREDENTIAL_KEY)")
        try:
            if row is None or row.transport != "git":
                raise NotFound()
            blob, _ = await self.connections.credential(cid)
            secret = self._sealer.open(blob, context=credential_context(spec.tenant_id)).decode()
        except (NotFound, SealingError):
            raise workspace.WorkspaceError(f"git credential {cid} is no longer usable (revoked or unreadable)") from (
                None
            )
        return workspace.GitAuth(scheme=row.scheme, secret=secret)

    async def _fetch_repository(
        self, url: str, ref: str | None, dest: Path, auth: workspace.GitAuth | None = None
    ) -> dict[str, object]:
        """Clone a git_repository workspace here, in the control plane (never with a credential in the
        sandbox); an https URL must resolve to public addresses (FLUIDBOX_ALLOW_LOOPBACK_CONNECTORS
        admits loopback, for tests, and then plain http to a loopback server), and git connects to those
        addresses only, following no redirect."""
        policy = self.url_policy
        commit = await workspace.fetch(url, ref, dest, policy, auth)
        return {"repository": url, "ref": ref, "commit": commit}

    async def _remote_spec(self, spec: RunSpec, run_dir: Path) -> SandboxSpec:
        """A sandbox off this host: the prepared tree goes up as an archive (by digest), the runner gets a
        one-time bootstrap credential instead of its tokens, and reaches the API over HTTP."""
        run_id = spec.run_id
        limit = self.settings.workspace_archive_max_mb * MIB
        try:
            data = await asyncio.to_thread(workspace.pack, run_dir / "workspace", limit)
        except workspace.WorkspaceError as err:
            raise ApplicationError(str(err), type="WorkspaceError", non_retryable=True) from err
        stored = await self.archives.put(run_id, "initial", data)
        bootstrap = await self.tokens.issue_token(
            spec.tenant_id, run_id, BOOTSTRAP_AUDIENCE, self.settings.token_ttl_secs, secrets.token_hex(16)
        )
        ref = f"/internal/sessions/{run_id}/workspace"
        env = runner_env(spec, self.settings)
        env.pop(wire.ENV_CONTROL_SOCKET, None)
        env.update(
            {
                wire.ENV_CONTROL_URL: self.settings.runner_url.rstrip("/"),
                wire.ENV_BOOTSTRAP_FILE: BOOTSTRAP_FILE,
                wire.ENV_WORKSPACE_REF: ref,
                wire.ENV_WORKSPACE_SHA256: stored.sha256,
            }
        )
        config = spec.harness_config
        return SandboxSpec(
            run_id=run_id,
            env=env,
            argv=["python", "-m", "runner"],
            workspace=WorkspaceRef(ref=ref, sha256=stored.sha256, size=stored.size),
            image=str(config.get("runner_image") or ""),
            runtime_class=str(config.get("runtime_class") or ""),
            resources=Resources(
                cpu_millis=self.settings.sandbox_cpu_millis,
                memory_mb=self.settings.sandbox_memory_mb or None,
                ephemeral_mb=self.settings.sandbox_ephemeral_mb,
            ),
            deadline_secs=spec.budgets.max_wall_clock_secs,
            bootstrap=bootstrap,
        )

    async def _collect_workspace(self, run_id: str) -> list[str]:
        """Rebuild the run's directory from its archives (a sandbox off this host uploaded its final state):
        the baseline from the prepared archive when another worker prepared it, the tree from the upload.
        Returns what the extraction refused (``path: why``).

        Raises:
            workspace.WorkspaceError: no upload (the sandbox ended before its runner could), or unreadable.
        """
        final = await self.archives.get(run_id, "final")
        if final is None:
            raise workspace.WorkspaceError("the sandbox uploaded no final workspace (it ended before its runner could)")
        run_dir = self._run_dir(run_id)
        expanded = 8 * self.settings.workspace_archive_max_mb * MIB
        await asyncio.to_thread(rundirs.make_private, self.settings.runs_dir, run_dir)
        if not await asyncio.to_thread((run_dir / "baseline.git" / "objects").is_dir):
            initial = await self.archives.get(run_id, "initial")
            if initial is None:
                raise workspace.WorkspaceError("the prepared workspace archive is gone")
            source = run_dir / "initial"
            await asyncio.to_thread(workspace.unpack, initial.data, source, expanded)
            await workspace.prepare(run_dir, str(source))
            await asyncio.to_thread(shutil.rmtree, source)
        return await asyncio.to_thread(workspace.unpack, final.data, run_dir / "workspace", expanded)

    @activity.defn(name=c.SWEEP_LIVENESS)
    async def sweep_liveness(self, inp: c.SweepIn) -> c.SweepOut:
        """One look at every live run: end those whose sandbox died or whose runner went silent.

        A sandbox found not running is a suspect first and fails only if the next sweep (about a second
        later) still finds it so, giving a just-posted /result time to land. A failure is recorded the way
        the workflow records one (a finalization intent and ``run.error``), then the run's workflow is
        signalled; a run whose intent exists but whose workflow still waits is signalled again. A run whose
        workflow is gone (terminated from the Temporal UI, Temporal's data lost) is wound down here instead.
        """
        runs = await self.runs.live_runs()
        ended = await self._sweep_orphans()
        suspects: list[str] = []
        out = c.SweepOut(next_secs=self.settings.liveness_check_secs)
        gateway_up: float | None = None
        for run in runs:
            run_id = run.id
            if run_id in ended:
                continue
            if run.has_intent:
                if await self._wake(run_id):
                    out.woken += 1
                elif await self._end_if_workflow_gone(run_id):
                    out.failed += 1
                continue
            handle = self._handle(run)
            state = await self.provider.status(handle) if handle else "missing"
            reason: str | None = None
            if state != "running":
                if run_id not in inp.suspects:
                    suspects.append(run_id)
                    continue
                reason = await self._death(handle)
            else:
                # Silence only counts while the runner could have reached us: since this worker and the
                # API's gateway socket came up (a restarted control plane gives its runners time).
                silent = run.silent_secs or 0.0
                if silent > self.settings.heartbeat_stale_secs:
                    if gateway_up is None:
                        gateway_up = await asyncio.to_thread(self._gateway_up_secs)
                    silent = min(silent, time.monotonic() - self.started, gateway_up)
                if silent > self.settings.heartbeat_stale_secs:
                    reason = f"runner stopped heartbeating (silent for {int(silent)}s)"
                    # A sandbox that never started talking may be stuck on its platform (a Pod Pending).
                    waiting = (await self.provider.collect(handle)).failure if handle else None
                    if waiting:
                        reason = f"{reason}: {waiting}"
            if reason is not None:
                await self.request_finalization(
                    c.FinalizationIn(run_id=run_id, outcome="failed", reason=reason, error=reason)
                )
                if not await self._wake(run_id):
                    await self._end_if_workflow_gone(run_id)
                out.failed += 1
        out.suspects = suspects
        return out

    async def _sweep_orphans(self) -> set[str]:
        """On a worker's first sweep and every FLUIDBOX_SANDBOX_ORPHAN_SWEEP_SECS: end the runs whose workflow
        is gone, then destroy the sandboxes whose run is over or unknown (a worker died between create and
        record, or between a run's end and its teardown; a run ended while its stack was stopped), found
        where the provider records them. Returns the runs it ended."""
        if time.monotonic() - self._orphans_swept < self.settings.sandbox_orphan_sweep_secs:
            return set()
        self._orphans_swept = time.monotonic()
        ended = await self._end_runs_without_workflows()
        held = await self.provider.sandboxes()
        if not held:
            return ended
        unfinished = await self.runs.unfinished_run_ids(held)
        for run_id in held:
            if run_id not in unfinished:
                activity.logger.warning("destroying the orphaned sandbox of run %s", run_id)
                await self.provider.destroy(SandboxHandle(provider=self.provider.name, run_id=run_id), grace_secs=0)
        return ended

    async def _end_runs_without_workflows(self) -> set[str]:
        """Every unfinished run whose workflow is gone, ended here (a run with an intent is found sooner, by
        ``_wake``; this finds the ones nobody signals: a runner still working, a run waiting on a human)."""
        runs = await self.runs.unfinished_runs()
        limit = asyncio.Semaphore(_SWEEP_CONCURRENCY)

        async def gone(run: UnfinishedRun) -> str | None:
            async with limit:
                return await self._workflow_gone(run.id)

        looked = await asyncio.gather(*(gone(run) for run in runs), return_exceptions=True)
        whys = [why if isinstance(why, str) else None for why in looked]  # a lookup that failed: no answer
        started = [why for run, why in zip(runs, whys, strict=True) if not run.unstarted]
        lost = sum(why == WORKFLOW_LOST for why in started)
        if lost >= LOST_ALL_MINIMUM and lost == len(started):
            # Every run missing at once is far likelier a worker pointed at the wrong Temporal (address,
            # namespace) than every workflow deleted: end none, say so; a cancel still ends one run at a time.
            activity.logger.error(
                "none of the %d started runs has a workflow in Temporal namespace %r at %s: not ending them "
                "(check FLUIDBOX_TEMPORAL_ADDRESS and FLUIDBOX_TEMPORAL_NAMESPACE; cancel a run to end it)",
                lost, self.settings.temporal_namespace, self.settings.temporal_target,
            )  # fmt: skip
            return set()

        async def end(run: UnfinishedRun, why: str | None) -> bool:
            # Never started (its starter died): the stranded-run check starts it, and then the run goes on.
            if why is None or (why == WORKFLOW_LOST and run.unstarted):
                return False
            async with limit:
                return await self._end_without_workflow(run.id, why)

        outcomes = await asyncio.gather(
            *(end(run, why) for run, why in zip(runs, whys, strict=True)), return_exceptions=True
        )
        ended: set[str] = set()
        for run, outcome in zip(runs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                # One run that cannot be ended must not stop the sweep from watching every other run.
                activity.logger.warning("run %s has no workflow and could not be ended: %r", run.id, outcome)
            elif outcome:
                ended.add(run.id)
        return ended

    async def _end_if_workflow_gone(self, run_id: str) -> bool:
        """A signal found no workflow to wake: end the run here if its workflow is gone for good."""
        why = await self._workflow_gone(run_id)
        if why is None:
            return False
        try:
            return await self._end_without_workflow(run_id, why)
        except Exception as err:
            # One run that cannot be ended must not stop the sweep from watching every other run.
            activity.logger.warning("run %s has no workflow and could not be ended: %r", run_id, err)
            return False

    async def _workflow_gone(self, run_id: str) -> str | None:
        """Why the run's workflow can never end the run, or None: it runs (or Temporal cannot say now)."""
        handle = activity.client().get_workflow_handle(c.workflow_id(run_id))
        try:
            status = (await handle.describe()).status
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return WORKFLOW_LOST
            activity.logger.warning("cannot look up the workflow of run %s: %s", run_id, err)
            return None
        if status is None or status == WorkflowExecutionStatus.RUNNING:
            return None
        if status == WorkflowExecutionStatus.TERMINATED:
            return WORKFLOW_TERMINATED
        return f"its workflow ended ({status.name.lower().replace('_', ' ')}) without ending the run"

    async def _end_without_workflow(self, run_id: str, why: str) -> bool:
        """Wind the run down in its workflow's place: record ``why`` as its failure unless an intent (a cancel,
        the runner's result) is recorded already, then finalize it as the workflow would have (sandbox
        destroyed, diff, deliveries), with no quiesce: nobody is left to wait for it. True if it ended here."""
        row = await self.runs.get_run(None, run_id)
        # Looked up after the workflow was found closed: a run its workflow ended normally is terminal by now.
        if row is None or is_terminal(row.status):
            return False
        activity.logger.warning("run %s: %s; ending it", run_id, why)
        created, _ = await self.runs.request_finalization(run_id, "failed", reason=why, quiesce=False)
        message = ev.NewEvent(type=ev.RUN_ERROR, data={"message": why}) if created else ev.system_message(why)
        await self.ledger.append_events(run_id, [message])
        status = await self._status(run_id)
        if status != RunStatus.FINALIZING and not is_terminal(status):
            intent = await self.runs.finalization(run_id)
            await self.runs.transition(run_id, RunStatus.FINALIZING, intent.reason if intent else why)
        return is_terminal((await self.finalize(c.RunRef(run_id=run_id))).status)

    async def _wake(self, run_id: str) -> bool:
        """Signal the run's workflow to act on its intent (by name: activities never import workflows).
        False when there is no running workflow to signal."""
        handle = activity.client().get_workflow_handle(c.workflow_id(run_id))
        try:
            await handle.signal(c.SWEEP_SIGNAL)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return False  # it ended, or it is gone (``_end_if_workflow_gone`` tells which)
        return True

    def _gateway_up_secs(self) -> float:
        """How long the API's gateway socket has been up (the API binds a new one on every start); 0 while down."""
        path = self.settings.socket_path
        if not path.parent.is_dir():
            return float("inf")  # no local gateway to judge by (a remote API): runner silence alone decides
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(str(path))
            return max(0.0, time.time() - path.stat().st_mtime)
        except OSError:
            return 0.0

    async def _death(self, handle: SandboxHandle | None) -> str:
        """Why a sandbox ended without a result: the platform's reason (a Pod OOMKilled, evicted…), or the
        runner naming a control plane it could not reach in its last output."""
        collected = await self.provider.collect(handle) if handle is not None else None
        if collected is not None and collected.failure:
            return f"sandbox ended: {collected.failure}"
        if collected is not None and wire.GATEWAY_GONE in collected.log_tail:
            return (
                f"runner gave up: {wire.GATEWAY_GONE} for longer than {wire.ENV_GATEWAY_STALENESS_SECS}"
                f" ({self.settings.gateway_staleness_secs:g}s)"
            )
        return "sandbox died (runner exited without reporting a result)"

    @activity.defn(name=c.REQUEST_FINALIZATION)
    async def request_finalization(self, inp: c.FinalizationIn) -> c.StatusOut:
        created, status = await self.runs.request_finalization(
            inp.run_id, inp.outcome, reason=inp.reason, quiesce=inp.quiesce
        )
        if created:
            new: list[ev.NewEvent] = []
            if inp.budget:
                new.append(
                    ev.NewEvent(
                        type=ev.BUDGET_EXCEEDED, data={"budget": inp.budget, "limit": inp.limit, "spent": inp.spent}
                    )
                )
            if inp.error:
                new.append(ev.NewEvent(type=ev.RUN_ERROR, data={"message": inp.error}))
            await self.ledger.append_events(inp.run_id, new)
        return c.StatusOut(status=status)

    @activity.defn(name=c.BEGIN_FINALIZE)
    async def begin_finalize(self, ref: c.RunRef) -> c.BeginFinalizeOut:
        status = await self._status(ref.run_id)
        if is_terminal(status) or status in (RunStatus.FINALIZING, RunStatus.CANCELLING):
            intent = await self.runs.finalization(ref.run_id)
            return c.BeginFinalizeOut(
                status=status, needs_quiesce=status == RunStatus.CANCELLING and bool(intent and intent.needs_quiesce)
            )
        intent = await self.runs.finalization(ref.run_id)
        if intent is None:  # defensive: the workflow only finalizes with an intent recorded
            await self.runs.request_finalization(ref.run_id, "failed", reason="finalized without an intent")
            intent = await self.runs.finalization(ref.run_id)
        assert intent is not None
        if intent.needs_quiesce:
            await self.runs.transition(
                ref.run_id,
                RunStatus.CANCELLING,
                intent.reason,
                [ev.NewEvent(type=ev.QUIESCE_REQUESTED, data={"deadline_secs": int(self.settings.quiesce_secs)})],
            )
            return c.BeginFinalizeOut(status=RunStatus.CANCELLING, needs_quiesce=True)
        await self.runs.transition(ref.run_id, RunStatus.FINALIZING, intent.reason)
        return c.BeginFinalizeOut(status=RunStatus.FINALIZING, needs_quiesce=False)

    @activity.defn(name=c.AWAIT_SANDBOX_EXIT)
    async def await_sandbox_exit(self, inp: c.SandboxExitIn) -> c.StatusOut:
        """Give a quiescing runner until the deadline to stop on its own."""
        handle = self._handle(await self.runs.get_run(None, inp.run_id))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + inp.timeout_secs
        exited = handle is None
        while not exited and loop.time() < deadline:
            activity.heartbeat()
            exited = await self.provider.status(handle) != "running"  # type: ignore[arg-type]
            if not exited:
                await asyncio.sleep(0.25)
        try:
            await self.runs.transition(inp.run_id, RunStatus.FINALIZING)
        except InvalidTransition:
            pass
        return c.StatusOut(status="exited" if exited else "timeout")

    @activity.defn(name=c.FINALIZE)
    async def finalize(self, ref: c.RunRef) -> c.StatusOut:
        """Tear the run down and record its end; heartbeats every ``PULSE_SECS`` with what it is doing.

        Whatever the agent left, this ends: the sandbox is destroyed (a workspace that cannot be taken back is
        removed), the collection is bounded (``workspace.Budget``), and after ``COLLECT_ATTEMPTS`` attempts
        that never came back from collecting, the run ends without a diff and the reason says so."""
        pulse = _Pulse()
        async with pulse.running():
            return await self._finalize(ref.run_id, pulse)

    async def _finalize(self, run_id: str, pulse: _Pulse) -> c.StatusOut:
        row = await self.runs.get_run(None, run_id)
        if row is None:
            raise ApplicationError("run vanished", non_retryable=True)
        if is_terminal(row.status):
            await self._deliver(run_id)  # a retry after the terminal commit still starts the deliveries
            await self._retire_run_dir(run_id)
            return c.StatusOut(status=row.status)
        intent = await self.runs.finalization(run_id)
        outcome = intent.outcome if intent else "failed"
        await self.approvals.deny_open_approvals(run_id, "session is not active")
        await self.approvals.settle_inflight_claims(run_id)
        async with self.pool.acquire() as conn:
            await end_all(conn, run_id)  # a run parked for a connection waits no more
        handle = self._handle(row)
        if handle is not None:
            pulse.phase("destroy")
            await self.provider.destroy(handle)
        artifacts: list[dict[str, str]] = []
        new: list[ev.NewEvent] = []
        diff_failure: str | None = None
        run_dir = self._run_dir(run_id)
        try:
            if row.run_spec.get("pending_requirements"):
                # Parked up front and never bound: nothing was provisioned, so there is no workspace to diff.
                raise _NothingRan()
            pulse.phase("collect")
            tried = await asyncio.to_thread(_collect_attempt, run_dir)
            if tried > COLLECT_ATTEMPTS:
                raise _Unfinished(f"collecting the workspace did not finish in {tried - 1} attempts")
            if self.provider.workspace_transfer == "archive":
                refused = await self._collect_workspace(run_id)
                if refused:
                    new.append(ev.system_message(f"workspace entries not collected: {'; '.join(refused[:20])}"))
            patch, truncated = await workspace.diff(run_dir, beat=pulse.progress)
            await asyncio.to_thread(_collect_done, run_dir)
            content = patch or "(no changes)"
            if patch and not await self.runs.has_gate_calls(run_id):
                # The server cannot prove this diff was produced under the gate: say so.
                content = "# warning: this run changed files without ever asking /permission\n" + content
            artifacts.append(
                {"kind": "diff", "name": "changes.patch", "content": content, "content_type": "text/x-diff"}
            )
            new.append(
                ev.NewEvent(
                    type=ev.ARTIFACT_COLLECTED,
                    data={
                        "kind": "diff",
                        "name": "changes.patch",
                        "bytes": len(content.encode()),
                        "sha256": sha256_hex(content),
                        "truncated": truncated,
                    },
                )
            )
        except _NothingRan:
            pass
        except _Unfinished as err:
            # Earlier attempts never came back from the walk: a listing would walk the same tree again.
            diff_failure = f"diff unavailable: {err}"
            content = f"({diff_failure})\n"
            artifacts.append(
                {"kind": "diff", "name": "changes.patch", "content": content, "content_type": "text/plain"}
            )
            missing = {"kind": "diff", "reason": str(err), "fallback": "none", "sha256": sha256_hex(content)}
            new.append(ev.NewEvent(type=ev.ARTIFACT_MISSING, data=missing))
        except workspace.WorkspaceError as err:
            # No diff is never a quiet "completed": the reason says so and review gets a git-free listing.
            diff_failure = f"diff unavailable: {err}"
            pulse.phase("listing")
            listing = await workspace.listing(run_dir, workspace.Budget.collection(LISTING_SECS), pulse.progress)
            await asyncio.to_thread(_collect_done, run_dir)
            content = f"({diff_failure})\n\n{listing}"
            artifacts.append(
                {"kind": "diff", "name": "changes.patch", "content": content, "content_type": "text/plain"}
            )
            missing = {"kind": "diff", "reason": str(err), "fallback": "file listing", "sha256": sha256_hex(content)}
            new.append(ev.NewEvent(type=ev.ARTIFACT_MISSING, data=missing))
        pulse.phase("record")
        summary = intent.summary if intent else None
        if summary:
            artifacts.append(
                {"kind": "summary", "name": "summary.md", "content": summary, "content_type": "text/markdown"}
            )
        terminal = outcome_status(outcome)
        reason = intent.reason if intent else None
        if terminal == RunStatus.CANCELLED and not reason:
            reason = "cancelled by user"
        if diff_failure:  # the reported outcome stands; its reason leads with the missing diff
            reason = f"{diff_failure}; {reason}" if reason else diff_failure
        _, final = await self.runs.finish(run_id, terminal, reason, summary, outcome, artifacts, new)
        if self.provider.workspace_transfer == "archive":
            await self.archives.drop(run_id)  # the diff is recorded: the trees go
        await self._deliver(run_id)
        await self._retire_run_dir(run_id)
        return c.StatusOut(status=final)

    async def _retire_run_dir(self, run_id: str) -> None:
        """The diff and artifacts are recorded: the run's directory goes (now, or after the retention)."""
        await asyncio.to_thread(
            rundirs.retire, self.settings.runs_dir, self._run_dir(run_id), self.settings.run_dir_retention_secs
        )

    async def _deliver(self, run_id: str) -> None:
        """One DeliveryWorkflow per webhook destination; they never touch the run (idempotent)."""
        await start_deliveries(self.runs, self.deliveries, activity.client(), self.settings.task_queue, run_id)

    @activity.defn(name=c.OPEN_APPROVAL)
    async def open_approval(self, inp: c.ApprovalIn) -> c.ApprovalRow:
        row = await self.approvals.open_approval(inp.run_id, inp.tool_call_id)
        return _approval(row)

    @activity.defn(name=c.READ_APPROVAL)
    async def read_approval(self, inp: c.ApprovalIn) -> c.ApprovalRow:
        rows = await self.approvals.list_approvals((await self.runs.run_spec(inp.run_id)).tenant_id, run_id=inp.run_id)
        row = next(r for r in rows if r.tool_call_id == inp.tool_call_id)
        return _approval(row)

    @activity.defn(name=c.EXPIRE_APPROVAL)
    async def expire_approval(self, inp: c.ApprovalIn) -> c.ApprovalRow:
        current = await self.read_approval(inp)
        row = await self.approvals.expire_approval(current.approval_id)
        return _approval(row)

    @activity.defn(name=c.RESUME_AFTER_APPROVAL)
    async def resume_after_approval(self, ref: c.RunRef) -> c.StatusOut:
        await self.approvals.resume_after_approval(ref.run_id)
        return c.StatusOut(status=await self._status(ref.run_id))

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.claim_sandbox,
            self.provision,
            self.sweep_liveness,
            self.request_finalization,
            self.begin_finalize,
            self.await_sandbox_exit,
            self.finalize,
            self.open_approval,
            self.read_approval,
            self.expire_approval,
            self.resume_after_approval,
        ]


class _NothingRan(Exception):
    """The run ended before anything was provisioned."""


class _Unfinished(Exception):
    """Earlier finalize attempts started collecting the workspace and never finished."""


def _collect_attempt(run_dir: Path) -> int:
    """Count one more attempt at collecting ``run_dir``'s workspace; how many there have been, this one included.

    Written before the walk and removed once it came back (whatever it found), so only attempts that never
    came back (timed out, cancelled, their worker died) are counted. No run directory: 1, nothing written.
    """
    mark = run_dir / COLLECT_MARK
    try:
        tried = int(mark.read_text() or "0")
    except (OSError, ValueError):
        tried = 0
    with contextlib.suppress(OSError):
        if run_dir.is_dir():
            mark.write_text(str(tried + 1))
    return tried + 1


def _collect_done(run_dir: Path) -> None:
    (run_dir / COLLECT_MARK).unlink(missing_ok=True)


class _Pulse:
    """The finalize activity's heartbeat, with what it is doing (and the collector's progress)."""

    def __init__(self) -> None:
        self.details: dict[str, object] = {"phase": "start"}

    def phase(self, name: str) -> None:
        self.details = {"phase": name}

    def progress(self, seen: dict[str, object]) -> None:
        self.details = {"phase": self.details.get("phase"), **seen}

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self._beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _beat(self) -> None:
        while True:
            activity.heartbeat(self.details)
            await asyncio.sleep(PULSE_SECS)


def _approval(row: ApprovalRecord) -> c.ApprovalRow:
    return c.ApprovalRow(
        approval_id=str(row.id),
        status=row.status,
        expires_at=row.expires_at.isoformat() if row.expires_at is not None else None,
        reason=row.decision_reason or None,
    )
