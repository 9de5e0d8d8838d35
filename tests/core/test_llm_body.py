"""What the LLM facade decides from a request alone: dialect, upstream path, body refusals, error shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.harnesses import ANTHROPIC_MESSAGES, OPENAI_RESPONSES
from core.llm_body import (
    FREE,
    MAX_CONTENT_DEPTH,
    ROUTES,
    FacadeError,
    dialect_of,
    dialect_of_path,
    error_body,
    inspect_body,
    stream_error,
)
from core.policy import Budgets
from core.runspec import RunSpec, WorkspaceSpec
from core.usage import Dialect

PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def _spec(harness: str = "claude-agent-sdk", model: str = "claude-haiku-4-5", **config: Any) -> RunSpec:
    return RunSpec(
        run_id="run-1",
        tenant_id="tenant-1",
        agent_id="agent-1",
        agent_revision_id="rev-1",
        agent_name="tester",
        harness=harness,
        model=model,
        harness_config=config,
        task="answer",
        workspace=WorkspaceSpec(),
        autonomy="supervised",
        budgets=Budgets(),
        policy_id="policy-1",
        policy_name="default",
        policy_version=1,
        policy_snapshot={},
    )


CLAUDE = _spec()
CODEX = _spec("codex", "gpt-5.4-mini")


def _anthropic(**fields: Any) -> bytes:
    return json.dumps({"model": "claude-haiku-4-5", "max_tokens": 64, **fields}).encode()


def _openai(**fields: Any) -> bytes:
    return json.dumps({"model": "gpt-5.4-mini", **fields}).encode()


def _refusal(dialect: Dialect, raw: bytes, spec: RunSpec) -> FacadeError:
    with pytest.raises(FacadeError) as err:
        inspect_body(dialect, raw, spec)
    return err.value


def _nested_lists(levels: int) -> list[Any]:
    node: list[Any] = []
    for _ in range(levels - 1):
        node = [node]
    return node


@pytest.mark.parametrize(
    ("spec", "dialect"),
    [
        (CLAUDE, Dialect.ANTHROPIC),
        (CODEX, Dialect.OPENAI),
        (_spec("replay", "replay"), Dialect.ANTHROPIC),
        (_spec("replay", "replay", model_api=ANTHROPIC_MESSAGES), Dialect.ANTHROPIC),
        (_spec("replay", "replay", model_api=OPENAI_RESPONSES), Dialect.OPENAI),
    ],
)
def test_a_run_speaks_the_dialect_of_its_harness_and_replay_speaks_what_its_config_names(
    spec: RunSpec, dialect: Dialect
) -> None:
    assert dialect_of(spec) is dialect


def test_before_the_run_is_known_only_a_responses_path_is_answered_in_the_openai_shape() -> None:
    assert dialect_of_path("v1/responses") is Dialect.OPENAI
    assert dialect_of_path("v1/messages") is Dialect.ANTHROPIC
    assert dialect_of_path("") is Dialect.ANTHROPIC
    assert dialect_of_path("v1/chat/completions") is Dialect.ANTHROPIC


def test_each_dialect_reaches_only_its_own_endpoints_and_only_count_tokens_is_free() -> None:
    assert ROUTES[Dialect.ANTHROPIC][""] == "v1/messages"  # the bare base URL is Messages
    assert "v1/responses" not in ROUTES[Dialect.ANTHROPIC]
    assert set(ROUTES[Dialect.OPENAI]) == {"v1/responses"}
    assert FREE == {"v1/messages/count_tokens"}
    assert all(path in ROUTES[Dialect.ANTHROPIC].values() for path in FREE)


def test_an_anthropic_body_is_forwarded_byte_for_byte() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}
    raw = _anthropic(
        system="be brief",
        messages=[{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}],
        tools=[{"name": "Bash", "input_schema": {"type": "object"}}, {"type": "custom", "name": "x"}],
    )
    body, forward = inspect_body(Dialect.ANTHROPIC, raw, CLAUDE)
    assert forward is raw
    assert body == json.loads(raw)


@pytest.mark.parametrize(
    ("raw", "status", "words"),
    [
        (b"{not json", 400, "request body is not valid JSON"),
        (b"\xff\xfe", 400, "request body is not valid JSON"),
        (b'["model"]', 400, "request body must be a JSON object"),
        (b"[" * 100_000, 400, "request body is not valid JSON"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_400(raw: bytes, status: int, words: str) -> None:
    refusal = _refusal(Dialect.ANTHROPIC, raw, CLAUDE)
    assert (refusal.status, refusal.code) == (status, None)
    assert refusal.message.startswith(words)


@pytest.mark.parametrize("model", ["claude-opus-4-8", None, ["claude-haiku-4-5"]])
def test_only_the_runs_frozen_model_may_be_asked_for(model: Any) -> None:
    raw = json.dumps({"model": model, "messages": []}).encode()
    refusal = _refusal(Dialect.ANTHROPIC, raw, CLAUDE)
    assert refusal.status == 422
    assert refusal.message == f"model {model!r} is not valid for this session (its frozen model is 'claude-haiku-4-5')"


@pytest.mark.parametrize("kind", ["web_search_20250305", "web_fetch_20250910", "code_execution_20250825"])
def test_anthropic_server_side_tools_are_422(kind: str) -> None:
    refusal = _refusal(Dialect.ANTHROPIC, _anthropic(messages=[], tools=[{"type": kind, "name": "t"}]), CLAUDE)
    assert refusal.status == 422
    assert refusal.message == f"server-side tool type '{kind}' is not allowed: tools run through the gate"


def test_anthropic_provider_side_mcp_servers_are_422_but_an_empty_list_is_not() -> None:
    servers = [{"type": "url", "url": "https://mcp.example.com", "name": "x"}]
    refusal = _refusal(Dialect.ANTHROPIC, _anthropic(messages=[], mcp_servers=servers), CLAUDE)
    assert refusal.status == 422 and refusal.message.startswith("mcp_servers (provider-side MCP) is not allowed")
    inspect_body(Dialect.ANTHROPIC, _anthropic(messages=[], mcp_servers=[]), CLAUDE)


def test_an_anthropic_source_the_provider_would_fetch_is_422_with_where_it_is() -> None:
    fetched = {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [fetched]}
    raw = _anthropic(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, result]}])
    refusal = _refusal(Dialect.ANTHROPIC, raw, CLAUDE)
    assert refusal.status == 422
    assert refusal.message == (
        "content source type 'url' is not allowed ('image' block, field 'source.type' at "
        "messages[0].content[1].content[0]): the provider would fetch it outside the sandbox"
    )


def test_anthropic_files_api_documents_and_container_uploads_are_422() -> None:
    document = {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
    refusal = _refusal(Dialect.ANTHROPIC, _anthropic(system=[document], messages=[]), CLAUDE)
    assert refusal.status == 422 and "'file' is not allowed ('document' block" in refusal.message
    upload = {"type": "container_upload", "file_id": "file_1"}
    refusal = _refusal(Dialect.ANTHROPIC, _anthropic(messages=[{"role": "user", "content": [upload]}]), CLAUDE)
    assert refusal.message.startswith("'container_upload' blocks (field 'file_id' at messages[0].content[0])")


def test_content_is_walked_to_the_depth_bound_and_no_further() -> None:
    inspect_body(Dialect.ANTHROPIC, _anthropic(system=_nested_lists(MAX_CONTENT_DEPTH + 1), messages=[]), CLAUDE)
    raw = _anthropic(system=_nested_lists(MAX_CONTENT_DEPTH + 2), messages=[])
    refusal = _refusal(Dialect.ANTHROPIC, raw, CLAUDE)
    assert refusal.status == 422
    assert refusal.message.startswith(f"'system' is nested deeper than {MAX_CONTENT_DEPTH} levels (at system[0]")


def test_an_openai_body_is_made_stateless_loses_server_tools_and_is_forwarded_compact() -> None:
    tools = [{"type": "function", "name": "shell"}, {"type": "file_search"}, {"type": "code_interpreter"}, "odd"]
    raw = json.dumps(
        {"model": "gpt-5.4-mini", "input": "hi", "store": True, "tools": tools, "max_output_tokens": 9}, indent=2
    ).encode()
    body, forward = inspect_body(Dialect.OPENAI, raw, CODEX)
    assert forward == (
        b'{"model":"gpt-5.4-mini","input":"hi","store":false,'
        b'"tools":[{"type":"function","name":"shell"},"odd"],"max_output_tokens":9}'
    )
    assert json.loads(forward) == body


def test_an_openai_body_without_tools_gains_no_tools_field() -> None:
    body, _ = inspect_body(Dialect.OPENAI, _openai(input="hi"), CODEX)
    assert body == {"model": "gpt-5.4-mini", "input": "hi", "store": False}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"previous_response_id": "resp_1"}, "'previous_response_id' is not allowed"),
        ({"conversation": {"id": "conv_1"}}, "'conversation' is not allowed"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference inputs are not allowed"),
    ],
)
def test_openai_bodies_leaning_on_server_held_context_are_422(fields: dict[str, Any], words: str) -> None:
    refusal = _refusal(Dialect.OPENAI, _openai(**fields), CODEX)
    assert refusal.status == 422
    assert refusal.message.startswith(words) and refusal.message.endswith("every request carries its whole context")


def test_openai_falsy_server_state_fields_are_not_refused() -> None:
    body, _ = inspect_body(Dialect.OPENAI, _openai(input="hi", previous_response_id=None, background=False), CODEX)
    assert body["store"] is False


def test_an_openai_image_by_url_is_422_and_an_inline_one_is_forwarded() -> None:
    by_url = {"type": "input_image", "image_url": "https://example.com/cat.png"}
    raw = _openai(input=[{"role": "user", "content": [by_url]}])
    refusal = _refusal(Dialect.OPENAI, raw, CODEX)
    assert refusal.message == (
        "'input_image' with 'image_url' is not allowed (at input[0].content[0]; only inline data: URLs and "
        "base64 file_data are): the provider would fetch it outside the sandbox"
    )
    inline = {"type": "input_image", "image_url": f"DATA:image/png;base64,{PIXEL}"}
    body, _ = inspect_body(Dialect.OPENAI, _openai(input=[{"role": "user", "content": [inline]}]), CODEX)
    assert body["input"][0]["content"] == [inline]


def test_openai_instructions_are_checked_like_input() -> None:
    refusal = _refusal(Dialect.OPENAI, _openai(instructions=[{"type": "input_file", "file_id": "f"}]), CODEX)
    assert refusal.status == 422 and "(at instructions[0];" in refusal.message


def test_anthropic_errors_have_the_messages_shape_and_a_code_is_the_type() -> None:
    assert error_body(Dialect.ANTHROPIC, 401, "unauthorized") == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "unauthorized"},
    }
    assert error_body(Dialect.ANTHROPIC, 429, "too many", "llm_reservation_ceiling_exceeded") == {
        "type": "error",
        "error": {"type": "llm_reservation_ceiling_exceeded", "message": "too many"},
    }
    assert error_body(Dialect.OPENAI, 429, "over", "llm_budget_reservation_exceeded") == {
        "error": {"message": "over", "type": "llm_budget_reservation_exceeded", "param": None,
                  "code": "llm_budget_reservation_exceeded"}
    }  # fmt: skip


def test_openai_errors_have_the_responses_shape_and_unknown_statuses_are_api_errors() -> None:
    assert error_body(Dialect.OPENAI, 422, "no") == {
        "error": {"message": "no", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert error_body(Dialect.OPENAI, 503, "down")["error"]["type"] == "api_error"
    assert error_body(Dialect.ANTHROPIC, 502, "down")["error"]["type"] == "api_error"


@pytest.mark.parametrize(
    ("dialect", "data"),
    [
        (Dialect.ANTHROPIC, {"type": "error", "error": {"type": "api_error", "message": "broke"}}),
        (Dialect.OPENAI, {"type": "error", "code": "server_error", "message": "broke", "param": None}),
    ],
)
def test_a_broken_stream_ends_with_one_complete_sse_error_event(dialect: Dialect, data: dict[str, Any]) -> None:
    tail = stream_error(dialect, "broke")
    assert tail.startswith(b"\n\n") and tail.endswith(b"\n\n")  # ends any partial event first
    [event] = tail.strip(b"\n").split(b"\n\n")
    name, payload = event.split(b"\n")
    assert name == b"event: error"
    assert json.loads(payload.removeprefix(b"data: ")) == data
