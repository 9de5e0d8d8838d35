"""The ``claude-agent-sdk`` harness: Claude Code's agent loop, governed by the control plane's gate.

The Claude Agent SDK drives the Claude Code CLI bundled in its wheel. Inside the sandbox there is no
network: model traffic goes CLI → loopback relay (:mod:`runner.relay`) → the control plane's Unix socket →
the LLM facade. The relay adds the run's llm-audience token to each request; the CLI itself holds only a
placeholder key, so no token of any audience is in the environment of the CLI or of a shell it starts. The
CLI's environment is an allow-list (never a ``FLUIDBOX_*`` variable).

How every tool call is decided exactly once (measured with this SDK and CLI, and tested):

* A ``PreToolUse`` hook with no matcher fires for every tool call and always answers ``ask``. Without it
  the CLI runs calls it classifies as read-only (``ls``, ``cat | wc``, ``Read``) without consulting anyone.
  The hook does no I/O, so it cannot time out or fail; should it fail anyway, ``on_failure="block"``
  blocks the call.
* ``ask`` sends every call to ``can_use_tool``, which blocks on ``/permission`` (no client-side timeout,
  so a human approval can take as long as the server lets it). Calls to brokered ``mcp__<slot>__<tool>``
  tools are allowed there without a second decision: their handler calls ``/tools/call``, where the
  broker runs the identical gate. A repeated callback for the same tool call reuses the first answer.
* A witness checks every tool result against the decisions: a result for a call that was never decided
  (other than the CLI's own refusal of an unknown tool) ends the run with exit code 5.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    HookMatcher,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    SdkMcpTool,
    TextBlock,
    ToolPermissionContext,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
    create_sdk_mcp_server,
)

from core.tools import canonicalize
from core.wire import (
    AGENT_MESSAGE,
    ENV_AUTONOMY,
    ENV_BOOTSTRAP_FILE,
    ENV_CAPABILITIES,
    ENV_CONTROL_SOCKET,
    ENV_CONTROL_URL,
    ENV_HEARTBEAT_SECS,
    ENV_MAX_TURNS,
    ENV_MODEL,
    ENV_SYSTEM_PROMPT,
    ENV_TASK,
    ENV_TOKEN_TTL_SECS,
    ENV_TOOL_DISCOVERY,
    ENV_WORKSPACE,
    EXIT_AGENT_ERROR,
    EXIT_AUDIENCE_MISMATCH,
    EXIT_OK,
    EXIT_UNGOVERNED_TOOL,
    RUN_ERROR,
    SANDBOX_WORKSPACE,
    TOOL_CALL,
    TOOL_DESCRIBE,
    TOOL_SEARCH,
)
from runner.gateway import AudienceMismatch, ControlPlane, Credentials, GatewayError, log
from runner.heartbeat import DEFAULT_HEARTBEAT_SECS, Heartbeat, renewal_interval
from runner.local_tools import LocalTools, StdioMcpError, ToolRefused
from runner.relay import Relay
from runner.replay import env_number, report_failure

HARNESS = "claude-agent-sdk"
DEFAULT_MODEL = "claude-haiku-4-5"
DEFAULT_MAX_TURNS = 60
LLM_PATH = "/internal/llm"
TOOL_COMPLETED = "tool.completed"
RESULT_PREVIEW_CHARS = 300
MAX_GATEWAY_THREADS = 32
# What the CLI sends as its API key; the relay replaces it with the llm-audience token.
PLACEHOLDER_KEY = "fluidbox-relay-adds-the-key"
GATE_REASON = "fluidbox governs this run: every tool call needs a control-plane decision"
# The CLI's own refusal of a call it will not run (unknown tool, invalid input): nothing executed.
CLI_REFUSAL_MARK = "<tool_use_error>"
# Variables the CLI may inherit from the runner's own environment; everything else is dropped.
INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONDONTWRITEBYTECODE")

ExitProcess = Callable[[int], None]

# Deferred discovery's three tools, mounted as one in-process MCP server. Requirement slots never contain an
# underscore, so this alias cannot shadow a brokered surface.
DISCOVERY_SERVER = "fluidbox_tools"
DISCOVERY_PREFIX = f"mcp__{DISCOVERY_SERVER}__"
DISCOVERY_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    TOOL_SEARCH: (
        "Search the tools of this run's connections. Returns up to `limit` matches, each with its `name` (pass it "
        "to tool_describe and tool_call), a one-line description, its connection, its access class and whether "
        "its connection needs authorization first.",
        {"type": "object", "properties": {
            "query": {"type": "string", "description": "what you want to do, in a few words"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        }, "required": ["query"]},
    ),
    TOOL_DESCRIBE: (
        "The full description and input schema of one tool found with tool_search.",
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    TOOL_CALL: (
        "Call one tool found with tool_search: `name` as tool_search gave it, `arguments` matching its input "
        "schema (see tool_describe). The call is governed exactly as a direct call of that tool.",
        {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
         "required": ["name"]},
    ),
}  # fmt: skip


class UngovernedTool(Exception):
    """A tool produced a result although the gate never decided it."""

    def __init__(self, tool: str, tool_call_id: str) -> None:
        super().__init__(f"tool {tool} ({tool_call_id}) produced a result without a gate decision")
        self.tool = tool
        self.tool_call_id = tool_call_id


@dataclass(frozen=True)
class Settings:
    """What the harness reads from the sandbox environment (before scrubbing it)."""

    model: str
    task: str
    system_prompt: str | None
    autonomy: str
    workspace: str
    socket_path: str
    max_turns: int
    heartbeat_s: float
    token_ttl_s: float
    brokered: dict[str, list[dict[str, Any]]]
    # Sandbox-class capability servers and sandbox CLI tools: gated by can_use_tool, run in here.
    local: LocalTools = field(default_factory=LocalTools)
    # The agent may propose connections (``mcp__fluidbox__propose_connection``): the tool's definition, or None.
    proposal_tool: dict[str, Any] | None = None
    deferred: bool = False  # brokered tools are discovered with tool_search / tool_describe / tool_call

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Raises ValueError: no control socket, or unreadable capabilities."""
        # A Pod has no socket: it reaches the control plane at its URL (runner.remote), and so does the relay.
        remote = environ.get(ENV_CONTROL_URL, "") if environ.get(ENV_BOOTSTRAP_FILE) else ""
        socket_path = environ.get(ENV_CONTROL_SOCKET) or remote
        if not socket_path:
            raise ValueError(f"{ENV_CONTROL_SOCKET} is not set: the CLI cannot reach the LLM facade")
        return cls(
            model=(environ.get(ENV_MODEL) or "").strip() or DEFAULT_MODEL,
            task=environ.get(ENV_TASK) or "",
            system_prompt=environ.get(ENV_SYSTEM_PROMPT) or None,
            autonomy=environ.get(ENV_AUTONOMY) or "unknown",
            workspace=environ.get(ENV_WORKSPACE) or SANDBOX_WORKSPACE,
            socket_path=socket_path,
            max_turns=int(env_number(environ, ENV_MAX_TURNS, DEFAULT_MAX_TURNS)) or DEFAULT_MAX_TURNS,
            heartbeat_s=env_number(environ, ENV_HEARTBEAT_SECS, DEFAULT_HEARTBEAT_SECS) or DEFAULT_HEARTBEAT_SECS,
            token_ttl_s=env_number(environ, ENV_TOKEN_TTL_SECS, 0.0),
            brokered=brokered_tools(environ.get(ENV_CAPABILITIES)),
            local=LocalTools.from_capabilities(environ.get(ENV_CAPABILITIES)),
            proposal_tool=proposal_tool(environ.get(ENV_CAPABILITIES)),
            deferred=(environ.get(ENV_TOOL_DISCOVERY) or "").strip() == "deferred",
        )


