"""The deterministic replay harness: a scripted transcript driven through the real runner contract.

It exists so the whole control plane (gate, approvals, ledger, diff collection) can be exercised end to
end at $0 and with no API key: every tool step still asks ``/permission`` and, when allowed, really runs
against the workspace — only the "model" is a fixed script. Its first timeline message says so.

The script comes from ``FLUIDBOX_REPLAY_SCRIPT`` (a JSON array of :class:`core.wire.Step`) or,
when that is absent, the baked ``transcripts/demo.json``, which fixes ``examples/demo-repo``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from core.tools import canonicalize
from core.wire import (
    AGENT_MESSAGE,
    DISCOVERY_INPUT_FIELDS,
    ENV_AUTONOMY,
    ENV_CAPABILITIES,
    ENV_HEARTBEAT_SECS,
    ENV_REPLAY_DELAY_MS,
    ENV_REPLAY_SCRIPT,
    ENV_TOKEN_TTL_SECS,
    ENV_WORKSPACE,
    EXIT_AGENT_ERROR,
    EXIT_OK,
    RUN_ERROR,
    SANDBOX_WORKSPACE,
    TOOL_CALL,
    TOOL_DESCRIBE,
    TOOL_SEARCH,
    step_problems,
    to_step,
)
from core.wire import Step as ReplayStep
from runner import tools
from runner.gateway import AudienceMismatch, ControlPlane, GatewayError, GatewayGone, log
from runner.heartbeat import DEFAULT_HEARTBEAT_SECS, Heartbeat, renewal_interval
from runner.local_tools import LocalTools, StdioMcpError, ToolRefused

# Next to this module, read with a plain open(): importlib.resources would load tempfile, shutil, zipfile and
# more, a few ms of every runner's start (issue 12); the runner always runs from files on disk.
_TRANSCRIPT_PATH: Final[str] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transcripts", "demo.json")
with open(_TRANSCRIPT_PATH, encoding="utf-8") as _transcript:
    DEFAULT_TRANSCRIPT: Final[str] = _transcript.read()
DEFAULT_DELAY_MS = 400.0
STARTING_TEXT = "deterministic replay runner starting — scripted transcript, no model calls (autonomy={autonomy})"
DEPLOY_WITHHELD = " Deploy withheld — nothing was released."

PROPOSE_CONNECTION: Final[str] = "ProposeConnection"  # core.dynamic_connections.PROPOSE_CONNECTION

# Required string fields of each tool's input (Claude Code's canonical names).
TOOL_INPUT_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "Bash": ("command",),
    "Write": ("file_path", "content"),
    "Edit": ("file_path", "old_string", "new_string"),
    "Read": ("file_path",),
    **DISCOVERY_INPUT_FIELDS,
}


class ScriptError(ValueError):
    """The replay script is malformed; the message names the offending step."""


def parse_script(text: str) -> list[ReplayStep]:
    """Parse and validate a replay script: a non-empty JSON array of steps.

    Raises:
        ScriptError: invalid JSON, not an array, empty, or a step that is not exactly one of
            ``say``/``tool``/``sleep_ms`` with the fields that kind needs.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"invalid replay script: not JSON ({exc})") from None
    if not isinstance(raw, list):
        raise ScriptError("invalid replay script: expected a JSON array of steps")
    if not raw:
        raise ScriptError("invalid replay script: no steps")
    return [_parse_step(number, item) for number, item in enumerate(raw, start=1)]


def _parse_step(number: int, item: Any) -> ReplayStep:
    where = f"invalid replay script: step {number}"
    problems = step_problems(item)
    if problems:
        raise ScriptError(f"{where}: {'; '.join(problems)}")
    step = to_step(item)
    try:
        kind = step.kind()
    except ValueError as exc:
        raise ScriptError(f"{where}: {exc}") from None
    if kind != "tool":
        extra = [name for name in ("input", "on_deny_say", "timeout_ms") if getattr(step, name) is not None]
        if extra:
            raise ScriptError(f"{where}: {', '.join(extra)} only applies to tool steps")
        return step
    assert step.tool is not None
    tool_input = step.input or {}
    for field in TOOL_INPUT_FIELDS.get(step.tool, ()):  # brokered tools: their frozen schema decides
        if not isinstance(tool_input.get(field), str):
            raise ScriptError(f"{where}: {step.tool} needs a string input.{field}")
    return step


