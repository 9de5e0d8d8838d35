"""Liveness and readiness, in process."""

from __future__ import annotations

from tests.api.conftest import Api


async def test_liveness_touches_nothing_and_readiness_says_which_dependency_is_down(api: Api) -> None:
    assert (await api.client.get("/v1/health")).json() == {"status": "ok"}
    for path in ("/v1/ready", "/v1/health/ready"):
        ready = await api.client.get(path)
        assert ready.status_code == 503, ready.text
        assert ready.json() == {"status": "not ready", "db": True, "temporal": False, "provider": "bwrap"}
