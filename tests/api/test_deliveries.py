"""A run's result deliveries (/v1/sessions/{id}/deliveries), in process."""

from __future__ import annotations

from tests.api.conftest import Api
from tests.api.runs_helpers import make_agent, member, start_run

HOOK = "https://hooks.example.com/fluidbox"


async def test_a_runs_deliveries_list_each_webhook_destination_with_its_attempts(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    path = f"/v1/sessions/{run['id']}/deliveries"
    assert (await api.client.get(path)).json() == {"deliveries": []}
    # A finished run's result is sent to every webhook destination its RunSpec froze (here: one, after an
    # email destination, which is not a webhook).
    spec = await api.ctx.runs.run_spec(run["id"])
    destinations = [{"kind": "email", "to": "ops@example.com"}, {"kind": "webhook", "url": HOOK}]
    [row] = await api.ctx.deliveries.enqueue(spec.model_copy(update={"result_destinations": destinations}))
    await api.ctx.deliveries.record_attempt(
        str(row.id), 1, status_code=503, error="upstream unavailable", payload_digest="d1", retry_in_secs=30
    )
    [shown] = (await api.client.get(path)).json()["deliveries"]
    assert (shown["id"], shown["session_id"], shown["status"], shown["attempts"]) == (
        str(row.id),
        run["id"],
        "pending",
        1,
    )
    assert (shown["destination"], shown["last_status_code"], shown["last_error"]) == (
        {"kind": "webhook", "url": HOOK},
        503,
        "upstream unavailable",
    )
    assert shown["delivered_at"] is None and shown["next_attempt_at"] is not None
    assert list(shown) == [
        "id",
        "session_id",
        "subscription_id",
        "destination",
        "status",
        "attempts",
        "last_status_code",
        "last_error",
        "payload_digest",
        "next_attempt_at",
        "last_attempt_at",
        "delivered_at",
        "created_at",
        "updated_at",
    ]


async def test_deliveries_are_the_operators_only(api: Api) -> None:
    admin = await member(api, "admin")
    run = await start_run(api, await make_agent(api), admin.token)
    async with api.as_token(admin.token) as as_admin:
        r = await as_admin.get(f"/v1/sessions/{run['id']}/deliveries")
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
