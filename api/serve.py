"""Serve the API on TCP (people, CLI) and on the gateway Unix socket (sandboxes), in one process."""

from __future__ import annotations

import logging
import os
import socket

import uvicorn

from api.app import create_app
from config.settings import get_settings
from config.temporal import TemporalSettingsError, check_temporal_settings


def _sockets(host: str, port: int, uds: str) -> list[socket.socket]:
    # IPPROTO_TCP explicitly: asyncio enables TCP_NODELAY only on sockets created with it, and without
    # it every response waits ~40 ms for the client's delayed ACK between headers and body.
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((host, port))
    # The socket's directory is bound into every sandbox, so it must hold nothing but the socket.
    directory = os.path.dirname(uds)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    others = [name for name in os.listdir(directory) if name != os.path.basename(uds)]
    if others:
        raise SystemExit(
            f"the gateway socket directory {directory} must contain only the socket (found {others[:3]}); "
            "point FLUIDBOX_GATEWAY_SOCKET into a directory of its own"
        )
    if os.path.exists(uds):
        os.unlink(uds)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(uds)
    # Sandboxes run as an unprivileged uid: the socket must be connectable by them.
    os.chmod(uds, 0o666)
    return [tcp, unix]


def main() -> None:
    logging.basicConfig(level=os.environ.get("FLUIDBOX_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    try:
        check_temporal_settings(settings)
    except TemporalSettingsError as exc:
        raise SystemExit(f"fluidbox api: {exc}") from None
    host, port = settings.host_port
    sockets = _sockets(host, port, str(settings.socket_path))
    # uvloop (loop="auto" picks it) and httptools, both installed with uvicorn[standard]; the facade relies on
    # httptools' send semantics (a silent no-op after a disconnect, RuntimeError on a short body). Server.run
    # applies the loop choice, where asyncio.run(server.serve()) would silently keep the stock loop.
    app = create_app(settings)
    config = uvicorn.Config(
        app, loop="auto", http="httptools", log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()
