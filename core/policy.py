"""Policy documents and their evaluation (pure).

A policy is an ordered, first-match list of tool rules plus defaults, budgets, approval settings and
autonomy. Authored content is parsed strictly (an unknown key anywhere is an error naming it).
"""

from __future__ import annotations

import posixpath
import re
from fnmatch import fnmatchcase
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core import shell_words
from core.errors import Unprocessable

Action = Literal["allow", "approve", "deny"]
MAX_RULES = 512
MAX_PATTERNS = 256
MAX_STRING = 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _bounded(values: list[str], what: str) -> list[str]:
    if len(values) > MAX_PATTERNS:
        raise ValueError(f"{what} has more than {MAX_PATTERNS} entries")
    for v in values:
        if len(v.encode()) > MAX_STRING:
            raise ValueError(f"{what} entry is longer than {MAX_STRING} bytes")
    return values


# A backreference or conditional by group number or name: joined into one alternation it would point elsewhere.
_GROUP_REFERENCE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(|\\g<")


class ShellConstraint(_Strict):
    allow_prefixes: list[str] = Field(default_factory=list)
    deny_regex: list[str] = Field(default_factory=list)
    on_no_match: Action = "approve"

    @cached_property
    def compiled(self) -> list[re.Pattern[str]]:
        return [re.compile(p) for p in self.deny_regex]

    @cached_property
    def any_deny(self) -> re.Pattern[str] | None:
        """All deny patterns as one alternation: one scan of a command instead of one per pattern (a third of
        the time for governed's 22), the patterns themselves consulted only to name the one that hit. None
        when the patterns cannot be joined without changing their meaning (a group referred to by number or
        name, a global flag) or there are none: then each is tried in turn."""
        if not self.deny_regex or any(_GROUP_REFERENCE.search(p) for p in self.deny_regex):
            return None
        try:
            return re.compile("|".join(f"(?:{p})" for p in self.deny_regex))
        except re.error:
            return None

    def denied_by(self, text: str) -> str | None:
        """The first deny pattern (in order) found in ``text``."""
        if self.any_deny is not None and not self.any_deny.search(text):
            return None
        return next((p for p, c in zip(self.deny_regex, self.compiled, strict=True) if c.search(text)), None)

    @cached_property
    def prefix_words(self) -> list[tuple[str, list[str] | None, bool]]:
        """Each prefix as written, its words (None: it does not split, so it never matches) and whether it
        needs one more word (it ends in a space or tab: ``"cat "`` wants an argument)."""
        out: list[tuple[str, list[str] | None, bool]] = []
        for prefix in self.allow_prefixes:
            try:
                words: list[str] | None = shell_words.split(prefix)
            except shell_words.ShellSyntaxError:
                words = None
            out.append((prefix, words, prefix[-1:] in (" ", "\t")))
        return out

    @field_validator("allow_prefixes")
    @classmethod
    def _prefixes(cls, v: list[str]) -> list[str]:
        return _bounded(v, "shell.allow_prefixes")

    @field_validator("deny_regex")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for pattern in _bounded(v, "shell.deny_regex"):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"shell.deny_regex {pattern!r} does not compile: {exc}") from exc
        return v


class PathConstraint(_Strict):
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)

    @field_validator("allow", "deny")
    @classmethod
    def _globs(cls, v: list[str]) -> list[str]:
        return _bounded(v, "paths")


