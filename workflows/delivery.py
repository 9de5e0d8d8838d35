"""DeliveryWorkflow: one signed webhook for one finished run, retried on the spec's fixed schedule.

The workflow drives the attempts itself: one single-try ``deliver_webhook`` activity per attempt and a
durable timer between attempts, reading the wait from a fixed table. Temporal's activity retry policy
is exponential (``initial * coefficient**n``, capped), and 5, 30, 120, 600, 1800 s share no coefficient
(6, 4, 5, 3), so no retry policy produces the spec's schedule; the table does, exactly, and every
attempt and every wait is a visible, replay-checked command in the history. The activity learns its
attempt number from the input, so the body's ``attempt`` and the row's counters are exact too.

An attempt whose activity did not complete (worker lost, timeout) counts as a failed attempt: the
receiver may have got it, which is what the delivery id (the same on every attempt) is for.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from contracts import temporal as c

# Wait after failed attempt n (1-based): 5 s, 30 s, 2 min, 10 min, 30 min, 1 h (domain §10).
BACKOFF_SECS = (5, 30, 120, 600, 1800, 3600)
MAX_ATTEMPTS = 6
# URL admission (bounded at 5 s) + the 10 s POST + two short statements, with room to spare.
ATTEMPT_TIMEOUT = timedelta(seconds=45)
ONE_TRY = RetryPolicy(maximum_attempts=1)
CLOSE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=60))


def retry_delay(attempt: int) -> int | None:
    """Seconds to wait after failed attempt ``attempt``; ``None`` when it was the last one."""
    if attempt >= MAX_ATTEMPTS:
        return None
    return BACKOFF_SECS[min(attempt, len(BACKOFF_SECS)) - 1]


@workflow.defn(name=c.DELIVERY_WORKFLOW)
class DeliveryWorkflow:
    @workflow.run
    async def run(self, inp: c.DeliveryInput) -> str:
        out = c.DeliveryAttemptOut(outcome="retry")
        attempt = 0
        while attempt < MAX_ATTEMPTS:
            attempt += 1
            delay = retry_delay(attempt)
            try:
                result = await workflow.execute_activity(
                    c.DELIVER_WEBHOOK,
                    c.DeliveryAttemptIn(delivery_id=inp.delivery_id, attempt=attempt, retry_in_secs=delay),
                    result_type=c.DeliveryAttemptOut,
                    start_to_close_timeout=ATTEMPT_TIMEOUT,
                    retry_policy=ONE_TRY,
                    summary=f"deliver attempt {attempt}",
                )
                out = result
            except ActivityError as err:
                out = c.DeliveryAttemptOut(outcome="retry", error=f"the attempt did not complete: {_cause(err)}")
            if out.outcome != "retry" or delay is None:
                break
            await workflow.sleep(delay, summary=f"wait {delay}s before attempt {attempt + 1}")
        sent = attempt
        if out.outcome == "delivered":
            status, error = "delivered", None
        elif out.outcome in ("skipped", "failed"):
            # Decided before anything was sent on this attempt (authority gone, URL refused, no secret).
            status, error, sent = out.outcome, out.error, attempt - 1
        else:
            status, error = "failed", f"gave up after {attempt} attempts: {out.error or 'no answer'}"
        await workflow.execute_activity(
            c.CLOSE_DELIVERY,
            c.DeliveryClose(delivery_id=inp.delivery_id, status=status, attempts=sent, error=error),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=CLOSE_RETRY,
            summary=f"record {status}",
        )
        return status


def _cause(err: ActivityError) -> str:
    cause = err.cause
    return str(cause.message if isinstance(cause, ApplicationError) else cause or err)


__all__ = ["BACKOFF_SECS", "MAX_ATTEMPTS", "DeliveryWorkflow", "retry_delay"]
