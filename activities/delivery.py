"""Signed result webhooks: enqueue on terminal, then one attempt per activity call.

Order of every attempt: the row is still pending → the publish authority still holds (subscription
enabled, trigger token generation and callback URL unchanged since the invocation) → the secret opens
→ the URL is admitted by the SSRF policy *now* → build, sign, POST (10 s) → stamp the attempt. Losing
the authority skips the delivery with nothing sent; a refused URL or an unusable secret fails it at
once (a retry cannot fix either); anything else the receiver or the network does is retried by
:class:`workflows.delivery.DeliveryWorkflow`.

The POST connects to an address admission just vetted (never a second DNS answer, which a rebinding
receiver could point at loopback or the metadata service), with the original ``Host`` header and, for
https, the original name as TLS server name and certificate identity. Only the status line and headers
are read — the response body never is — and the whole attempt, connect to status, is bounded by the
send timeout, so a receiver can neither stream into the worker's memory nor drip bytes to hold it.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from contracts import temporal as c
from core import events as ev
from core.digests import sha256_hex
from core.redaction import MARK, scrub_text
from core.signing import sign
from db.deliveries import Deliveries, callback_secret_context, webhook_destinations
from db.models.deliveries import Delivery
from db.runs import Runs
from integrations.sealing import Sealer, SealingError
from integrations.urls import AdmittedUrl, IPAddress, UrlPolicy, UrlRefused

CALLBACK_DELIVERED = "callback.delivered"
CALLBACK_FAILED = "callback.failed"
EVENT = "run.finished"
SEND_TIMEOUT_SECS = 10.0


def display_url(url: str) -> str:
    """The URL without its query (receivers often put tokens there) for the ledger and summaries."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def pinned_url(admitted: AdmittedUrl, address: IPAddress) -> str:
    """``admitted``'s URL with its host replaced by ``address`` (IPv6 in brackets), port kept explicit."""
    parts = urlsplit(admitted.url)
    host = f"[{address}]" if address.version == 6 else str(address)
    query = f"?{parts.query}" if parts.query else ""
    return f"{admitted.scheme}://{host}:{admitted.port}{parts.path}{query}"


async def post_pinned(http: httpx.AsyncClient, admitted: AdmittedUrl, body: bytes, headers: dict[str, str]) -> int:
    """POST ``body`` to one of ``admitted``'s vetted addresses and return the status, never reading the body.

    Addresses are tried in resolution order while the connection itself fails (nothing was sent
    yet); the first one that connects gets the request and its answer is final. The ``Host`` header
    and, for https, the TLS server name (which httpcore hands to ``SSLContext.wrap_bio`` as
    ``server_hostname``, so the certificate is verified against it) stay the original host's.
    """
    pinned_headers = {**headers, "host": urlsplit(admitted.url).netloc}
    extensions = {"sni_hostname": admitted.host} if admitted.scheme == "https" else {}
    last: httpx.ConnectError | None = None
    for address in admitted.addresses:
        try:
            async with http.stream(
                "POST", pinned_url(admitted, address), content=body, headers=pinned_headers, extensions=extensions
            ) as response:
                # Leaving the block closes the connection with the body unread.
                return response.status_code
        except httpx.ConnectError as exc:
            last = exc
    assert last is not None  # admission never returns an empty address list
    raise last


async def start_deliveries(runs: Runs, deliveries: Deliveries, client: Client, task_queue: str, run_id: str) -> int:
    """Enqueue the run's webhook deliveries and start one workflow each; a repeat call starts nothing new.

    Called by the finalizer once the run is terminal (also on a retried finalize that finds it
    terminal already). Returns how many delivery workflows are running or were just started.
    """
    spec = await runs.run_spec(run_id)
    if not webhook_destinations(spec):
        return 0
    started = 0
    for row in await deliveries.enqueue(spec):
        if row.status != "pending":
            continue
        index = row.destination_index
        try:
            await client.start_workflow(
                c.DELIVERY_WORKFLOW,
                c.DeliveryInput(delivery_id=str(row.id), run_id=run_id, index=index),
                id=c.delivery_workflow_id(run_id, index),
                task_queue=task_queue,
                # A running delivery is reused and a finished one is never repeated.
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=scrub_text(f"deliver run {run_id} to {display_url(row.url)}"),
            )
        except WorkflowAlreadyStartedError:
            continue
        started += 1
    return started


