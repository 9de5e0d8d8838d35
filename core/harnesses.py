"""The harnesses a revision may name, and the models each accepts (the single source of truth)."""

from __future__ import annotations

from typing import Any

from core.errors import Unprocessable

HARNESSES: dict[str, dict[str, Any]] = {
    "replay": {
        "display_name": "Replay (deterministic script)",
        "hint": "Runs a scripted transcript: no model, no API key. For demos and tests.",
        "default_model": "replay",
        "models": [{"id": "replay", "display_name": "Scripted", "hint": "no model calls"}],
    },
    "claude-agent-sdk": {
        "display_name": "Claude Agent SDK",
        "hint": "Claude Code's agent loop; model traffic goes through the LLM facade.",
        "default_model": "claude-haiku-4-5",
        "models": [
            {"id": "claude-haiku-4-5", "display_name": "Claude Haiku 4.5", "hint": "fast, cheap"},
            {"id": "claude-sonnet-5", "display_name": "Claude Sonnet 5", "hint": "balanced"},
            {"id": "claude-opus-4-8", "display_name": "Claude Opus 4.8", "hint": "most capable"},
        ],
    },
    "codex": {
        "display_name": "Codex",
        "hint": "OpenAI Codex app-server; model traffic goes through the LLM facade.",
        "default_model": "gpt-5.4-mini",
        "models": [
            {"id": "gpt-5.4-mini", "display_name": "GPT-5.4 mini", "hint": "fast, cheap"},
            {"id": "gpt-5.4", "display_name": "GPT-5.4", "hint": "balanced"},
            {"id": "gpt-5.6-sol", "display_name": "GPT-5.6 Sol", "hint": "most capable"},
        ],
    },
}
# What this build can actually run inside a sandbox today.
RUNNABLE = frozenset({"replay", "claude-agent-sdk"})
# The provider API each harness's model client speaks to the LLM facade. A replay agent names one in
# harness_config.model_api (tests and demos stand in for either kind of model client); default Anthropic.
ANTHROPIC_MESSAGES = "anthropic-messages"
OPENAI_RESPONSES = "openai-responses"
MODEL_APIS: dict[str, str] = {"claude-agent-sdk": ANTHROPIC_MESSAGES, "codex": OPENAI_RESPONSES}


def check_harness(harness: str, model: str | None) -> str:
    """Validate a harness/model pair; returns the model (the harness default when omitted)."""
    if harness not in HARNESSES:
        raise Unprocessable(f"unknown harness '{harness}' (known: {', '.join(HARNESSES)})")
    valid = [m["id"] for m in HARNESSES[harness]["models"]]
    if model is None:
        return str(HARNESSES[harness]["default_model"])
    if model not in valid:
        raise Unprocessable(f"model '{model}' is not valid for harness '{harness}' (valid: {', '.join(valid)})")
    return model


def check_harness_config(harness: str, config: dict[str, Any]) -> None:
    """Rules across harness and harness_config (the config's own shape is the API schema's)."""
    if config.get("model_api") is not None and harness != "replay":
        raise Unprocessable(
            f"harness_config.model_api applies to replay agents only: '{harness}' speaks "
            f"{MODEL_APIS.get(harness, ANTHROPIC_MESSAGES)} to the LLM facade"
        )


def model_api(harness: str, config: dict[str, Any]) -> str:
    """The provider API a run's model traffic speaks to the LLM facade."""
    if harness == "replay":
        return str(config.get("model_api") or ANTHROPIC_MESSAGES)
    return MODEL_APIS.get(harness, ANTHROPIC_MESSAGES)