def load_script(environ: Mapping[str, str]) -> list[ReplayStep]:
    """The script from ``FLUIDBOX_REPLAY_SCRIPT``, or the default transcript when it is unset or blank."""
    text = environ.get(ENV_REPLAY_SCRIPT)
    return parse_script(text if text and text.strip() else DEFAULT_TRANSCRIPT)


class Tally:
    """What the run did, counted as it goes (a plain class: ``dataclasses`` costs every start a few ms)."""

    __slots__ = ("denied", "deploy_denied", "executed")

    def __init__(self, executed: int = 0, denied: int = 0, deploy_denied: bool = False) -> None:
        self.executed = executed
        self.denied = denied
        self.deploy_denied = deploy_denied

    def summary(self) -> str:
        text = f"Replay complete: {self.executed} executed, {self.denied} denied."
        return text + DEPLOY_WITHHELD if self.deploy_denied else text


def execute(tool: str, tool_input: Mapping[str, Any], root: str, timeout_s: float) -> str:
    """Run one allowed tool call for real and return its narration.

    Raises:
        ValueError: missing input fields, a path escaping the workspace, or an Edit that does not match once.
        OSError: the file system said no.
    """

    def field(name: str) -> str:
        value = tool_input.get(name)
        if not isinstance(value, str):
            raise ValueError(f"{tool} input.{name} must be a string")
        return value

    if tool == "Bash":
        command = field("command")
        code, output = tools.run_bash(command, root, timeout_s)
        return narrate_bash(command, code, output)
    if tool == "Write":
        path = field("file_path")
        size = tools.write_file(path, field("content"), root)
        return f"wrote {path} ({size} bytes)"
    if tool == "Edit":
        path = field("file_path")
        tools.edit_file(path, field("old_string"), field("new_string"), root)
        return f"edited {path}"
    if tool == "Read":
        path = field("file_path")
        return f"read {path}\n{tools.read_file(path, root)}"
    raise ValueError(f"unsupported tool: {tool}")


def narrate_bash(command: str, code: int, output: str) -> str:
    text = f"$ {command}"
    if output.strip():
        text += "\n" + output.rstrip("\n")
    if code != 0:
        text += f"\n→ exit {code}"
    return text


