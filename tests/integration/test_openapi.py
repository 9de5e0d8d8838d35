"""The OpenAPI document types every answer and names every refusal, and the live API keeps to it."""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.helpers import own_stack

pytestmark = pytest.mark.stack

ERROR_SCHEMAS = {"#/components/schemas/ErrorBody", "#/components/schemas/RunnerErrorBody"}
NOT_AN_ERROR_BODY = {"GET /v1/ready 503"}  # "not ready" answers the readiness document itself
# The bounded fuzzing pass: a fixed seed (a failure reproduces; change it deliberately), a few cases per
# operation and two workers keep it near a minute on a 2-core machine. FLUIDBOX_FUZZ_EXAMPLES raises it locally.
FUZZ_SEED = 20261201
FUZZ_EXAMPLES = int(os.environ.get("FLUIDBOX_FUZZ_EXAMPLES", "5"))
FUZZ_CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
FUZZ_DEADLINE_SECS = 300


def operations(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{method.upper()} {path}", op) for path, item in doc["paths"].items() for method, op in item.items()]


async def test_every_success_has_a_schema_and_every_operation_names_its_errors(api: httpx.AsyncClient) -> None:
    doc = (await api.get("/openapi.json")).json()
    untyped, silent, stray = [], [], []
    for name, op in operations(doc):
        responses: dict[str, Any] = op["responses"]
        for status, response in responses.items():
            content = response.get("content", {})
            if status.startswith("2") and not any("schema" in media for media in content.values()):
                untyped.append(f"{name} {status}")
            if status[0] in "45":
                schema = content.get("application/json", {}).get("schema", {})
                if schema.get("$ref") not in ERROR_SCHEMAS and f"{name} {status}" not in NOT_AN_ERROR_BODY:
                    stray.append(f"{name} {status}")
        if not any(status[0] in "45" for status in responses):
            silent.append(name)
    assert len(operations(doc)) > 60
    assert untyped == [], f"2xx responses without a schema: {untyped}"
    assert silent == [], f"operations that document no error status: {silent}"
    assert stray == [], f"errors documented in another shape than ErrorBody: {stray}"
    # A request that does not parse answers 400 here, so FastAPI's automatic 422 must not be advertised.
    assert "HTTPValidationError" not in doc["components"]["schemas"]


async def test_the_live_api_keeps_to_its_openapi_document_under_fuzzing(tmp_path: Path) -> None:
    """schemathesis over every operation of a stack of its own (the cases create agents, policies and
    catalog entries, which the session's stack must not see): no 5xx, no status or content type the
    document does not name, and every answer matches its schema."""
    env = {
        "FLUIDBOX_CREDENTIAL_KEY": secrets.token_hex(32),
        "FLUIDBOX_LOG_LEVEL": "WARNING",
        # Managed apps configured (an app id no catalog entry has), so those routes answer, not 503.
        "FLUIDBOX_MANAGED_APPS": '["fuzz-app"]',
        "FLUIDBOX_MANAGED_APP_REDIRECT_URLS": '["https://app.example/done"]',
    }
    async with own_stack("fbxfz-", env) as (st, api):
        argv = [
            str(Path(sys.executable).parent / "st"),
            "run",
            f"{st.api_url}/openapi.json",
            "--header",
            f"Authorization: {api.headers['authorization']}",
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            str(FUZZ_EXAMPLES),
            "--seed",
            str(FUZZ_SEED),
            "--checks",
            FUZZ_CHECKS,
            "--workers",
            "2",
            "--request-timeout",
            "20",
            "--max-failures",
            "20",
            "--warnings",
            "off",
            "--no-color",
        ]
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), FUZZ_DEADLINE_SECS)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"schemathesis did not finish within {FUZZ_DEADLINE_SECS} s") from None
    report = output.decode(errors="replace")
    assert proc.returncode == 0, report[-12000:]
    assert " passed" in report, report[-4000:]
