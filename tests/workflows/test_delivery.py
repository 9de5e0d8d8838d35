"""DeliveryWorkflow on the time-skipping test server, with the real activities, a real PostgreSQL and a
real HTTP receiver: the retry schedule, the stable delivery id, signatures, refusals and skips."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import ssl
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.delivery import DeliveryActivities
from api.app import seed_policies
from cli.stack import Postgres
from contracts import temporal as c
from core.runspec import InvocationContext, RunSpec
from core.signing import verify
from core.states import RunStatus
from db.deliveries import callback_secret_context
from db.engine import create_pool, migrate
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy
from services.context import AppContext
from services.runs import RunRequest
from tests.helpers import context_over
from workflows.delivery import BACKOFF_SECS, MAX_ATTEMPTS, DeliveryWorkflow

TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"
# Kept apart from histories/*.json, which test_replay.py replays against RunWorkflow.
HISTORIES = Path(__file__).resolve().parent / "histories" / "delivery"


# ---- a real HTTP receiver ------------------------------------------------------------------------


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A minimal HTTP/1.1 server on 127.0.0.1 answering scripted statuses (then ``default``).

    ``answer`` picks how the response goes out: ``"normal"`` (empty body), ``"endless"`` (200 and a
    chunked body that never ends) or ``"drip"`` (a status line, then one header byte at a time,
    forever). ``hung_up`` is set once the client closes a connection the receiver was still writing to.
    """

    statuses: list[int] = field(default_factory=list)
    default: int = 200
    answer: str = "normal"
    tls: ssl.SSLContext | None = None
    requests: list[Received] = field(default_factory=list)
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def __aenter__(self) -> Receiver:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")[1:]
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Received(headers, body))
            status = self.statuses.pop(0) if self.statuses else self.default
            if self.answer == "endless":
                await self._endless(writer, status)
            elif self.answer == "drip":
                await self._drip(writer, status)
            else:
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def _endless(self, writer: asyncio.StreamWriter, status: int) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\ntransfer-encoding: chunked\r\n\r\n".encode())
        chunk = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
        try:
            while True:  # a body without end: only the client going away stops it
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            self.hung_up.set()

    async def _drip(self, writer: asyncio.StreamWriter, status: int) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nx-drip: ".encode())
        try:
            while True:  # the headers never end, yet no single read ever waits long
                writer.write(b"z")
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            self.hung_up.set()


def assert_signed(req: Received, secret: str) -> None:
    """What a receiver does: recompute the signature over the raw body with the shown-once secret."""
    verify(
        secret, req.headers["x-fluidbox-timestamp"], req.body, req.headers["x-fluidbox-signature"], now=int(time.time())
    )
    assert req.headers["x-fluidbox-event"] == "run.finished"
    assert req.headers["content-type"] == "application/json"


# ---- fixtures: PostgreSQL, the time-skipping server, a worker with the real activities ------------


@dataclass
class Env:
    ctx: AppContext
    tenant_id: str
    sealer: Sealer
    client: Client
    task_queue: str


