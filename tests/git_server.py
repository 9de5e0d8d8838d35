"""A real git smart-HTTP server for tests: git's own ``git http-backend`` (CGI) behind Basic auth, on loopback.

The HTTP layer is Python's ``http.server``; every request that passes the Basic check is handed to
``git http-backend`` exactly as a web server's CGI gateway would (``GIT_PROJECT_ROOT``, ``PATH_INFO``,
``REMOTE_USER``…), and its CGI response is relayed. Requests without the right credential get 401 with a
``WWW-Authenticate`` challenge, as a hosted git service answers (a server made with ``credential=None`` is
public). With ``redirect_to`` it serves nothing and answers every request ``302`` to that origin instead.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class GitServer:
    url: str  # http://127.0.0.1:<port> (repositories live under it: <url>/<name>.git)
    authorized: list[str] = field(default_factory=list)  # request paths served
    refused: list[str] = field(default_factory=list)  # request paths answered 401
    seen_authorization: list[str] = field(default_factory=list)  # every Authorization header received
    requests: list[str] = field(default_factory=list)  # every request path, whatever the answer


def bare_repository(root: Path, name: str, files: dict[str, str]) -> str:
    """A bare repository ``<root>/<name>.git`` with one commit on ``main`` holding ``files``; its commit id."""
    work = root / f"{name}-work"
    work.mkdir(parents=True)
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    env = {
        "PATH": "/usr/bin:/bin",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
    }  # fmt: skip
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "private"]):
        subprocess.run(["git", "-C", str(work), *args], check=True, env=env)
    bare = root / f"{name}.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    head = subprocess.run(["git", "-C", str(bare), "rev-parse", "HEAD"], check=True, capture_output=True, env=env)
    return head.stdout.decode().strip()


def _handler(
    root: Path, expected: str | None, server: GitServer, redirect_to: str | None
) -> type[BaseHTTPRequestHandler]:
    want = None if expected is None else "Basic " + base64.b64encode(expected.encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            given = self.headers.get("Authorization")
            if given is not None:
                server.seen_authorization.append(given)
            path, _, query = self.path.partition("?")
            server.requests.append(path)
            if redirect_to is not None:
                self.send_response(302)
                self.send_header("Location", redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if want is not None and given != want:
                server.refused.append(path)
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="private"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            server.authorized.append(path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            env = {
                "PATH": "/usr/bin:/bin",
                "GIT_PROJECT_ROOT": str(root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "GIT_CONFIG_GLOBAL": "/dev/null",
                "GIT_CONFIG_NOSYSTEM": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_USER": (expected or "anonymous").split(":", 1)[0],
                "REMOTE_ADDR": "127.0.0.1",
                "GATEWAY_INTERFACE": "CGI/1.1",
                "SERVER_PROTOCOL": "HTTP/1.1",
            }
            if self.headers.get("Content-Encoding"):
                env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
            if self.headers.get("Git-Protocol"):
                env["HTTP_GIT_PROTOCOL"] = self.headers["Git-Protocol"]
            done = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env, check=False)
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            if not _:
                head, _, payload = done.stdout.partition(b"\n\n")
            status, headers = 200, []
            for line in head.decode(errors="replace").splitlines():
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.strip().split()[0])
                elif name:
                    headers.append((name.strip(), value.strip()))
            self.send_response(status)
            for name, value in headers:
                if name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


class _ThreadingHTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@contextlib.contextmanager
def git_http_server(
    root: Path, credential: str | None, *, host: str = "127.0.0.1", port: int = 0, redirect_to: str | None = None
) -> Iterator[GitServer]:
    """Serve the bare repositories under ``root`` over smart HTTP on ``host`` (a free port unless ``port``);
    only requests carrying Basic ``credential`` (``user:password``) reach ``git http-backend``, every request
    when ``credential`` is None. With ``redirect_to`` (an origin), every request is answered 302 to it."""
    server = GitServer(url="")
    v6 = ":" in host
    httpd = (_ThreadingHTTPServer6 if v6 else ThreadingHTTPServer)(
        (host, port), _handler(root, credential, server, redirect_to)
    )
    httpd.daemon_threads = True
    server.url = f"http://{f'[{host}]' if v6 else host}:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, name="git-http-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
