"""A small MCP client over stdio (newline-delimited JSON-RPC 2.0), standard library only.

The replay harness uses it to speak to the sandbox-class capability servers a run pinned: each server
is started lazily inside the sandbox (no shell: ``[command, *args]``), in ``/workspace``, with an
allow-listed environment that holds no token, and kept for the rest of the run. The Claude harness
hands the same launch lines to the Claude Code CLI, which speaks MCP itself.

Every call is bounded: a server that does not answer within the timeout is killed and the call fails.
Requests the server sends to us (``ping``, ``roots/list``, sampling) are answered with "method not
found" except ``ping``; notifications are ignored.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

PROTOCOL_VERSION = "2025-06-18"
CLIENT_INFO = {"name": "fluidbox-runner", "version": "1"}
DEFAULT_TIMEOUT_S = 60.0
MAX_LINE_BYTES = 8 * 1024 * 1024


class StdioMcpError(RuntimeError):
    """The server could not be started, broke the protocol, answered with an error or timed out."""


class StdioMcpServer:
    """One MCP server process; :meth:`call_tool` is serialized (one request in flight at a time)."""

    def __init__(
        self,
        name: str,
        command: str,
        args: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.name = name
        self._argv = [command, *args]
        self._cwd = cwd
        self._env = dict(env)
        self._timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._next_id = 0
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            self._proc = subprocess.Popen(
                self._argv,
                cwd=self._cwd,
                env=self._env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: close() kills its children too
            )
        except OSError as exc:
            raise StdioMcpError(f"cannot start MCP server {self.name!r}: {exc}") from None
        assert self._proc.stdout is not None
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True, name=f"mcp-{self.name}").start()
        result = self._request(
            "initialize",
            {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO},
        )
        if not isinstance(result, dict) or "protocolVersion" not in result:
            raise StdioMcpError(f"MCP server {self.name!r} answered initialize without a protocol version")
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    # -- calls -------------------------------------------------------------------------------------

    def call_tool(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``tools/call``; returns the MCP result (``content``, ``isError``…).

        Raises:
            StdioMcpError: the server failed to start, died, timed out or answered a JSON-RPC error
                (the server is closed then, and started again on the next call).
        """
        with self._lock:
            try:
                if self._proc is None:
                    self._start()
                result = self._request("tools/call", {"name": tool, "arguments": arguments})
            except StdioMcpError:
                self.close()
                raise
        if not isinstance(result, dict):
            raise StdioMcpError(f"MCP server {self.name!r} answered tools/call with a non-object")
        return result

    def _request(self, method: str, params: dict[str, Any]) -> Any:
        self._next_id += 1
        rid = self._next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            try:
                line = self._lines.get(timeout=self._timeout_s)
            except queue.Empty:
                raise StdioMcpError(
                    f"MCP server {self.name!r} did not answer {method} within {self._timeout_s:g}s"
                ) from None
            if line is None:
                raise StdioMcpError(f"MCP server {self.name!r} exited during {method}")
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue  # not a protocol line (a server printing to stdout by mistake)
            if not isinstance(message, dict):
                continue
            if "method" in message:  # a request or notification from the server
                if "id" in message:
                    self._answer(message)
                continue
            if message.get("id") != rid:
                continue
            if "error" in message:
                error = message["error"] if isinstance(message["error"], dict) else {}
                raise StdioMcpError(f"MCP server {self.name!r}: {error.get('message') or 'error'} ({method})")
            return message.get("result")

    def _answer(self, request: dict[str, Any]) -> None:
        if request.get("method") == "ping":
            self._send({"jsonrpc": "2.0", "id": request["id"], "result": {}})
        else:
            self._send(
                {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "method not found"}}
            )

    def _send(self, message: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise StdioMcpError(f"MCP server {self.name!r} is not running")
        try:
            proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            proc.stdin.flush()
        except OSError as exc:
            raise StdioMcpError(f"MCP server {self.name!r} stopped reading: {exc}") from None

    def _read(self, stream: IO[bytes]) -> None:
        try:
            while True:
                line = stream.readline(MAX_LINE_BYTES)
                if not line:
                    break
                if line.strip():
                    self._lines.put(line)
        except (OSError, ValueError):
            pass
        finally:
            self._lines.put(None)


def result_text(result: dict[str, Any]) -> str:
    """The text content of an MCP tool result (what a harness narrates)."""
    texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict) and c.get("type") == "text"]
    return "\n".join(t for t in texts if t) or "(no text content)"