class ReplayDriver:
    """Walks the steps: narration, sleeps, and gated tool calls numbered ``rp_001``, ``rp_002``, …"""

    def __init__(
        self,
        gateway: ControlPlane,
        steps: list[ReplayStep],
        *,
        root: str = SANDBOX_WORKSPACE,
        delay_s: float = DEFAULT_DELAY_MS / 1000,
        sleep: Callable[[float], None] = time.sleep,
        local: LocalTools | None = None,
    ) -> None:
        self._gateway = gateway
        self._local = local or LocalTools()
        self._steps = steps
        self._root = root
        self._delay_s = delay_s
        self._sleep = sleep
        self._tool_calls = 0
        self.tally = Tally()

    def run(self) -> Tally:
        for index, step in enumerate(self._steps):
            if index and self._delay_s > 0:
                self._sleep(self._delay_s)
            kind = step.kind()
            if kind == "say":
                self._say(step.say or "")
            elif kind == "sleep_ms":
                self._sleep((step.sleep_ms or 0) / 1000)
            else:
                self._tool(step)
        return self.tally

    def _discover(self, step: ReplayStep, tool_call_id: str) -> None:
        """Deferred discovery: search and describe are answered from the frozen RunSpec; ``tool_call`` is a
        brokered call on its target, gated exactly as a direct call (the ledger names the target)."""
        tool, given = step.tool, dict(step.input or {})
        if tool == TOOL_CALL:
            arguments = given.get("arguments", {})
            if not isinstance(arguments, dict):
                raise ValueError("tool_call input.arguments must be an object")
            self._brokered(step, tool_call_id, str(given["name"]), arguments, via=TOOL_CALL)
            return
        if tool == TOOL_SEARCH:
            payload = {"query": given["query"], **({"limit": given["limit"]} if "limit" in given else {})}
            answer = self._gateway.discover("tools/search", payload)
        else:
            answer = self._gateway.discover("tools/describe", {"name": given["name"]})
        if "error" in answer:
            self.tally.denied += 1
            self._say(step.on_deny_say or f"{tool} failed: {answer['error']}")
            return
        self.tally.executed += 1
        self._say(f"{tool} → {json.dumps(answer, sort_keys=True)}")

    def _brokered(
        self, step: ReplayStep, tool_call_id: str, tool: str, tool_input: dict[str, Any], via: str | None = None
    ) -> None:
        answer = self._gateway.tools_call(tool_call_id, tool, tool_input, via)
        if answer.get("ok"):
            self.tally.executed += 1
            self._say(narrate_brokered(tool, answer))
            return
        self.tally.denied += 1
        reason = answer.get("message") or answer.get("error") or "no reason given"
        self._say(step.on_deny_say or f"{tool} {'denied' if answer.get('denied') else 'failed'}: {reason}")

    def _propose(self, step: ReplayStep, tool_call_id: str, connection: dict[str, Any]) -> None:
        """Dynamic connections: the control plane checks, gates (a human approves by default) and saves."""
        answer = self._gateway.propose_connection(tool_call_id, connection)
        if answer.get("ok"):
            self.tally.executed += 1
            self._say(f"{PROPOSE_CONNECTION} → saved connection {answer.get('connection_id')} ({answer.get('status')})")
            return
        self.tally.denied += 1
        reason = answer.get("message") or answer.get("error") or "no reason given"
        self._say(step.on_deny_say or f"{PROPOSE_CONNECTION} refused: {reason}")

    def _in_sandbox(self, step: ReplayStep, tool_call_id: str, tool: str, tool_input: dict[str, Any]) -> None:
        """A sandbox-class server or sandbox CLI tool: the gate decides, then it runs here."""
        decision = self._gateway.permission(tool_call_id, tool, tool_input)
        if decision.decision != "allow":
            self.tally.denied += 1
            self._say(step.on_deny_say or f"{tool} denied: {decision.message or 'no reason given'}")
            return
        effective = decision.updated_input if decision.updated_input is not None else tool_input
        try:
            result = self._local.call(tool, effective, self._root)
        except (ToolRefused, StdioMcpError) as exc:
            result = {"content": [{"type": "text", "text": str(exc)}], "isError": True}
        self.tally.executed += 1
        self._say(narrate_brokered(tool, {"result": {**result, "is_error": bool(result.get("isError"))}}))

    def _say(self, text: str) -> None:
        self._gateway.emit("agent", AGENT_MESSAGE, {"role": "assistant", "text": text})

    def _tool(self, step: ReplayStep) -> None:
        assert step.tool is not None
        self._tool_calls += 1
        tool_call_id = f"rp_{self._tool_calls:03d}"
        if step.tool in (TOOL_SEARCH, TOOL_DESCRIBE, TOOL_CALL):
            self._discover(step, tool_call_id)
            return
        # The gate judges canonical names and shapes; what runs is exactly what was judged.
        tool, tool_input = canonicalize(step.tool, dict(step.input or {}))
        if self._local.owns(tool):
            self._in_sandbox(step, tool_call_id, tool, tool_input)
            return
        if tool == PROPOSE_CONNECTION:
            self._propose(step, tool_call_id, tool_input)
            return
        if tool.startswith("mcp__"):
            self._brokered(step, tool_call_id, tool, tool_input)
            return
        decision = self._gateway.permission(tool_call_id, tool, tool_input)
        if decision.decision == "allow":
            effective = decision.updated_input if decision.updated_input is not None else tool_input
            timeout_s = step.timeout_ms / 1000 if step.timeout_ms else tools.DEFAULT_BASH_TIMEOUT_S
            narration = execute(tool, effective, self._root, timeout_s)
            self.tally.executed += 1
            self._say(narration)
            return
        self.tally.denied += 1
        if step.tool == "Bash" and "deploy" in str(tool_input.get("command", "")):
            self.tally.deploy_denied = True
        self._say(step.on_deny_say or f"{step.tool} denied: {decision.message or 'no reason given'}")


