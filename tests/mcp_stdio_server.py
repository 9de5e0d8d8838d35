"""A real MCP server over stdio (the ``mcp`` SDK's ``MCPServer``), for sandbox-class capability tests.

Tests copy this file into a run's workspace and publish a bundle whose server runs it with the
interpreter of this virtualenv, so it starts *inside* the sandbox. Its ``probe`` tool reports what the
server sees from there: its working directory, whether a TCP connection to a port on the host's loopback
succeeds (the sandbox has no network, so it must not), and whether any FLUIDBOX variable or run token
(``fbx_…``) reached its environment.

Run directly: ``python tests/mcp_stdio_server.py`` speaks MCP on stdin/stdout.
"""

from __future__ import annotations

import os
import socket

from mcp.server.mcpserver import MCPServer

server = MCPServer("fluidbox-test-stdio", version="0.1")


@server.tool(description="Report the working directory, network reachability and token exposure; echo text.")
def probe(text: str, port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            network = "reachable"
    except OSError:
        network = "unreachable"
    tokens = sorted(k for k, v in os.environ.items() if k.startswith("FLUIDBOX") or "fbx_" in v)
    return f"cwd={os.getcwd()} network={network} tokens={','.join(tokens) or 'none'} text={text}"


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


if __name__ == "__main__":
    server.run("stdio")