def brokered_tools(raw: str | None) -> dict[str, list[dict[str, Any]]]:
    """The brokered surfaces from ``FLUIDBOX_CAPABILITIES``: slot → frozen tool definitions.

    Raises:
        ValueError: the variable is set but is not the documented JSON shape.
    """
    if not raw or not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV_CAPABILITIES} is not JSON: {exc}") from None
    servers = doc.get("servers") if isinstance(doc, dict) else None
    if not isinstance(servers, list):
        raise ValueError(f"{ENV_CAPABILITIES} has no servers list")
    found: dict[str, list[dict[str, Any]]] = {}
    for server in servers:
        if not isinstance(server, dict) or server.get("class") != "brokered":
            continue  # sandbox-class servers are not mounted by this harness yet
        slot, tools = server.get("name"), server.get("tools")
        if not isinstance(slot, str) or not slot or not isinstance(tools, list):
            raise ValueError(f"{ENV_CAPABILITIES}: a brokered server needs a name and a tools list")
        found[slot] = [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
    return found


def proposal_tool(raw: str | None) -> dict[str, Any] | None:
    """The dynamic-connection proposal tool from ``FLUIDBOX_CAPABILITIES`` (present only when the agent enables it)."""
    try:
        servers = json.loads(raw).get("servers", []) if raw and raw.strip() else []
    except (json.JSONDecodeError, AttributeError):
        return None
    for server in servers if isinstance(servers, list) else []:
        if isinstance(server, dict) and server.get("class") == "dynamic_connections" and server.get("tools"):
            tool = server["tools"][0]
            return {**tool, "full_name": f"mcp__{server.get('name')}__{tool.get('name')}"}
    return None


def cli_env(*, base_url: str, model: str, home: str) -> dict[str, str]:
    """The complete environment of the Claude Code CLI: an allow-list holding no token at all.

    Every model alias is pinned to the run's frozen model, so no background request asks for another one.
    """
    env = {name: os.environ[name] for name in INHERITED if os.environ.get(name)}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.update(
        {
            "HOME": home,
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "CLAUDE_CODE_MAX_RETRIES": "2",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            # MCP tools are sent inline; by default the CLI hides them behind a ToolSearch placeholder.
            "ENABLE_TOOL_SEARCH": "false",
        }
    )
    return env


def scrub_process_env(keep: Mapping[str, str]) -> None:
    """Make this process's environment exactly ``keep``: the SDK starts the CLI with ``os.environ`` merged
    under its own ``env`` option, so anything left here would reach the CLI and every shell it starts."""
    os.environ.clear()
    os.environ.update(keep)


@dataclass
class Witness:
    """Which tool calls were seen, which the gate decided, and how."""

    tools: dict[str, str] = field(default_factory=dict)
    decided: dict[str, PermissionResultAllow | PermissionResultDeny] = field(default_factory=dict)
    brokered: set[str] = field(default_factory=set)

    via: dict[str, str] = field(default_factory=dict)

    def saw(self, block: ToolUseBlock) -> None:
        target = block.input.get("name") if block.name == DISCOVERY_PREFIX + TOOL_CALL else None
        if isinstance(target, str) and target:
            # The ledger names the tool that ran, not the wrapper the model used to reach it.
            self.tools[block.id], self.via[block.id] = target, TOOL_CALL
        else:
            self.tools[block.id] = block.name

    def check(self, block: ToolResultBlock) -> None:
        """Raises UngovernedTool: a result for a call nobody decided (a CLI refusal is not a result)."""
        if block.tool_use_id in self.decided or block.tool_use_id in self.brokered:
            return
        if block.is_error and CLI_REFUSAL_MARK in result_text(block):
            return
        raise UngovernedTool(self.tools.get(block.tool_use_id, "unknown"), block.tool_use_id)


class ClaudeHarness:
    """One run of the Claude Agent SDK against the gate; ``run()`` returns the process exit code."""

    def __init__(
        self,
        gateway: ControlPlane,
        settings: Settings,
        llm_token: str,
        *,
        exit_process: ExitProcess = os._exit,
    ) -> None:
        self._gateway = gateway
        self._settings = settings
        self._llm_token = llm_token
        self._exit_process = exit_process
        self._witness = Witness()
        # Brokered calls as can_use_tool saw them, so the MCP handler can reuse the model's tool_use id.
        self._pending_brokered: dict[tuple[str, str], list[str]] = {}
        self._pending_lock = threading.Lock()
        self._fatal: int | None = None

    # -- the gate ----------------------------------------------------------------------------------

    async def pre_tool_use(self, _input: Any, _tool_use_id: str | None, _context: Any) -> dict[str, Any]:
        """Every tool call: no decision here, only "ask", so that ``can_use_tool`` is always consulted."""
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "ask",
                "permissionDecisionReason": GATE_REASON,
            }
        }

    async def can_use_tool(
        self, tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        tool_call_id = context.tool_use_id or f"cl_{uuid.uuid4().hex}"
        earlier = self._witness.decided.get(tool_call_id)
        if earlier is not None:
            return earlier
        if self._is_brokered(tool_name) or self._is_discovery(tool_name):
            # The broker re-runs the identical gate on /tools/call: deciding here too would ask twice.
            # tool_search / tool_describe read the frozen RunSpec; tool_call is a /tools/call on its target.
            self._witness.brokered.add(tool_call_id)
            with self._pending_lock:
                self._pending_brokered.setdefault((tool_name, _key(tool_input)), []).append(tool_call_id)
            return PermissionResultAllow()
        tool, canonical_input = canonicalize(tool_name, tool_input)
        try:
            decision = await asyncio.to_thread(self._gateway.permission, tool_call_id, tool, canonical_input)
        except AudienceMismatch:
            self._abort(EXIT_AUDIENCE_MISMATCH)
            raise
        except Exception as exc:  # fail closed on anything unexpected
            log(f"permission {tool_call_id} failed: {exc}")
            result: PermissionResultAllow | PermissionResultDeny = PermissionResultDeny(
                message=f"fluidbox could not decide this call ({type(exc).__name__}); it was not run"
            )
        else:
            if decision.decision == "allow":
                result = PermissionResultAllow(updated_input=decision.updated_input)
            else:
                result = PermissionResultDeny(message=decision.message or "denied by the fluidbox policy")
        self._witness.decided[tool_call_id] = result
        return result

    def _is_brokered(self, tool_name: str) -> bool:
        proposal = self._settings.proposal_tool
        if proposal is not None and tool_name == proposal["full_name"]:
            return True  # like a brokered call, the control plane gates it (/connections/propose)
        if not tool_name.startswith("mcp__"):
            return False
        slot, sep, name = tool_name[5:].partition("__")
        return bool(sep) and any(t["name"] == name for t in self._settings.brokered.get(slot, []))

    def _is_discovery(self, tool_name: str) -> bool:
        name = tool_name.removeprefix(DISCOVERY_PREFIX)
        return self._settings.deferred and name != tool_name and name in DISCOVERY_TOOLS

    # -- deferred discovery ------------------------------------------------------------------------

    def discovery_server(self) -> Any:
        defs = [self._discovery_tool(name, text, schema) for name, (text, schema) in DISCOVERY_TOOLS.items()]
        return create_sdk_mcp_server(DISCOVERY_SERVER, tools=defs)

    def _discovery_tool(self, name: str, description: str, schema: dict[str, Any]) -> SdkMcpTool[Any]:
        full_name = DISCOVERY_PREFIX + name

        async def handler(args: dict[str, Any]) -> dict[str, Any]:
            try:
                if name == TOOL_CALL:
                    return await self._tool_call(full_name, args)
                if name == TOOL_SEARCH:
                    payload: dict[str, Any] = {k: args[k] for k in ("query", "limit") if k in args}
                    answer = await asyncio.to_thread(self._gateway.discover, "tools/search", payload)
                else:
                    payload = {"name": args.get("name")}  # the control plane names what is wrong with it
                    answer = await asyncio.to_thread(self._gateway.discover, "tools/describe", payload)
            except AudienceMismatch:
                self._abort(EXIT_AUDIENCE_MISMATCH)
                raise
            if "error" in answer:
                return {"content": [{"type": "text", "text": f"{name} failed: {answer['error']}"}], "is_error": True}
            return {"content": [{"type": "text", "text": json.dumps(answer, indent=1)}]}

        return SdkMcpTool(name=name, description=description, input_schema=schema, handler=handler)

    async def _tool_call(self, full_name: str, args: dict[str, Any]) -> dict[str, Any]:
        with self._pending_lock:
            queue = self._pending_brokered.get((full_name, _key(args)), [])
            tool_call_id = queue.pop(0) if queue else f"bkr_{uuid.uuid4().hex}"
        target, arguments = args.get("name"), args.get("arguments", {})
        if not isinstance(target, str) or not isinstance(arguments, dict):
            text = "tool_call needs a string `name` and an object `arguments`"
            return {"content": [{"type": "text", "text": text}], "is_error": True}
        answer = await asyncio.to_thread(self._gateway.tools_call, tool_call_id, target, arguments, TOOL_CALL)
        return brokered_result(answer)

    # -- brokered tools ----------------------------------------------------------------------------

    def brokered_servers(self) -> dict[str, Any]:
        servers: dict[str, Any] = {}
        if self._settings.deferred:
            servers[DISCOVERY_SERVER] = self.discovery_server()
        for slot, tools in self._settings.brokered.items():
            defs = [self._brokered_tool(slot, t) for t in tools]
            servers[slot] = create_sdk_mcp_server(f"fluidbox-broker-{slot}", tools=defs)
        return servers

    def _brokered_tool(self, slot: str, spec: dict[str, Any]) -> SdkMcpTool[Any]:
        full_name = f"mcp__{slot}__{spec['name']}"
        schema = spec.get("input_schema")
        if not isinstance(schema, dict):
            schema = {"type": "object"}

        async def handler(args: dict[str, Any]) -> dict[str, Any]:
            with self._pending_lock:
                queue = self._pending_brokered.get((full_name, _key(args)), [])
                tool_call_id = queue.pop(0) if queue else f"bkr_{uuid.uuid4().hex}"
            try:
                answer = await asyncio.to_thread(self._gateway.tools_call, tool_call_id, full_name, args)
            except AudienceMismatch:
                self._abort(EXIT_AUDIENCE_MISMATCH)
                raise
            return brokered_result(answer)

        return SdkMcpTool(
            name=str(spec["name"]), description=str(spec.get("description") or ""), input_schema=schema,
            handler=handler,
        )  # fmt: skip

    # -- in-sandbox tools ----------------------------------------------------------------------------

    def local_servers(self) -> dict[str, Any]:
        """Sandbox-class capability servers as stdio entries the CLI launches in here (no network), and
        sandbox CLI surfaces as in-process tools. Both were decided by ``can_use_tool`` (the gate) first."""
        local = self._settings.local
        servers: dict[str, Any] = dict(local.stdio_configs(self._settings.workspace))
        for slot, decls in local.cli.items():
            defs = [self._cli_tool(slot, d) for d in decls.values()]
            servers[slot] = create_sdk_mcp_server(f"fluidbox-cli-{slot}", tools=defs)
        return servers

    def proposal_servers(self) -> dict[str, Any]:
        """``mcp__fluidbox__propose_connection`` when the agent may propose connections."""
        proposal = self._settings.proposal_tool
        if proposal is None:
            return {}
        full_name = proposal["full_name"]

        async def handler(args: dict[str, Any]) -> dict[str, Any]:
            with self._pending_lock:
                queue = self._pending_brokered.get((full_name, _key(args)), [])
                tool_call_id = queue.pop(0) if queue else f"prop_{uuid.uuid4().hex}"
            try:
                answer = await asyncio.to_thread(self._gateway.propose_connection, tool_call_id, args)
            except AudienceMismatch:
                self._abort(EXIT_AUDIENCE_MISMATCH)
                raise
            if answer.get("ok"):
                line = f"saved connection {answer.get('connection_id')} ({answer.get('status')}): a human authorizes it"
                return {"content": [{"type": "text", "text": line}]}
            reason = answer.get("message") or answer.get("error") or "no reason given"
            return {"content": [{"type": "text", "text": f"proposal refused: {reason}"}], "is_error": True}

        tool = SdkMcpTool(
            name=str(proposal["name"]), description=str(proposal.get("description") or ""),
            input_schema=dict(proposal["input_schema"]), handler=handler,
        )  # fmt: skip
        server = full_name[len("mcp__") :].split("__")[0]
        return {server: create_sdk_mcp_server("fluidbox-connections", tools=[tool])}

    def _cli_tool(self, slot: str, spec: dict[str, Any]) -> SdkMcpTool[Any]:
        full_name = f"mcp__{slot}__{spec['name']}"
        found = spec.get("input_schema")
        schema: dict[str, Any] = found if isinstance(found, dict) else {"type": "object"}
        local, root = self._settings.local, self._settings.workspace

        async def handler(args: dict[str, Any]) -> dict[str, Any]:
            try:
                result = await asyncio.to_thread(local.call, full_name, args, root)
            except (ToolRefused, StdioMcpError) as exc:
                result = {"content": [{"type": "text", "text": str(exc)}], "isError": True}
            return {"content": result.get("content", []), "is_error": bool(result.get("isError"))}

        return SdkMcpTool(
            name=str(spec["name"]), description=str(spec.get("description") or ""), input_schema=schema,
            handler=handler,
        )  # fmt: skip

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> int:
        settings = self._settings
        self._say("system", f"{HARNESS} runner starting (autonomy={settings.autonomy}, model={settings.model})")
        heartbeat = Heartbeat(
            self._gateway,
            settings.heartbeat_s,
            on_quiesce=self._quiesce,
            on_fatal=self._abort,
            renew_every_s=renewal_interval(settings.token_ttl_s),
        )
        heartbeat.start()
        try:
            summary, failure = self._run_agent()
        except UngovernedTool as exc:
            log(str(exc))
            data = {"message": str(exc), "tool": exc.tool, "tool_call_id": exc.tool_call_id}
            self._gateway.emit("harness", RUN_ERROR, data)
            return EXIT_UNGOVERNED_TOOL
        except AudienceMismatch:
            raise
        except Exception as exc:
            if self._fatal is not None:
                return self._fatal
            traceback.print_exc(file=sys.stderr)
            summary, failure = "", f"{HARNESS} runner failed: {type(exc).__name__}: {exc}"
        finally:
            heartbeat.stop()
        return self._report(summary, failure)

    def _run_agent(self) -> tuple[str, str | None]:
        """The relay, the CLI's environment and the agent loop; everything is torn down on the way out."""
        settings = self._settings
        home = tempfile.mkdtemp(prefix="fluidbox-claude-")
        relay = Relay(settings.socket_path, api_key=self._llm_token, path_prefix=LLM_PATH)
        try:
            relay.start()
            scrub_process_env(cli_env(base_url=relay.url + LLM_PATH, model=settings.model, home=home))
            if settings.brokered:
                names = [f"mcp__{slot}__{t['name']}" for slot, tools in settings.brokered.items() for t in tools]
                self._say("system", "brokered tools mounted: " + ", ".join(names))
            if settings.local.mounted():
                self._say("system", "sandbox tools mounted: " + ", ".join(settings.local.mounted()))
            if settings.deferred:
                names = [DISCOVERY_PREFIX + name for name in DISCOVERY_TOOLS]
                self._say("system", "deferred tool discovery mounted: " + ", ".join(names))
            return asyncio.run(self._drive())
        finally:
            relay.stop()
            shutil.rmtree(home, ignore_errors=True)

    def _report(self, summary: str, failure: str | None) -> int:
        """Post the outcome (once); returns the exit code."""
        if self._fatal is not None:
            return self._fatal
        if failure is not None:
            if self._cancelling():
                # A cancel refuses the pending call and the next model request; that is not the agent failing.
                log("the run is being cancelled: stopping without posting a result")
                return EXIT_OK
            if "wrong_audience" in failure:
                log("the LLM facade refused the llm token with wrong_audience; exiting without a result")
                self._gateway.emit("harness", RUN_ERROR, {"message": f"runner aborted: {failure}"})
                return EXIT_AUDIENCE_MISMATCH
            return report_failure(self._gateway, failure)
        try:
            self._gateway.result("completed", summary)
        except GatewayError as exc:
            log(str(exc))
            return EXIT_AGENT_ERROR
        return EXIT_OK

    async def _drive(self) -> tuple[str, str | None]:
        """Run the agent loop; returns (summary, failure message or None)."""
        settings = self._settings
        # Gateway calls block in threads; parallel tool calls may each wait minutes for a human, which
        # must not starve the narration of threads.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=MAX_GATEWAY_THREADS))
        options = ClaudeAgentOptions(
            model=settings.model,
            system_prompt=settings.system_prompt or {"type": "preset", "preset": "claude_code"},
            cwd=settings.workspace,
            setting_sources=[],
            permission_mode="default",
            max_turns=settings.max_turns,
            hooks={"PreToolUse": [HookMatcher(hooks=[self.pre_tool_use], on_failure="block")]},  # type: ignore[list-item]
            can_use_tool=self.can_use_tool,
            mcp_servers={**self.proposal_servers(), **self.brokered_servers(), **self.local_servers()},
            strict_mcp_config=True,
            env=dict(os.environ),
            stderr=lambda line: log(f"claude: {line}"),
        )
        summary, failure = "", None
        async with ClaudeSDKClient(options) as client:
            await client.query(settings.task or "(no task was given)")
            async for message in client.receive_response():
                if isinstance(message, AssistantMessage):
                    await self._on_assistant(message)
                elif isinstance(message, UserMessage):
                    await self._on_user(message)
                elif isinstance(message, ResultMessage):
                    summary, failure = outcome(message)
        return summary, failure

    async def _on_assistant(self, message: AssistantMessage) -> None:
        for block in message.content:
            if isinstance(block, ToolUseBlock):
                self._witness.saw(block)
            elif isinstance(block, TextBlock) and block.text.strip():
                await asyncio.to_thread(self._say, "assistant", block.text)

    async def _on_user(self, message: UserMessage) -> None:
        if not isinstance(message.content, list):
            return
        for block in message.content:
            if not isinstance(block, ToolResultBlock):
                continue
            self._witness.check(block)
            data = {
                "tool_call_id": block.tool_use_id,
                "tool": self._witness.tools.get(block.tool_use_id, "unknown"),
                "ok": not block.is_error,
                "summary": preview(result_text(block)),
            }
            if block.tool_use_id in self._witness.via:
                data["via"] = self._witness.via[block.tool_use_id]
            await asyncio.to_thread(self._gateway.emit, "agent", TOOL_COMPLETED, data)

    def _cancelling(self) -> bool:
        try:
            return self._gateway.heartbeat() == "quiesce"
        except AudienceMismatch:
            return False

    def _say(self, role: str, text: str) -> None:
        self._gateway.emit("agent" if role == "assistant" else "harness", AGENT_MESSAGE, {"role": role, "text": text})

    # -- ending the process ------------------------------------------------------------------------

    def _quiesce(self) -> None:
        log("quiesce requested: stopping the agent without posting a result")
        self._end(EXIT_OK)

    def _abort(self, code: int) -> None:
        self._fatal = code
        self._end(code)

    def _end(self, code: int) -> None:
        kill_descendants()
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit_process(code)


def run(gateway: ControlPlane, credentials: Credentials, environ: Mapping[str, str]) -> int:
    """Drive the Claude harness end to end; returns the process exit code."""
    try:
        settings = Settings.from_env(environ)
    except ValueError as exc:
        return report_failure(gateway, f"{HARNESS} runner cannot start: {exc}")
    if credentials.llm_token in ("", credentials.control_token, credentials.tool_token):
        # Falling back to another audience's token would hand the CLI (and its shells) a control credential.
        return report_failure(gateway, f"{HARNESS} runner cannot start: no llm-audience token was handed over")
    return ClaudeHarness(gateway, settings, credentials.llm_token).run()


# -- helpers -----------------------------------------------------------------------------------------


def outcome(message: ResultMessage) -> tuple[str, str | None]:
    """(summary, failure) from the CLI's final result message."""
    text = (message.result or "").strip()
    if message.is_error or message.subtype != "success":
        detail = text or "; ".join(message.errors or []) or message.subtype
        status = f" (HTTP {message.api_error_status})" if message.api_error_status else ""
        return "", f"{HARNESS} agent ended with an error{status}: {detail}"
    return text or "(the agent finished without a final message)", None


def result_text(block: ToolResultBlock) -> str:
    content = block.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict) and c.get("type") == "text")


def preview(text: str, limit: int = RESULT_PREVIEW_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def brokered_result(answer: dict[str, Any]) -> dict[str, Any]:
    """The broker's answer as an MCP tool result the model can read."""
    if answer.get("ok"):
        result = answer.get("result") or {}
        content = [c for c in result.get("content", []) if isinstance(c, dict)]
        content = content or [{"type": "text", "text": "(no content)"}]
        return {"content": content, "is_error": bool(result.get("is_error"))}
    if answer.get("denied"):
        text = f"fluidbox denied this call: {answer.get('message') or 'no reason given'}"
    else:
        text = f"brokered execution failed: {answer.get('error') or answer.get('message') or 'no reason given'}"
    return {"content": [{"type": "text", "text": text}], "is_error": True}


def _key(tool_input: Mapping[str, Any]) -> str:
    return json.dumps(tool_input, sort_keys=True, default=str)


def kill_descendants() -> None:
    """SIGKILL every process below this one (the CLI and the shells it started)."""
    me = os.getpid()
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        ppid = int(data[data.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    stack, found = list(children.get(me, [])), []
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