class DeliveryActivities:
    def __init__(
        self,
        deliveries: Deliveries,
        sealer: Sealer | None,
        url_policy: UrlPolicy,
        *,
        send_timeout: float = SEND_TIMEOUT_SECS,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """``send_timeout`` bounds a whole attempt; ``verify`` is httpx's (tests pass a context trusting their CA)."""
        self.deliveries = deliveries
        self.sealer = sealer
        self.url_policy = url_policy
        self.send_timeout = send_timeout
        self.verify = verify

    async def _authority(self, row: Delivery) -> tuple[str | None, c.DeliveryAttemptOut | None]:
        """The callback secret if the publish binding still holds; otherwise why not (nothing is sent)."""
        dest: dict[str, Any] = row.destination or {}
        sub_id = row.subscription_id
        if not sub_id:
            return None, c.DeliveryAttemptOut(
                outcome="failed", error="the destination names no subscription to sign with"
            )
        sub = await self.deliveries.subscription(str(sub_id))
        if sub is None or sub.tenant_id != row.tenant_id:
            return None, c.DeliveryAttemptOut(outcome="skipped", error="the subscription no longer exists")
        if not sub.enabled:
            return None, c.DeliveryAttemptOut(outcome="skipped", error="the subscription is disabled")
        frozen = dest.get("token_generation")
        if frozen is not None and int(frozen) != sub.token_generation:
            return None, c.DeliveryAttemptOut(
                outcome="skipped",
                error=f"the subscription's trigger token was rotated after this run was invoked "
                f"(generation {frozen} → {sub.token_generation})",
            )
        if sub.callback_url != row.url:
            return None, c.DeliveryAttemptOut(
                outcome="skipped", error="the subscription's callback URL changed after this run was invoked"
            )
        if self.sealer is None:
            return None, c.DeliveryAttemptOut(
                outcome="failed", error="credential storage is not configured on this worker (FLUIDBOX_CREDENTIAL_KEY)"
            )
        if sub.callback_secret_sealed is None:
            return None, c.DeliveryAttemptOut(outcome="failed", error="the subscription has no callback secret")
        try:
            secret = self.sealer.open(bytes(sub.callback_secret_sealed), context=callback_secret_context(str(sub_id)))
        except SealingError:
            return None, c.DeliveryAttemptOut(outcome="failed", error="the callback secret cannot be opened")
        return secret.decode("utf-8"), None

    @activity.defn(name=c.DELIVER_WEBHOOK)
    async def deliver_webhook(self, inp: c.DeliveryAttemptIn) -> c.DeliveryAttemptOut:
        row = await self.deliveries.get(inp.delivery_id)
        if row is None:
            raise ApplicationError(f"delivery {inp.delivery_id} does not exist", non_retryable=True)
        if row.status != "pending":  # closed already: report it, send nothing
            return c.DeliveryAttemptOut(outcome=row.status, error=row.last_error)
        secret, refusal = await self._authority(row)
        if refusal is not None:
            return refusal
        assert secret is not None
        url = row.url
        try:
            # Admitted right before connecting, on every attempt: where the name points now is what counts,
            # and the connection goes to one of exactly these addresses.
            admitted = await self.url_policy.admit(url)
        except UrlRefused as err:
            return c.DeliveryAttemptOut(outcome="failed", error=str(err))
        body_doc = await self.deliveries.result_body(str(row.session_id), inp.delivery_id, inp.attempt)
        body = json.dumps(body_doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "fluidbox-webhooks/1",
            "x-fluidbox-event": EVENT,
            "x-fluidbox-delivery": inp.delivery_id,
            "x-fluidbox-timestamp": str(timestamp),
            "x-fluidbox-signature": sign(secret, timestamp, body),
        }
        status_code: int | None = None
        error: str | None = None
        try:
            # httpx's timeout is per read; the outer bound covers connect to status line, however slowly
            # the receiver drips. No proxies from the environment (they would defeat admission) and no
            # redirects (a redirect target was never admitted): a 3xx is just a failed attempt.
            async with asyncio.timeout(self.send_timeout):
                async with httpx.AsyncClient(
                    timeout=self.send_timeout, trust_env=False, follow_redirects=False, verify=self.verify
                ) as http:
                    status_code = await post_pinned(http, admitted, body, headers)
        except TimeoutError:
            error = f"request failed: the receiver did not answer within {self.send_timeout:g} s"
        except httpx.HTTPError as exc:
            error = f"request failed: {type(exc).__name__}: {exc}".replace(secret, MARK)
        # A status in hand counts even if the bound ran out while the client was closing.
        if status_code is not None:
            error = None if 200 <= status_code < 300 else f"the receiver answered HTTP {status_code}"
        await self.deliveries.record_attempt(
            inp.delivery_id,
            inp.attempt,
            status_code=status_code,
            error=error,
            payload_digest=f"sha256:{sha256_hex(body)}",
            retry_in_secs=inp.retry_in_secs if error else None,
        )
        if error is None:
            return c.DeliveryAttemptOut(outcome="delivered", status_code=status_code)
        return c.DeliveryAttemptOut(outcome="retry", status_code=status_code, error=scrub_text(error))

    @activity.defn(name=c.CLOSE_DELIVERY)
    async def close_delivery(self, inp: c.DeliveryClose) -> c.StatusOut:
        """Record the final status and its ledger event, once (a retry finds the row closed)."""
        row = await self.deliveries.get(inp.delivery_id)
        if row is None:
            raise ApplicationError(f"delivery {inp.delivery_id} does not exist", non_retryable=True)
        url = display_url(row.url)
        if inp.status == "delivered":
            event = ev.NewEvent(
                type=CALLBACK_DELIVERED, data={"delivery_id": inp.delivery_id, "url": url, "attempt": inp.attempts}
            )
        else:
            data: dict[str, Any] = {
                "delivery_id": inp.delivery_id,
                "url": url,
                "attempts": inp.attempts,
                "error": inp.error or inp.status,
            }
            if inp.status == "skipped":
                data["skipped"] = True
            event = ev.NewEvent(type=CALLBACK_FAILED, data=data)
        closed = await self.deliveries.close(inp.delivery_id, inp.status, inp.attempts, inp.error, event)
        return c.StatusOut(status=closed.status if closed else row.status)

    def all(self) -> list[Callable[..., Any]]:
        return [self.deliver_webhook, self.close_delivery]
