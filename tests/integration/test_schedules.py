"""Schedule subscriptions through the API and the real worker: validation, the Temporal Schedule the
routes manage, and a fire that becomes a run with ``{{fire_time}}`` rendered."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from cli.stack import Stack
from core.schedule import fire_key, next_fire, parse_cron, parse_timezone
from services.schedules import schedule_id
from tests.integration.helpers import make_agent, run_row, unique, wait_status

pytestmark = pytest.mark.stack


async def temporal(stack: Stack) -> Client:
    return await Client.connect(stack.temporal_address or "", namespace="default")


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid schedule.cron '61 * * * *': minute value 61 is outside 0-59"),
        ({"cron": "0 0 31 2 *"}, "schedule.cron '0 0 31 2 *' never fires in the future"),
        ({"cron": "0 0 0 1 1 * 2020"}, "schedule.cron '0 0 0 1 1 * 2020' never fires in the future"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Base"}, "unknown schedule.timezone 'Mars/Base'"),
        ({"cron": "0 9 * * *", "missed_run_policy": "later"}, "unknown schedule.missed_run_policy 'later'"),
    ],
)
async def test_a_bad_schedule_is_a_400_naming_it_and_creates_nothing(
    api: httpx.AsyncClient, schedule: dict[str, Any], message: str
) -> None:
    agent = await make_agent(api)
    name = unique("bad-sched")
    r = await api.post(
        "/v1/triggers",
        json={"agent": agent, "name": name, "task_template": "at {{fire_time}}", "schedule": schedule},
    )
    assert r.status_code == 400, r.text
    assert message in r.text
    listed = (await api.get("/v1/triggers")).json()["subscriptions"]
    assert name not in {s["name"] for s in listed}


async def test_a_schedule_subscription_fires_a_run_and_disabling_pauses_it(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    agent = await make_agent(api)
    r = await api.post(
        "/v1/triggers",
        json={
            "agent": agent,
            "name": unique("nightly"),
            "task_template": "nightly report for {{fire_time}}",
            "schedule": {"cron": "0 30 2 * * *", "timezone": "Europe/Berlin", "missed_run_policy": "catch_up"},
        },
    )
    assert r.status_code == 200, r.text
    sub = r.json()["subscription"]
    client = await temporal(stack)
    handle = client.get_schedule_handle(schedule_id(str(sub["id"])))
    desc = await handle.describe()
    assert not desc.schedule.state.paused
    assert await desc.memo_value("subscription_name") == sub["name"]

    await handle.trigger()  # a fire now, through the real worker

    async def fired() -> dict[str, Any] | None:
        detail = (await api.get(f"/v1/triggers/{sub['id']}")).json()
        runs = [i for i in detail["invocations"] if i.get("session_id")]
        return runs[0] if runs else None

    invocation = await wait_for_value(fired)
    assert invocation["idempotency_key"].startswith("sched:")
    fire_time = invocation["idempotency_key"].removeprefix("sched:")
    run = await run_row(api, str(invocation["session_id"]))
    assert run["task"] == f"nightly report for {fire_time}"
    await wait_status(api, str(invocation["session_id"]), {"completed", "failed", "cancelled"})

    r = await api.post(f"/v1/triggers/{sub['id']}/disable")
    assert r.status_code == 200, r.text
    desc = await handle.describe()
    assert desc.schedule.state.paused and "disabled at" in (desc.schedule.state.note or "")
    r = await api.post(f"/v1/triggers/{sub['id']}/enable")
    assert r.status_code == 200, r.text
    assert not (await handle.describe()).schedule.state.paused
    await handle.delete()


async def test_a_schedule_with_allow_task_override_and_no_template_is_a_400_and_creates_nothing(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    agent = await make_agent(api)
    message = (
        "a schedule subscription needs a task_template: its fires have no caller to supply the task, "
        "so allow_task_override cannot replace it"
    )
    names = []
    for template in (None, "", "  "):
        name = unique("no-task")
        names.append(name)
        body: dict[str, Any] = {"agent": agent, "name": name, "allow_task_override": True,
                                "schedule": {"cron": "0 9 * * *"}}  # fmt: skip
        if template is not None:
            body["task_template"] = template
        r = await api.post("/v1/triggers", json=body)
        assert (r.status_code, r.json()) == (400, {"error": message, "code": "bad_request"}), r.text
    listed = (await api.get("/v1/triggers")).json()["subscriptions"]
    assert not set(names) & {s["name"] for s in listed}
    # Clearing the template of an existing schedule is refused the same way, and changes nothing.
    made = await api.post(
        "/v1/triggers",
        json={"agent": agent, "name": unique("sched"), "task_template": "at {{fire_time}}",
              "allow_task_override": True, "schedule": {"cron": "0 9 * * *"}},
    )  # fmt: skip
    assert made.status_code == 200, made.text
    sid = made.json()["subscription"]["id"]
    r = await api.patch(f"/v1/triggers/{sid}", json={"task_template": ""})
    assert (r.status_code, r.json()) == (400, {"error": message, "code": "bad_request"})
    assert (await api.get(f"/v1/triggers/{sid}")).json()["subscription"]["task_template"] == "at {{fire_time}}"
    await (await temporal(stack)).get_schedule_handle(schedule_id(sid)).delete()


async def test_a_schedule_shows_its_next_and_last_fire_as_the_temporal_schedule_holds_them(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    agent = await make_agent(api)
    cron, later = "0 9 1 1 *", "0 9 1 2 *"  # far from now: no fire time is crossed while the test runs
    r = await api.post(
        "/v1/triggers",
        json={"agent": agent, "name": unique("yearly"), "task_template": "report for {{fire_time}}",
              "schedule": {"cron": cron, "timezone": "Europe/Berlin"}},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    sid = r.json()["subscription"]["id"]
    berlin = parse_timezone("Europe/Berlin")
    expected_next = next_fire(parse_cron(cron), berlin, datetime.now(UTC))
    assert expected_next is not None
    created = r.json()["schedule"]
    assert datetime.fromisoformat(created["next_fire_at"]) == expected_next
    assert created["last_fired_at"] is None
    handle = (await temporal(stack)).get_schedule_handle(schedule_id(sid))
    assert (await handle.describe()).info.next_action_times[0] == expected_next

    await handle.trigger()  # one fire now, through the real worker

    async def fired() -> dict[str, Any] | None:
        shown = (await api.get(f"/v1/triggers/{sid}")).json()
        runs = [i for i in shown["invocations"] if i.get("session_id")]
        return shown if runs and shown["schedule"]["last_fired_at"] else None

    shown = await wait_for_value(fired)
    last = datetime.fromisoformat(shown["schedule"]["last_fired_at"])
    recent = (await handle.describe()).info.recent_actions
    assert last == max(a.scheduled_at for a in recent)
    # The fire Temporal reports is the one that made the run: its key is that fire time.
    assert shown["invocations"][0]["idempotency_key"] == fire_key(last)
    assert datetime.fromisoformat(shown["schedule"]["next_fire_at"]) == expected_next
    listed = {v["subscription_id"]: v for v in (await api.get("/v1/triggers")).json()["schedules"]}
    assert listed[sid] == shown["schedule"]
    await wait_status(api, str(shown["invocations"][0]["session_id"]), {"completed", "failed", "cancelled"})

    # Disabled, the schedule does not advance: no next fire; the last one stays.
    await api.post(f"/v1/triggers/{sid}/disable")
    paused = (await api.get(f"/v1/triggers/{sid}")).json()["schedule"]
    assert paused["next_fire_at"] is None and paused["last_fired_at"] == shown["schedule"]["last_fired_at"]
    enabled = (await api.post(f"/v1/triggers/{sid}/enable")).json()
    assert enabled["subscription"]["enabled"] is True
    # A cadence change moves the next fire; the PATCH answer already shows it.
    r = await api.patch(f"/v1/triggers/{sid}", json={"schedule": {"cron": later}})
    assert r.status_code == 200, r.text
    moved = next_fire(parse_cron(later), berlin, datetime.now(UTC))
    assert moved is not None and datetime.fromisoformat(r.json()["schedule"]["next_fire_at"]) == moved
    await handle.delete()


async def wait_for_value(check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting for the scheduled fire"
        await asyncio.sleep(0.2)