def narrate_brokered(tool: str, answer: dict[str, Any]) -> str:
    """What the agent sees of a brokered result: its text content, or why there is none."""
    result = answer.get("result") or {}
    texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict) and c.get("type") == "text"]
    body = "\n".join(t for t in texts if t) or "(no text content)"
    return f"{tool} → {'error: ' if result.get('is_error') else ''}{body}"


def env_number(environ: Mapping[str, str], name: str, default: float) -> float:
    """A non-negative number from the environment; junk falls back to ``default`` (logged)."""
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        log(f"ignoring {name}={raw!r}: not a non-negative number")
        return default
    return value


def run(
    gateway: ControlPlane,
    environ: Mapping[str, str],
    *,
    sleep: Callable[[float], None] = time.sleep,
    exit_process: Callable[[int], None] = os._exit,
) -> int:
    """Drive the replay harness end to end; returns the process exit code.

    ``exit_process`` ends the process from the heartbeat thread on quiesce (0) or a wrong-audience
    heartbeat (3); ``os._exit`` because the driver may be blocked inside a ``/permission`` wait.

    Raises:
        AudienceMismatch: from the driver thread; the caller turns it into exit code 3.
    """
    autonomy = environ.get(ENV_AUTONOMY) or "unknown"
    gateway.emit("harness", AGENT_MESSAGE, {"role": "system", "text": STARTING_TEXT.format(autonomy=autonomy)})

    local = LocalTools()

    def end_process(code: int) -> None:
        tools.kill_running()
        local.close()
        sys.stdout.flush()
        sys.stderr.flush()
        exit_process(code)

    def quiesce() -> None:
        log("quiesce requested: stopping without posting a result")
        end_process(EXIT_OK)

    interval = env_number(environ, ENV_HEARTBEAT_SECS, DEFAULT_HEARTBEAT_SECS) or DEFAULT_HEARTBEAT_SECS
    heartbeat = Heartbeat(
        gateway,
        interval,
        on_quiesce=quiesce,
        on_fatal=end_process,
        renew_every_s=renewal_interval(env_number(environ, ENV_TOKEN_TTL_SECS, 0.0)),
    )
    heartbeat.start()
    try:
        steps = load_script(environ)
        local = LocalTools.from_capabilities(environ.get(ENV_CAPABILITIES))
        driver = ReplayDriver(
            gateway,
            steps,
            root=environ.get(ENV_WORKSPACE) or SANDBOX_WORKSPACE,
            delay_s=env_number(environ, ENV_REPLAY_DELAY_MS, DEFAULT_DELAY_MS) / 1000,
            sleep=sleep,
            local=local,
        )
        tally = driver.run()
    except (AudienceMismatch, GatewayGone):
        heartbeat.stop()
        local.close()
        raise
    except Exception as exc:
        heartbeat.stop()
        local.close()
        if not isinstance(exc, ScriptError):
            import traceback  # only a failing run needs it

            traceback.print_exc(file=sys.stderr)
        return report_failure(gateway, f"replay runner failed: {describe(exc)}")
    heartbeat.stop()
    local.close()
    try:
        gateway.result("completed", tally.summary())
    except GatewayError as exc:
        log(str(exc))
        return EXIT_AGENT_ERROR
    return EXIT_OK


def report_failure(gateway: ControlPlane, message: str) -> int:
    """Emit ``run.error`` and post ``/result failed``; returns exit code 1 either way."""
    gateway.emit("harness", RUN_ERROR, {"message": message})
    try:
        gateway.result("failed", message)
    except GatewayError as exc:
        log(str(exc))
    return EXIT_AGENT_ERROR


def describe(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, ValueError | OSError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