@pytest.fixture(scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    pg = Postgres(tmp_path_factory.mktemp("dlv") / "pg")
    url = pg.start()
    try:
        await migrate(url)
        pool = await create_pool(url, min_size=1, max_size=5)
        sealer = Sealer.from_setting(secrets.token_hex(32))
        ctx = context_over(pool, sealer=sealer)
        tenant_id = await ctx.identity.boot_tenant()
        await seed_policies(ctx, tenant_id)
        acts = DeliveryActivities(ctx.deliveries, sealer, UrlPolicy(allow_loopback=True))
        task_queue = f"dlv-{uuid.uuid4()}"
        async with await WorkflowEnvironment.start_time_skipping(
            test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter
        ) as temporal:
            async with Worker(
                temporal.client, task_queue=task_queue, workflows=[DeliveryWorkflow], activities=acts.all()
            ):
                yield Env(ctx, tenant_id, sealer, temporal.client, task_queue)
        await pool.close()
    finally:
        pg.stop()


@dataclass
class Delivery:
    run_id: str
    delivery_id: str
    subscription_id: str
    secret: str


async def finished_run(env: Env, url: str, *, enabled: bool = True, rotated: bool = False) -> Delivery:
    """A subscription with a sealed callback secret, and a finished run it invoked with one webhook destination."""
    ctx = env.ctx
    policy = await ctx.policies.policy_head(env.tenant_id, "demo")
    assert policy is not None
    agent, _ = await ctx.agents.create_agent(
        env.tenant_id,
        f"agent-{uuid.uuid4().hex[:8]}",
        None,
        {"harness": "replay", "model": "replay", "policy_id": str(policy.policy_id)},
    )
    sub_id = str(uuid.uuid4())
    secret = "fbx_whsec_" + secrets.token_hex(32)
    async with ctx.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO trigger_subscriptions (id, tenant_id, name, agent_id, kind, enabled, task_template,"
            " callback_url, callback_secret_sealed, token_generation) VALUES ($1,$2,$3,$4,'api',$5,'t',$6,$7,1)",
            uuid.UUID(sub_id),
            uuid.UUID(env.tenant_id),
            f"sub-{sub_id[:8]}",
            uuid.UUID(str(agent.id)),
            enabled,
            url,
            env.sealer.seal(secret, context=callback_secret_context(sub_id)),
        )
        if rotated:
            await conn.execute("UPDATE trigger_subscriptions SET token_generation = 2 WHERE id = $1", uuid.UUID(sub_id))
    factory = ctx.run_factory  # its workflows in memory: these tests start no run workflow
    dest = {"kind": "webhook", "subscription_id": sub_id, "url": url, "token_generation": 1}
    spec: RunSpec = await factory.prepare(
        env.tenant_id,
        RunRequest(agent=agent.name, task="deliver me", result_destinations=[dest]),
        InvocationContext(kind="api", actor="trigger", subscription_id=sub_id),
    )
    await ctx.runs.create_run(spec, invoked_by_kind="trigger")
    await ctx.runs.request_finalization(spec.run_id, "completed", reason="done")
    await ctx.runs.transition(spec.run_id, RunStatus.FINALIZING)
    await ctx.runs.finish(spec.run_id, RunStatus.COMPLETED, None, "all good", "completed", [], [])
    (row,) = await ctx.deliveries.enqueue(spec)
    return Delivery(spec.run_id, str(row.id), sub_id, secret)


async def deliver(env: Env, d: Delivery) -> tuple[str, Any]:
    handle = await env.client.start_workflow(
        DeliveryWorkflow.run,
        c.DeliveryInput(delivery_id=d.delivery_id, run_id=d.run_id, index=0),
        id=c.delivery_workflow_id(d.run_id, 0),
        task_queue=env.task_queue,
    )
    result = await handle.result()
    return str(result), await handle.fetch_history()


async def ledger(env: Env, run_id: str, prefix: str = "callback.") -> list[dict[str, Any]]:
    rows = await env.ctx.ledger.events_after(run_id, 0, 1000)
    return [r.payload for r in rows if r.type.startswith(prefix)]


# ---- tests ---------------------------------------------------------------------------------------


async def test_a_dead_receiver_gets_six_attempts_on_the_fixed_schedule_then_the_delivery_fails(env: Env) -> None:
    async with Receiver(default=503) as rx:
        d = await finished_run(env, rx.url)
        status, history = await deliver(env, d)
    assert status == "failed"
    # Workflow time: each wait is a durable timer of exactly the table's length, between two attempts.
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToSeconds()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    assert timers == list(BACKOFF_SECS[: MAX_ATTEMPTS - 1]) == [5, 30, 120, 600, 1800]
    kinds = [
        "attempt"
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == c.DELIVER_WEBHOOK
        else "wait"
        if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED
        else None
        for e in history.events
    ]
    assert [k for k in kinds if k] == ["attempt", "wait"] * 5 + ["attempt"]
    scheduled = [
        e.event_time.ToSeconds()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == c.DELIVER_WEBHOOK
    ]
    offsets = [t - scheduled[0] for t in scheduled]
    assert offsets == sorted(offsets) and offsets[-1] >= 5 + 30 + 120 + 600 + 1800
    # Six real requests, one delivery id, the attempt number counting up, each one signed.
    assert len(rx.requests) == MAX_ATTEMPTS
    assert {r.headers["x-fluidbox-delivery"] for r in rx.requests} == {d.delivery_id}
    assert [r.json()["attempt"] for r in rx.requests] == [1, 2, 3, 4, 5, 6]
    for req in rx.requests:
        assert_signed(req, d.secret)
    row = await env.ctx.deliveries.get(d.delivery_id)
    assert row is not None
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 6, 503)
    assert row.next_attempt_at is None
    (failed,) = await ledger(env, d.run_id)
    assert failed["type"] == "callback.failed"
    assert failed["data"]["attempts"] == 6 and "HTTP 503" in failed["data"]["error"]
    assert failed["data"]["delivery_id"] == d.delivery_id
    # The run itself is untouched by its receiver's death.
    run = await env.ctx.runs.get_run(None, d.run_id)
    assert run is not None and run.status == "completed"


