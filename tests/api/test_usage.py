"""What a run spent (/v1/sessions/{id}/cost), in process: the operator's report over the metering rows."""

from __future__ import annotations

import uuid

from core.usage import Usage
from db.usage import Ask
from tests.api.conftest import Api
from tests.api.runs_helpers import make_agent, member, start_run

MODEL = "claude-haiku-4-5"


async def test_the_cost_report_sums_charged_usage_and_counts_reservations_in_flight(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    path = f"/v1/sessions/{run['id']}/cost"
    assert (await api.client.get(path)).json() == {
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "cost_usd": 0.0,
            "requests": 0,
        },
        "tool_calls": 0,
        "breakdown": [],
        "reservations": {"active": 0, "tokens": 0, "cost_usd": None},
    }
    # Two model requests through the facade: one answered and metered, one still in flight.
    spec = await api.ctx.runs.run_spec(run["id"])
    charged = await api.ctx.metering.admit(spec, Ask(MODEL, input_tokens=1000, output_tokens=1000))
    assert charged.kind == "admitted" and charged.reservation_id is not None
    usage = Usage(input_tokens=100_000, output_tokens=10_000)
    assert await api.ctx.metering.charge(run["id"], charged.reservation_id, MODEL, usage, latency_ms=5, ttfb_ms=None)
    assert (await api.ctx.metering.admit(spec, Ask(MODEL, input_tokens=10, output_tokens=20))).kind == "admitted"
    await api.ctx.gates.decide_call(run["id"], "tc-1", "Read", {"file_path": "/workspace/a"})

    report = (await api.client.get(path)).json()
    assert report["usage"] == {
        "input_tokens": 100_000,
        "output_tokens": 10_000,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cost_usd": 0.15,
        "requests": 1,
    }
    assert report["tool_calls"] == 1
    assert report["breakdown"] == [
        {
            "model": MODEL,
            "source": "facade",
            "input_tokens": 100_000,
            "output_tokens": 10_000,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "cost_usd": 0.15,
            "requests": 1,
        }
    ]
    assert (report["reservations"]["active"], report["reservations"]["tokens"]) == (1, 30)
    # The run's own usage totals agree with the report.
    assert (await api.client.get(f"/v1/sessions/{run['id']}")).json()["usage"] == report["usage"]


async def test_the_cost_report_is_the_operators_only(api: Api) -> None:
    alice = await member(api, "owner")
    run = await start_run(api, await make_agent(api), alice.token)
    async with api.as_token(alice.token) as as_alice:
        r = await as_alice.get(f"/v1/sessions/{run['id']}/cost")
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    assert "requires the operator (admin) token" in r.json()["error"]
    async with api.as_token(None) as anon:
        r = await anon.get(f"/v1/sessions/{run['id']}/cost")
    assert (r.status_code, r.json()) == (401, {"error": "unauthorized", "code": "unauthorized"})
    for missing in (str(uuid.uuid4()), "garbage"):
        r = await api.client.get(f"/v1/sessions/{missing}/cost")
        assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"})
