"""What the LLM facade decides from a model request alone (pure: no I/O, no clock).

Which provider dialect a run speaks and which facade paths reach which upstream path; whether a request
body may be forwarded (the run's frozen model, no provider-side tools, no source the provider would fetch
itself, no server-held context) and the bytes to forward; and the provider's error shapes the refusals
are answered in. The route (``api.routes.llm``) does the I/O around them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from core.harnesses import OPENAI_RESPONSES, model_api
from core.runspec import RunSpec
from core.usage import Dialect

# Which upstream path each dialect's facade path reaches ("" is the bare base URL: Messages).
ROUTES: dict[Dialect, dict[str, str]] = {
    Dialect.ANTHROPIC: {
        "": "v1/messages",
        "v1/messages": "v1/messages",
        "v1/messages/count_tokens": "v1/messages/count_tokens",
    },
    Dialect.OPENAI: {"v1/responses": "v1/responses"},
}
FREE = frozenset({"v1/messages/count_tokens"})  # no model output, nothing to reserve or meter
# Tools the provider would execute itself, outside the permission gate.
ANTHROPIC_SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "tool_search_tool", "mcp_toolset")
OPENAI_SERVER_TOOLS = ("web_search", "file_search", "code_interpreter", "image_generation", "mcp")
OPENAI_REFUSED_FIELDS = ("previous_response_id", "conversation", "prompt", "background")
# Sources the provider would fetch or load itself: outside the sandbox's network rule and the byte estimate.
FETCHED_SOURCES = frozenset({"url", "file"})
TOOL_USE_BLOCKS = ("tool_use", "server_tool_use", "mcp_tool_use")  # their "input" is free-form model JSON
MAX_CONTENT_DEPTH = 64
FETCH_REFUSAL = "the provider would fetch it outside the sandbox"
ERROR_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class FacadeError(Exception):
    """A refusal answered in the provider's error shape."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def error_body(dialect: Dialect, status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The provider's JSON error document for a refusal with this status. A refusal with a ``code`` (the
    reservation refusals) carries it as the error's ``type``, the field clients branch on (OpenAI's also as
    ``code``); any other takes the provider's type for the status."""
    kind = code or ERROR_KINDS.get(status, "api_error")
    if dialect is Dialect.OPENAI:
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return {"type": "error", "error": {"type": kind, "message": message}}


def stream_error(dialect: Dialect, message: str) -> bytes:
    """The provider's mid-stream SSE error event (after a blank line that ends any partial event)."""
    if dialect is Dialect.OPENAI:
        data: dict[str, Any] = {"type": "error", "code": "server_error", "message": message, "param": None}
    else:
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
    return b"\n\nevent: error\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def dialect_of_path(path: str) -> Dialect:
    """The dialect to refuse in before the run (and so its real dialect) is known."""
    return Dialect.OPENAI if path.endswith("responses") else Dialect.ANTHROPIC


def dialect_of(spec: RunSpec) -> Dialect:
    """codex speaks OpenAI Responses, claude-agent-sdk Anthropic Messages, replay what its config names."""
    return Dialect.OPENAI if model_api(spec.harness, spec.harness_config) == OPENAI_RESPONSES else Dialect.ANTHROPIC


def inspect_body(dialect: Dialect, raw: bytes, spec: RunSpec) -> tuple[dict[str, Any], bytes]:
    """Validate a request body for this run; returns it and the bytes to forward (edited for OpenAI)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise FacadeError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise FacadeError(400, "request body must be a JSON object")
    model = body.get("model")
    if model != spec.model:
        raise FacadeError(422, f"model {model!r} is not valid for this session (its frozen model is '{spec.model}')")
    raw_tools = body.get("tools")
    tools: list[Any] = raw_tools if isinstance(raw_tools, list) else []
    if dialect is Dialect.ANTHROPIC:
        for tool in tools:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind.startswith(ANTHROPIC_SERVER_TOOLS):
                raise FacadeError(422, f"server-side tool type '{kind}' is not allowed: tools run through the gate")
        if body.get("mcp_servers"):
            raise FacadeError(422, "mcp_servers (provider-side MCP) is not allowed: tools run through the gate")
        for field in ("system", "messages"):
            _walk(body.get(field), field, _anthropic_fetch)
        return body, raw
    for field in OPENAI_REFUSED_FIELDS:
        if body.get(field):
            raise FacadeError(422, f"'{field}' is not allowed: every request carries its whole context")
    raw_items = body.get("input")
    items: list[Any] = raw_items if isinstance(raw_items, list) else []
    if any(isinstance(i, dict) and i.get("type") == "item_reference" for i in items):
        raise FacadeError(422, "item_reference inputs are not allowed: every request carries its whole context")
    for field in ("instructions", "input"):
        _walk(body.get(field), field, _openai_fetch)
    body["store"] = False
    if "tools" in body:
        body["tools"] = [
            t for t in tools if not (isinstance(t, dict) and str(t.get("type", "")).startswith(OPENAI_SERVER_TOOLS))
        ]
    return body, json.dumps(body, separators=(",", ":")).encode()


def _walk(root: Any, where: str, check: Callable[[dict[str, Any], str], tuple[str, ...]]) -> None:
    """Apply ``check(node, path)`` to every object under ``root`` (iteratively, depth-bounded: deeper is 422).

    ``check`` returns the keys of that object not to descend into (free-form JSON, not content)."""
    stack: list[tuple[Any, str, int]] = [(root, where, 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_CONTENT_DEPTH:
            raise FacadeError(422, f"'{where}' is nested deeper than {MAX_CONTENT_DEPTH} levels (at {path})")
        if isinstance(node, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node) if isinstance(v, (dict, list)))
        elif isinstance(node, dict):
            skip = check(node, path)
            stack.extend(
                (v, f"{path}.{k}", depth + 1) for k, v in node.items() if k not in skip and isinstance(v, (dict, list))
            )


def _anthropic_fetch(block: dict[str, Any], path: str) -> tuple[str, ...]:
    """Refuse a block whose source the provider would fetch (a URL) or load (a Files API file)."""
    kind = block.get("type")
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") in FETCHED_SOURCES:
        raise FacadeError(
            422,
            f"content source type '{source['type']}' is not allowed ('{kind}' block, field 'source.type' at "
            f"{path}): {FETCH_REFUSAL}",
        )
    if kind == "container_upload":
        raise FacadeError(
            422, f"'container_upload' blocks (field 'file_id' at {path}) are not allowed: {FETCH_REFUSAL}"
        )
    return ("input",) if isinstance(kind, str) and kind.endswith(TOOL_USE_BLOCKS) else ()


def _openai_fetch(part: dict[str, Any], path: str) -> tuple[str, ...]:
    """Refuse an image given by URL or file id, and a file given by URL or file id (inline data stays)."""
    kind = part.get("type")
    fields: list[str] = []
    if kind in ("input_image", "computer_screenshot") or "image_url" in part:
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if url is not None and not (isinstance(url, str) and url[:5].lower() == "data:"):
            fields.append("image_url")
        if part.get("file_id") is not None:
            fields.append("file_id")
    if kind == "input_file" or "file_url" in part:
        fields.extend(f for f in ("file_url", "file_id") if part.get(f) is not None)
    if fields:
        raise FacadeError(
            422,
            f"'{kind}' with '{fields[0]}' is not allowed (at {path}; only inline data: URLs and base64 file_data "
            f"are): {FETCH_REFUSAL}",
        )
    return ()