async def test_a_receiver_that_fails_once_gets_the_same_delivery_id_twice_and_a_verifiable_body(env: Env) -> None:
    async with Receiver(statuses=[500, 200]) as rx:
        d = await finished_run(env, rx.url)
        status, history = await deliver(env, d)
    assert status == "delivered"
    if os.environ.get("FLUIDBOX_RECORD_HISTORIES"):
        (HISTORIES / "delivery_retried.json").write_text(history.to_json())
    first, second = rx.requests
    assert first.headers["x-fluidbox-delivery"] == second.headers["x-fluidbox-delivery"] == d.delivery_id
    for req in rx.requests:
        assert_signed(req, d.secret)
    with pytest.raises(Exception, match="does not match"):
        verify(
            "fbx_whsec_" + "0" * 64,
            second.headers["x-fluidbox-timestamp"],
            second.body,
            second.headers["x-fluidbox-signature"],
            now=int(time.time()),
        )
    body = second.json()
    assert body["event"] == "run.finished" and body["delivery_id"] == d.delivery_id and body["attempt"] == 2
    assert body["run"]["id"] == d.run_id and body["run"]["status"] == "completed"
    assert body["run"]["summary"] == "all good" and body["run"]["task"] == "deliver me"
    assert body["run"]["invocation"]["subscription_id"] == d.subscription_id
    assert set(body["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cost_usd",
        "requests",
        "tool_calls",
    }
    assert isinstance(body["artifacts"], list)
    row = await env.ctx.deliveries.get(d.delivery_id)
    assert row is not None
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 2, 200)
    assert row.delivered_at is not None and row.payload_digest.startswith("sha256:")
    assert await ledger(env, d.run_id) == [
        {"type": "callback.delivered", "data": {"delivery_id": d.delivery_id, "url": rx.url, "attempt": 2}}
    ]


async def test_a_forbidden_address_is_refused_at_once_and_nothing_is_sent(env: Env) -> None:
    async with Receiver() as rx:
        # 0.0.0.0 reaches the loopback listener on Linux: had the policy let it through, rx would see it.
        d = await finished_run(env, f"http://0.0.0.0:{rx.port}/hook")
        status, history = await deliver(env, d)
    assert status == "failed"
    assert rx.requests == []
    assert not [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]  # not retried
    (failed,) = await ledger(env, d.run_id)
    assert failed["type"] == "callback.failed"
    assert failed["data"]["attempts"] == 0 and "unspecified address" in failed["data"]["error"]
    row = await env.ctx.deliveries.get(d.delivery_id)
    assert row is not None and row.status == "failed" and "0.0.0.0" in row.last_error


