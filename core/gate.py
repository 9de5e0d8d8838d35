"""The permission gate: one fixed order for every tool call.

session accepts work → intent + digest binding → tool-call budget → frozen tool set →
trust tier → policy (autonomy inside) → approval (session scope).

The first two steps need the database and run in the API's transaction; this module decides the rest.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict

from core import dynamic_connections, shell_words
from core.access import brokered_entry, entry_access
from core.digests import canonical_json
from core.policy import PolicyVerdict, evaluate
from core.runspec import RunSpec

READ_ONLY_TOOLS = frozenset({"Read", "Glob", "Grep", "LS", "NotebookRead"})
READ_ONLY_PREFIXES = (
    "ls",
    "cat",
    "head",
    "tail",
    "wc",
    "grep",
    "rg",
    "pwd",
    "git status",
    "git log",
    "git diff",
    "git show",
    "git branch",
    "git blame",
)
# Operators, substitutions and redirections; and globs and braces, which could expand to a file the untrusted
# source named (a file called ``--output=x`` makes ``git diff *`` a writer).
_SHELL_META = re.compile(r"[;|&`$()<>\n*?\[{]")
# Flags that turn a listed read command into a writer or a launcher: git diff/log/show --output=FILE and
# --ext-diff, rg --pre COMMAND (judged on the words the shell makes, so no quoting hides them).
_WRITE_FLAGS = re.compile(r"^--(output|ext-diff|pre|pre-glob)(=|$)")
READ_ONLY_WORDS = tuple(tuple(prefix.split()) for prefix in READ_ONLY_PREFIXES)

Source = Literal[
    "policy",
    "human",
    "autonomy_rewrite",
    "session_scope",
    "trust_tier",
    "capability",
    "schema",
    "budget",
    "protocol_violation",
    "session_terminal",
    "access",
    "dynamic_connection",
]


class GateDecision(BaseModel):
    model_config = ConfigDict(frozen=True)

    verdict: Literal["allow", "deny", "require_approval"]
    source: str
    reason: str | None = None
    original_verdict: str | None = None
    budget_exceeded: bool = False
    policy: PolicyVerdict | None = None
    # The frozen access class of a brokered tool ("read" | "write"); None for every other tool.
    access: str | None = None

    def decision_data(self, tool_call_id: str, tool: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "tool_call_id": tool_call_id,
            "tool": tool,
            "verdict": self.verdict,
            "source": self.source,
            "access": self.access,
        }
        if self.reason:
            data["reason"] = self.reason
        if self.original_verdict:
            data["original_verdict"] = self.original_verdict
        return data


def _read_only_allows(tool: str, tool_input: dict[str, Any]) -> bool:
    if tool in READ_ONLY_TOOLS:
        return True
    if tool != "Bash":
        return False
    command = str(tool_input.get("command", "")).strip()
    if _SHELL_META.search(command):
        return False
    try:
        words = shell_words.split(command)
    except shell_words.ShellSyntaxError:
        return False
    if any(_WRITE_FLAGS.match(word) for word in words):
        return False
    return any(tuple(words[: len(prefix)]) == prefix for prefix in READ_ONLY_WORDS)


def frozen_schemas(spec: RunSpec) -> dict[str, Any]:
    """``mcp__<server>__<tool>`` → its frozen input schema (``None`` when the snapshot had none)."""
    out: dict[str, Any] = {}
    for surface in spec.brokered:
        for tool in surface.get("tools", []):
            out[f"mcp__{surface['slot']}__{tool['name']}"] = tool.get("input_schema")
    for bundle in spec.capabilities:
        for server in bundle.get("servers", []):
            for tool in server.get("tools", []):
                out[f"mcp__{server['name']}__{tool['name']}"] = tool.get("input_schema")
    return out


def frozen_tools(spec: RunSpec) -> frozenset[str]:
    return frozenset(frozen_schemas(spec))


MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_BYTES = 256 * 1024


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_SCHEMA_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level


def _local_refs_only(value: Any) -> bool:
    if isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return False
        return all(_local_refs_only(v) for v in value.values())
    if isinstance(value, list):
        return all(_local_refs_only(v) for v in value)
    return True


SCHEMA_CACHE_SIZE = 128
INVALID_SCHEMA = "frozen schema invalid — refresh the snapshot"


@lru_cache(maxsize=SCHEMA_CACHE_SIZE)
def _compiled(text: str) -> Any:
    """The checked validator of one frozen schema, by its canonical JSON text (so two equal schemas share one
    and a different schema never reuses another's); None when the schema itself is unusable. Compiling and
    meta-checking a schema costs far more than validating one small input, and a run calls the same few tools."""
    schema = json.loads(text)
    if not isinstance(schema, dict) or _depth(schema) > MAX_SCHEMA_DEPTH or not _local_refs_only(schema):
        return None
    try:
        validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator_cls.check_schema(schema)
    except (jsonschema.SchemaError, RecursionError):
        return None
    return validator_cls(schema)


def schema_problems(schema: Any, tool_input: dict[str, Any]) -> str | None:
    """Why ``tool_input`` breaks the frozen schema, or None. Guards size, depth and remote refs."""
    if schema is None:
        return None
    text = canonical_json(schema)
    validator = _compiled(text) if len(text) <= MAX_SCHEMA_BYTES else None
    if validator is None:
        return INVALID_SCHEMA
    try:
        errors = sorted(validator.iter_errors(tool_input), key=lambda e: list(e.absolute_path))
    except (jsonschema.SchemaError, jsonschema.exceptions.RefResolutionError, RecursionError):
        return INVALID_SCHEMA
    if not errors:
        return None
    pointers = sorted({"/" + "/".join(str(p) for p in e.absolute_path) for e in errors})
    return "arguments rejected by frozen schema: " + ", ".join(pointers[:10])


def decide(
    spec: RunSpec,
    tool: str,
    tool_input: dict[str, Any],
    *,
    registered_calls: int,
    session_scope_keys: frozenset[str] = frozenset(),
) -> GateDecision:
    """Decide one new tool call. ``registered_calls`` counts this call's intent row too."""
    entry = brokered_entry(spec.brokered, tool) if tool.startswith("mcp__") else None
    access, approval = entry_access(entry) if entry is not None else (None, None)
    decision = _decide(spec, tool, tool_input, registered_calls, session_scope_keys, entry, access, approval)
    return decision.model_copy(update={"access": access}) if access is not None else decision


def _decide(
    spec: RunSpec,
    tool: str,
    tool_input: dict[str, Any],
    registered_calls: int,
    session_scope_keys: frozenset[str],
    entry: dict[str, Any] | None,
    access: str | None,
    approval: str | None,
) -> GateDecision:
    cap = spec.budgets.max_tool_calls
    if cap is not None and registered_calls > cap:
        return GateDecision(verdict="deny", source="budget", reason="tool-call budget exceeded", budget_exceeded=True)
    if tool.startswith("mcp__"):
        schemas = frozen_schemas(spec)
        if tool not in schemas:
            return GateDecision(
                verdict="deny", source="capability", reason=f"tool '{tool}' is not in this run's frozen tool set"
            )
        problem = schema_problems(schemas[tool], tool_input)
        if problem is not None:
            return GateDecision(verdict="deny", source="schema", reason=problem)
        if entry is not None and access is None:
            slot = tool[5:].partition("__")[0]
            return GateDecision(
                verdict="deny",
                source="access",
                reason=f"tool '{entry['name']}' has no access class (read or write) on connection '{slot}'",
            )
    if spec.trust_tier == "read_only" and not _read_only_allows(tool, tool_input):
        return GateDecision(
            verdict="deny",
            source="trust_tier",
            reason=f"read-only trust tier (untrusted event source): {tool} is not a read-only call",
        )
    if tool == dynamic_connections.PROPOSE_CONNECTION and not dynamic_connections.enabled(spec.harness_config):
        return GateDecision(verdict="deny", source="capability", reason="dynamic connections are off for this agent")
    verdict = evaluate(spec.policy(), tool, tool_input, autonomous=spec.autonomous, access=access)
    always = access == "write" and approval == "always"
    if always and (verdict.action != "deny" or verdict.original_action is not None):
        # Whatever the policy (or autonomy's rewrite of it) said, short of a policy deny, a human decides.
        return _always_ask(spec, tool, verdict)
    if (
        tool == dynamic_connections.PROPOSE_CONNECTION
        and verdict.action != "deny"
        and dynamic_connections.requires_approval(spec.harness_config)
    ):
        # Saving a proposed connection waits for a human whatever the policy or autonomy says (no session scope).
        return GateDecision(
            verdict="require_approval",
            source="dynamic_connection",
            reason="saving a proposed connection needs a human approval",
        )
    if verdict.original_action is not None:
        return GateDecision(
            verdict=verdict.action,
            source="autonomy_rewrite",
            reason=verdict.reason,
            original_verdict="require_approval",
            policy=verdict,
        )
    if verdict.action == "require_approval" and verdict.scope_key in session_scope_keys:
        return GateDecision(
            verdict="allow",
            source="session_scope",
            reason=f"approved for the session ({verdict.scope_key})",
            policy=verdict,
        )
    return GateDecision(verdict=verdict.action, source="policy", reason=verdict.reason, policy=verdict)


def _always_ask(spec: RunSpec, tool: str, verdict: PolicyVerdict) -> GateDecision:
    """A write whose connection says ``approval: always``: a human decides this one call (never a
    session-wide approval); an autonomous run has no human, so it is denied, never silently allowed."""
    if spec.autonomous:
        return GateDecision(
            verdict="deny",
            source="access",
            reason=f"{tool} is a write that always needs human approval; run is autonomous",
            original_verdict="require_approval",
        )
    policy = spec.policy()
    asked = PolicyVerdict(
        action="require_approval",
        rule=verdict.rule,
        risk=verdict.risk,
        reason=verdict.risk or f"{tool} is a write that always needs human approval",
        ttl_secs=verdict.ttl_secs or policy.approvals.default_ttl_secs,
        scope="once",
        scope_key=None,
    )
    return GateDecision(verdict="require_approval", source="access", reason=asked.reason, policy=asked)
