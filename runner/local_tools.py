"""Tools that run inside the sandbox and still answer to the gate: sandbox-class capability servers
(stdio MCP, launched here) and sandbox CLI tools (``transport: sandbox_cli``).

Both arrive in ``FLUIDBOX_CAPABILITIES`` as the frozen RunSpec has them (names, schemas, launch lines; never a
URL or a credential). The harness asks ``/permission`` for every ``mcp__<server>__<tool>`` call first (the gate
judges it against the frozen schema), then runs it here:

* a capability server is started once per run, lazily, with ``[command, *args]`` (no shell) in ``/workspace``
  and an environment that holds no token; the sandbox has no network, so neither has the server;
* a sandbox CLI tool runs its declared command with the template's literal arguments and each argument value
  as exactly one argv element: ``; rm -rf /`` stays one literal argument. A value before the template's ``--``
  may not start with ``-`` (no flag the template did not declare).

Standard library only (the runner starts with ``python -S``).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from typing import Any

from runner import tools
from runner.mcp_stdio import StdioMcpError, StdioMcpServer

_PLACEHOLDER = re.compile(r"^\{([a-z_][a-z0-9_]{0,63})\}$")
CLI_DEFAULT_TIMEOUT_S = 60.0


class ToolRefused(ValueError):
    """The call's arguments cannot be turned into a command line (the message says why)."""


class LocalTools:
    """The in-sandbox tools of a run: ``mcp__<name>__<tool>`` → how to run it.

    A plain class, not a dataclass: ``dataclasses`` costs every runner's start a few ms (issue 12).
    """

    def __init__(
        self,
        servers: dict[str, dict[str, Any]] | None = None,
        cli: dict[str, dict[str, dict[str, Any]]] | None = None,
    ) -> None:
        self.servers: dict[str, dict[str, Any]] = {} if servers is None else servers  # sandbox-class servers
        self.cli: dict[str, dict[str, dict[str, Any]]] = {} if cli is None else cli  # slot → tool → declaration
        self._running: dict[str, StdioMcpServer] = {}

    @classmethod
    def from_capabilities(cls, raw: str | None) -> LocalTools:
        """Parse ``FLUIDBOX_CAPABILITIES``; servers of other classes are someone else's (the broker's).

        Raises:
            ValueError: the variable is set but not the documented shape.
        """
        found = cls()
        if not raw or not raw.strip():
            return found
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"FLUIDBOX_CAPABILITIES is not JSON: {exc}") from None
        servers = doc.get("servers") if isinstance(doc, dict) else None
        if not isinstance(servers, list):
            raise ValueError("FLUIDBOX_CAPABILITIES has no servers list")
        for server in servers:
            if not isinstance(server, dict):
                continue
            name, kind = server.get("name"), server.get("class")
            tool_list = server.get("tools") or []
            if not isinstance(name, str) or not isinstance(tool_list, list):
                raise ValueError("FLUIDBOX_CAPABILITIES: a server needs a name and a tools list")
            by_name = {t["name"]: t for t in tool_list if isinstance(t, dict) and isinstance(t.get("name"), str)}
            if kind == "sandbox":
                if not isinstance(server.get("command"), str):
                    raise ValueError(f"FLUIDBOX_CAPABILITIES: sandbox server {name!r} has no command")
                found.servers[name] = {
                    "command": server["command"],
                    "args": [str(a) for a in server.get("args") or []],
                    "tools": by_name,
                }
            elif kind == "sandbox_cli":
                found.cli[name] = by_name
        return found

    def owns(self, tool: str) -> bool:
        """Whether ``tool`` (``mcp__<server>__<tool>``) runs here."""
        split = _split(tool)
        if split is None:
            return False
        server, name = split
        return name in self.servers.get(server, {}).get("tools", {}) or name in self.cli.get(server, {})

    def mounted(self) -> list[str]:
        names = [f"mcp__{s}__{t}" for s, spec in self.servers.items() for t in spec["tools"]]
        return names + [f"mcp__{s}__{t}" for s, decls in self.cli.items() for t in decls]

    def call(self, tool: str, arguments: dict[str, Any], root: str) -> dict[str, Any]:
        """Run one (already allowed) call; returns an MCP tool result (``content``, ``isError``).

        Raises:
            ToolRefused: the arguments cannot be placed on the command line.
            StdioMcpError: the capability server failed.
        """
        split = _split(tool)
        if split is None or not self.owns(tool):
            raise ToolRefused(f"{tool} is not a tool of this sandbox")
        server, name = split
        if server in self.cli:
            code, output = run_cli(self.cli[server][name], arguments, root)
            text = output.rstrip("\n") if code == 0 else f"{output.rstrip()}\n→ exit {code}".lstrip()
            return {"content": [{"type": "text", "text": text}], "isError": code != 0}
        running = self._running.get(server)
        if running is None:
            spec = self.servers[server]
            running = StdioMcpServer(server, spec["command"], spec["args"], cwd=root, env=tools.child_env(root))
            self._running[server] = running
        return running.call_tool(name, arguments)

    def stdio_configs(self, root: str) -> dict[str, dict[str, Any]]:
        """The capability servers as the Claude Code CLI's ``mcpServers`` entries (stdio, launched by it)."""
        return {
            name: {"type": "stdio", "command": spec["command"], "args": spec["args"], "env": tools.child_env(root)}
            for name, spec in self.servers.items()
        }

    def close(self) -> None:
        for server in self._running.values():
            server.close()
        self._running.clear()