async def test_a_metadata_address_is_refused(env: Env) -> None:
    d = await finished_run(env, "http://169.254.169.254/latest/meta-data/")
    status, _ = await deliver(env, d)
    assert status == "failed"
    (failed,) = await ledger(env, d.run_id)
    assert "cloud metadata address" in failed["data"]["error"]


@pytest.mark.parametrize(
    ("enabled", "rotated", "reason"),
    [(False, False, "disabled"), (True, True, "token was rotated")],
    ids=["disabled", "rotated"],
)
async def test_lost_publish_authority_skips_the_delivery_without_sending(
    env: Env, enabled: bool, rotated: bool, reason: str
) -> None:
    async with Receiver() as rx:
        d = await finished_run(env, rx.url, enabled=enabled, rotated=rotated)
        status, _ = await deliver(env, d)
    assert status == "skipped"
    assert rx.requests == []
    row = await env.ctx.deliveries.get(d.delivery_id)
    assert row is not None and row.status == "skipped" and reason in row.last_error
    (event,) = await ledger(env, d.run_id)
    assert event["type"] == "callback.failed" and event["data"]["skipped"] is True
    assert reason in event["data"]["error"]


async def test_a_repeated_enqueue_adds_no_second_row(env: Env) -> None:
    async with Receiver() as rx:
        d = await finished_run(env, rx.url)
    spec = await env.ctx.runs.run_spec(d.run_id)
    again = await env.ctx.deliveries.enqueue(spec)
    assert [str(r.id) for r in again] == [d.delivery_id]


async def test_the_recorded_delivery_history_replays_deterministically() -> None:
    """Re-record (FLUIDBOX_RECORD_HISTORIES=1) only for a deliberate, patched change of the workflow."""
    paths = sorted(HISTORIES.glob("*.json"))
    assert [p.stem for p in paths] == ["delivery_retried"]
    replayer = Replayer(workflows=[DeliveryWorkflow], data_converter=pydantic_data_converter)
    for path in paths:
        text = path.read_text()
        result = await replayer.replay_workflow(WorkflowHistory.from_json("delivery", text))
        assert result.replay_failure is None
        # Guard the guard: the same history whose first attempt was another activity must not replay.
        bad = text.replace('"deliver_webhook"', '"close_delivery"', 1)
        assert bad != text
        broken = await replayer.replay_workflow(
            WorkflowHistory.from_json("delivery", bad), raise_on_replay_failure=False
        )
        assert broken.replay_failure is not None


# ---- what a hostile receiver can do: stream forever, drip, rebind its name -----------------------