class ToolRule(_Strict):
    match: list[str] = Field(min_length=1)
    # Narrows the rule to brokered tools of this access class (frozen from their connection); a rule
    # with ``access`` and no ``match`` matches every tool of that class.
    access: Literal["read", "write"] | None = None
    action: Action
    risk: str | None = Field(default=None, max_length=MAX_STRING)
    paths: PathConstraint | None = None
    shell: ShellConstraint | None = None
    on_autonomous: Literal["allow", "deny"] | None = None
    approval_ttl_secs: int | None = Field(default=None, ge=1, le=7 * 24 * 3600)
    approval_scope: Literal["once", "session"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _match_all_of_class(cls, data: Any) -> Any:
        if isinstance(data, dict) and "match" not in data and data.get("access") is not None:
            return {**data, "match": ["*"]}
        return data

    @field_validator("match")
    @classmethod
    def _match(cls, v: list[str]) -> list[str]:
        return _bounded(v, "match")

    def matches(self, tool: str, access: str | None = None) -> bool:
        if self.access is not None and self.access != access:
            return False
        return any(_name_matches(m, tool) for m in self.match)


class Defaults(_Strict):
    tool_action: Action = "approve"


class Budgets(_Strict):
    """Caps; ``None`` means uncapped."""

    max_wall_clock_secs: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_tool_calls: int | None = Field(default=None, ge=0)
    # How long a run may wait for a connection (parked runs); unset: 1800 s. Never above one day.
    max_park_secs: int | None = Field(default=None, ge=1, le=24 * 3600)


DEFAULT_BUDGETS = Budgets(max_wall_clock_secs=1800, max_tokens=1_000_000, max_cost_usd=2.5, max_tool_calls=100)


class Approvals(_Strict):
    default_ttl_secs: int = Field(default=600, ge=1, le=7 * 24 * 3600)
    scope: Literal["once", "session"] = "once"
    timeout_action: Literal["deny"] = "deny"


class Autonomy(_Strict):
    permitted: bool = True
    on_approval_rule: Literal["deny", "allow"] = "deny"


class Policy(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = Field(default=None, max_length=4096)
    defaults: Defaults = Field(default_factory=Defaults)
    egress: dict[str, Any] | None = None  # dormant, kept for document compatibility
    network: dict[str, Any] | None = None
    budgets: Budgets = DEFAULT_BUDGETS
    approvals: Approvals = Field(default_factory=Approvals)
    autonomy: Autonomy = Field(default_factory=Autonomy)
    tools: list[ToolRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rule_count(self) -> Policy:
        if len(self.tools) > MAX_RULES:
            raise ValueError(f"a policy has at most {MAX_RULES} tool rules")
        return self

    def first_rule(self, tool: str, access: str | None = None) -> int | None:
        """Index of the first rule whose ``match`` (and ``access``, when it has one) hits ``tool``.
        ``access`` is the tool's frozen access class (None for tools that are not brokered)."""
        index = self._first_by_name(tool)
        if index is None or not self._has_access_rules:
            return index
        # Rare: some rule is narrowed by access class; scan on from the first name hit.
        return next(
            (i for i in range(index, len(self.tools)) if self.tools[i].matches(tool, access)),
            None,
        )

    @cached_property
    def _has_access_rules(self) -> bool:
        return any(rule.access is not None for rule in self.tools)

    def _first_by_name(self, tool: str) -> int | None:
        """From an index built once per policy (a scan of 500 rules per call would cost far more than
        the evaluation itself)."""
        exact, prefixes, star = self._index
        best = exact.get(tool)
        if star is not None and (best is None or star < best):
            best = star
        for index, prefix in prefixes:  # sorted by rule index: the first hit is the earliest
            if best is not None and index >= best:
                break
            if tool.startswith(prefix):
                return index
        return best

    @cached_property
    def _index(self) -> tuple[dict[str, int], list[tuple[int, str]], int | None]:
        exact: dict[str, int] = {}
        prefixes: list[tuple[int, str]] = []
        star: int | None = None
        for index, rule in enumerate(self.tools):
            for pattern in rule.match:
                if pattern == "*":
                    star = index if star is None else star
                elif pattern.endswith("*"):
                    prefixes.append((index, pattern[:-1]))
                else:
                    exact.setdefault(pattern, index)
        return exact, sorted(prefixes), star


def parse_policy(document: Any) -> Policy:
    """Strictly parse an authored policy document; errors name the offending key."""
    try:
        return Policy.model_validate(document)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(document)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key '{where}'")
            else:
                problems.append(f"{where}: {err['msg']}")
        raise Unprocessable("bad policy content: " + "; ".join(problems)) from None


def _name_matches(pattern: str, tool: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return tool.startswith(pattern[:-1])
    return pattern == tool


def _prefix_matches(words: list[str] | None, needs_more: bool, command: list[str]) -> bool:
    """Whether the command's leading words are the prefix's words (and one more, if the prefix wants it).
    A prefix of no words matches only a command of none: ``""`` is the empty command, never every command."""
    if words is None:
        return False
    if not words:
        return not command and not needs_more
    n = len(words)
    return command[:n] == words and (len(command) > n or not needs_more)


def _shell_verdict(shell: ShellConstraint, command: str) -> tuple[str | None, str | None]:
    """``(deny reason, None)`` or ``(None, the matched prefix as written or None)`` for one shell command.

    Deny patterns see the command as written and, when it differs, as the shell splits and unquotes it
    (its words joined by single spaces), so ``"--output"=f`` is ``--output=f`` to them; prefixes compare
    words. A command that cannot be split (an unterminated quote) cannot be judged and is denied."""
    pattern = shell.denied_by(command)
    if pattern is not None:
        return f'shell command matches deny pattern "{pattern}"', None
    try:
        words = shell_words.split(command)
    except shell_words.ShellSyntaxError as exc:
        return f"shell command cannot be split into words: {exc}; the policy cannot judge it", None
    unquoted = " ".join(words)
    if unquoted != command and (pattern := shell.denied_by(unquoted)) is not None:
        return f'shell command matches deny pattern "{pattern}" once the shell unquotes it', None
    matched = next((p for p, w, more in shell.prefix_words if _prefix_matches(w, more, words)), None)
    return None, matched


PATH_KEYS = ("file_path", "path", "notebook_path", "filePath")


WORKSPACE = "/workspace"


def normalize_path(path: str) -> str:
    """Lexically canonical: relative paths are rebased on /workspace, and ``.``/``..`` are folded,
    so ``/workspace/../etc/passwd`` is judged as ``/etc/passwd``."""
    joined = path if path.startswith("/") else f"{WORKSPACE}/{path}"
    normalized = posixpath.normpath(joined)
    return "/" + normalized.lstrip("/")  # normpath keeps a leading '//'


def candidate_paths(tool_input: dict[str, Any]) -> list[str]:
    paths = [v for k in PATH_KEYS if isinstance(v := tool_input.get(k), str)]
    edits = tool_input.get("edits")
    if isinstance(edits, list):
        paths += [e["file_path"] for e in edits if isinstance(e, dict) and isinstance(e.get("file_path"), str)]
    return [normalize_path(p) for p in paths]


class PolicyVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: Literal["allow", "deny", "require_approval"]
    reason: str | None = None
    rule: int | None = None  # index of the matching rule; None when the default applied
    risk: str | None = None
    ttl_secs: int | None = None
    scope: Literal["once", "session"] | None = None
    scope_key: str | None = None
    # Set when autonomy rewrote a require_approval verdict.
    original_action: Literal["require_approval"] | None = None


def _raw_verdict(
    policy: Policy, tool: str, tool_input: dict[str, Any], access: str | None = None
) -> tuple[PolicyVerdict, ToolRule | None]:
    index = policy.first_rule(tool, access)
    if index is not None:
        rule = policy.tools[index]
        action: Action = rule.action
        scope_key = tool
        if rule.shell is not None:
            command = str(tool_input.get("command", "")).strip()
            denied, matched = _shell_verdict(rule.shell, command)
            if denied is not None:
                return PolicyVerdict(action="deny", rule=index, reason=denied), rule
            # Two key namespaces so an exact command can never collide with a prefix key.
            if matched is not None:
                scope_key = f"{tool}:prefix:{matched}"
            else:
                action = rule.shell.on_no_match
                # The exact command, never its first word: approving `git push` for the session
                # must not approve every later git command.
                scope_key = f"{tool}:command:{command}"
        elif rule.paths is not None:
            paths = candidate_paths(tool_input)
            for path in paths:
                for glob in rule.paths.deny:
                    if fnmatchcase(path, glob):
                        return PolicyVerdict(
                            action="deny", rule=index, reason=f'path "{path}" matches deny glob "{glob}"'
                        ), rule
            if rule.paths.allow and (
                not paths or any(not any(fnmatchcase(p, g) for g in rule.paths.allow) for p in paths)
            ):
                action = "approve"
        return _action_verdict(policy, action, rule, index, scope_key), rule
    return _action_verdict(policy, policy.defaults.tool_action, None, None, tool), None


def _action_verdict(
    policy: Policy, action: Action, rule: ToolRule | None, index: int | None, scope_key: str
) -> PolicyVerdict:
    if action == "allow":
        return PolicyVerdict(action="allow", rule=index)
    if action == "deny":
        reason = (rule.risk if rule else None) or "denied by policy"
        return PolicyVerdict(action="deny", rule=index, reason=reason)
    return PolicyVerdict(
        action="require_approval",
        rule=index,
        risk=rule.risk if rule else None,
        reason=(rule.risk if rule else None) or "requires human approval",
        ttl_secs=(rule.approval_ttl_secs if rule else None) or policy.approvals.default_ttl_secs,
        scope=(rule.approval_scope if rule else None) or policy.approvals.scope,
        scope_key=scope_key,
    )


def evaluate(
    policy: Policy, tool: str, tool_input: dict[str, Any], *, autonomous: bool, access: str | None = None
) -> PolicyVerdict:
    """First matching rule wins; autonomy rewrites approvals inside the engine. ``access``: the tool's
    frozen access class, for rules narrowed by class."""
    verdict, rule = _raw_verdict(policy, tool, tool_input, access)
    if not autonomous or verdict.action != "require_approval":
        return verdict
    fallback = (rule.on_autonomous if rule else None) or policy.autonomy.on_approval_rule
    if fallback == "allow":
        return PolicyVerdict(action="allow", rule=verdict.rule, original_action="require_approval")
    return PolicyVerdict(
        action="deny",
        rule=verdict.rule,
        reason="requires human approval; run is autonomous (policy fallback: deny)",
        original_action="require_approval",
    )