def build_argv(decl: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """The command line of one sandbox CLI call: literals as declared, each value exactly one element.

    Raises:
        ToolRefused: an unknown argument, a non-scalar value, a NUL, or a value before ``--`` that looks
            like a flag.
    """
    template = [str(a) for a in decl.get("args") or []]
    declared = {m.group(1) for a in template if (m := _PLACEHOLDER.match(a))}
    unknown = sorted(set(arguments) - declared)
    if unknown:
        raise ToolRefused(f"undeclared argument(s): {', '.join(unknown)}")
    argv = [str(decl["command"])]
    after_separator = False
    for element in template:
        match = _PLACEHOLDER.match(element)
        if match is None:
            argv.append(element)
            after_separator = after_separator or element == "--"
            continue
        key = match.group(1)
        if key not in arguments:
            continue  # an optional argument the call left out
        value = arguments[key]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ToolRefused(f"argument {key!r} must be a string or a number")
        text = str(value)
        if "\x00" in text:
            raise ToolRefused(f"argument {key!r} contains a NUL character")
        if not after_separator and text.startswith("-"):
            raise ToolRefused(f"argument {key!r} may not start with '-' (it would be read as an option)")
        argv.append(text)
    return argv


def run_cli(decl: Mapping[str, Any], arguments: Mapping[str, Any], root: str) -> tuple[int, str]:
    """Execute a sandbox CLI tool without a shell in ``root``; ``(exit code, merged output capped at 16 KiB)``."""
    argv = build_argv(decl, arguments)
    timeout = float(decl.get("timeout_s") or CLI_DEFAULT_TIMEOUT_S)
    try:
        proc = subprocess.run(
            argv,
            cwd=root,
            env=tools.child_env(root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        partial = exc.output or b""
        return tools.TIMEOUT_EXIT_CODE, tools._cap(partial, len(partial)) + f"\n[timed out after {timeout:g}s]"
    except OSError as exc:
        return 127, f"cannot run {argv[0]}: {exc.strerror or exc}"
    code = proc.returncode
    return (128 - code if code < 0 else code), tools._cap(proc.stdout, len(proc.stdout))


def _split(tool: str) -> tuple[str, str] | None:
    if not tool.startswith("mcp__"):
        return None
    server, sep, name = tool[5:].partition("__")
    return (server, name) if sep and server and name else None


__all__ = ["LocalTools", "StdioMcpError", "ToolRefused", "build_argv", "run_cli"]