def tls_contexts(tmp: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context holding a certificate for ``name`` from a fresh CA, and a client context trusting that CA."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: Any, ca: bool
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fluidbox test CA")])
    ca_cert = cert("fluidbox test CA", ca_key, ca_name, ca_key, ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = cert(name, leaf_key, ca_name, ca_key, ca=False)
    (tmp / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (tmp / "leaf.key").write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp / "leaf.pem", tmp / "leaf.key")
    client = ssl.create_default_context(cadata=ca_cert.public_bytes(serialization.Encoding.PEM).decode())
    return server, client


def resolving(answers: dict[str, list[str]]) -> UrlPolicy:
    """A loopback-allowing policy whose DNS answers come from ``answers`` (the system resolver never sees them)."""

    def resolve(host: str, port: int) -> list[str]:
        if host not in answers:
            raise OSError(f"{host} does not resolve")
        return answers[host]

    return UrlPolicy(allow_loopback=True, resolver=resolve)


async def attempt_once(
    env: Env,
    url: str,
    *,
    policy: UrlPolicy | None = None,
    send_timeout: float = 10.0,
    verify: ssl.SSLContext | bool = True,
) -> tuple[Delivery, c.DeliveryAttemptOut]:
    """One real delivery attempt, run by the activity outside any workflow."""
    d = await finished_run(env, url)
    acts = DeliveryActivities(
        env.ctx.deliveries,
        env.sealer,
        policy or UrlPolicy(allow_loopback=True),
        send_timeout=send_timeout,
        verify=verify,
    )
    out = await ActivityEnvironment().run(
        acts.deliver_webhook, c.DeliveryAttemptIn(delivery_id=d.delivery_id, attempt=1, retry_in_secs=5)
    )
    return d, out


@pytest.mark.timeout(120)
async def test_a_receiver_streaming_an_endless_body_is_delivered_without_the_worker_reading_it(env: Env) -> None:
    async with Receiver(answer="endless") as rx:
        d = await finished_run(env, rx.url)
        status, _ = await deliver(env, d)
        # The worker hung up on a body that never ends instead of reading it.
        await asyncio.wait_for(rx.hung_up.wait(), timeout=60)
    assert status == "delivered"
    (req,) = rx.requests
    assert_signed(req, d.secret)
    row = await env.ctx.deliveries.get(d.delivery_id)
    assert row is not None
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 1, 200)


@pytest.mark.timeout(120)
async def test_a_receiver_that_never_finishes_its_answer_fails_the_attempt_at_the_bound(env: Env) -> None:
    # Each dripped byte arrives well within any per-read timeout; only a bound on the whole attempt ends it.
    async with Receiver(answer="drip") as rx:
        d, out = await attempt_once(env, rx.url, send_timeout=1.0)
        await asyncio.wait_for(rx.hung_up.wait(), timeout=60)
    assert out.outcome == "retry" and out.status_code is None
    assert out.error == "request failed: the receiver did not answer within 1 s"
    assert len(rx.requests) == 1
    row = await env.ctx.deliveries.get(d.delivery_id)
    assert row is not None
    assert (row.status, row.attempts) == ("pending", 1)
    assert row.last_error == out.error and row.next_attempt_at is not None


async def test_the_request_goes_to_the_admitted_address_with_the_original_host(env: Env) -> None:
    # Only the policy's resolver knows the name: a client that resolved it again would not get through.
    async with Receiver() as rx:
        url = f"http://hook.invalid:{rx.port}/hook?k=v"
        d, out = await attempt_once(env, url, policy=resolving({"hook.invalid": ["127.0.0.1"]}))
    assert out.outcome == "delivered" and out.status_code == 200
    (req,) = rx.requests
    assert req.headers["host"] == f"hook.invalid:{rx.port}"
    assert_signed(req, d.secret)


async def test_an_admitted_address_that_refuses_the_connection_falls_through_to_the_next(env: Env) -> None:
    async with Receiver() as rx:
        dead = f"127.0.0.{2 + rx.port % 200}"  # loopback, but nothing listens on it at this port
        url = f"http://hook.invalid:{rx.port}/hook"
        _, out = await attempt_once(env, url, policy=resolving({"hook.invalid": [dead, "127.0.0.1"]}))
    assert out.outcome == "delivered"
    (req,) = rx.requests
    assert req.headers["host"] == f"hook.invalid:{rx.port}"


async def test_https_to_a_pinned_address_verifies_the_certificate_against_the_original_name(
    env: Env, tmp_path: Path
) -> None:
    server, client = tls_contexts(tmp_path, "hook.invalid")
    policy = resolving({"hook.invalid": ["127.0.0.1"], "other.invalid": ["127.0.0.1"]})
    async with Receiver(tls=server) as rx:
        # The name the certificate was issued for: it is sent as SNI and the certificate matches it.
        d, ok = await attempt_once(env, f"https://hook.invalid:{rx.port}/hook", policy=policy, verify=client)
        # Same address, same certificate, another name: verification refuses before anything is sent.
        _, wrong = await attempt_once(env, f"https://other.invalid:{rx.port}/hook", policy=policy, verify=client)
    assert ok.outcome == "delivered"
    assert wrong.outcome == "retry" and wrong.error is not None and "certificate" in wrong.error.lower()
    (req,) = rx.requests
    assert req.headers["host"] == f"hook.invalid:{rx.port}"
    assert_signed(req, d.secret)
