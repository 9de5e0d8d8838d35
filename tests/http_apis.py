"""HTTP APIs the transport tests call: a small FastAPI app of ours (it publishes its own OpenAPI document) and
the Prism mock server (npm ``@stoplight/prism-cli``) serving GitHub's real document.

The FastAPI app records every request it receives (method, path, query, headers, body), so a test can prove
what was sent, what was not, and that it was sent exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from tests.helpers import eventually
from tests.oauth_servers import RESOURCE_SCOPE, AuthorizationServer, JwksTokenVerifier
from tests.openapi_docs import PRISM, github_subset


class Label(BaseModel):
    name: str
    color: str | None = None


class ItemIn(BaseModel):
    title: str
    labels: list[Label] = []


@dataclass
class Seen:
    requests: list[dict[str, Any]] = field(default_factory=list)

    def count(self, path_prefix: str = "") -> int:
        return sum(1 for r in self.requests if r["path"].startswith(path_prefix))


def items_app(seen: Seen, guard: Any = None) -> FastAPI:
    """``guard(request) -> Response | None`` answers instead of the app when it returns a response (OAuth)."""
    app = FastAPI(title="items", version="1.0", servers=[])

    if guard is not None:

        @app.middleware("http")
        async def protect(request: Request, call_next: Any) -> Any:
            refused = await guard(request)
            return refused if refused is not None else await call_next(request)

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Any:
        if request.url.path != "/openapi.json":
            body = await request.body()
            seen.requests.append(
                {
                    "method": request.method,
                    "path": request.scope["raw_path"].decode(),
                    "query": request.url.query,
                    "headers": {k.lower(): v for k, v in request.headers.items()},
                    "body": body.decode(errors="replace"),
                    # The client's address and port: one per TCP connection (reuse shows as a repeated peer).
                    "peer": f"{request.client.host}:{request.client.port}" if request.client else None,
                }
            )
        return await call_next(request)

    @app.get("/stores/{store}/items/{item_id}", operation_id="getItem", tags=["items"])
    async def get_item(
        store: str, item_id: int, verbose: bool = False, x_trace: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Read one item."""
        return {"store": store, "item_id": item_id, "verbose": verbose, "trace": x_trace}

    @app.post("/stores/{store}/items", operation_id="createItem", tags=["items"], status_code=201)
    async def create_item(store: str, item: ItemIn) -> dict[str, Any]:
        """Create an item."""
        return {"store": store, "created": item.model_dump()}

    @app.delete("/stores/{store}/items/{item_id}", operation_id="deleteItem", tags=["admin"])
    async def delete_item(store: str, item_id: int) -> dict[str, Any]:
        """Delete an item."""
        return {"deleted": item_id}

    @app.get("/big", operation_id="bigReport", tags=["reports"], response_class=PlainTextResponse)
    async def big(size: int = 100000) -> str:
        """A large report."""
        return "x" * size

    @app.get("/whoami", operation_id="whoAmI", tags=["reports"])
    async def whoami(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        """Echo the credential back (a careless API): the broker must scrub it."""
        return {"authorization": authorization}

    return app


@dataclass
class RunningApp:
    url: str
    seen: Seen


def oauth_guard(url: str, auth: AuthorizationServer) -> Any:
    """Bearer JWTs that ``auth`` issued for ``url`` only; RFC 9728 metadata and the document stay public."""
    verifier = JwksTokenVerifier(auth.issuer, auth.jwks_uri, url)
    metadata = f"{url}/.well-known/oauth-protected-resource"

    async def guard(request: Request) -> Response | None:
        if request.url.path == "/.well-known/oauth-protected-resource":
            return JSONResponse(
                {"resource": url, "authorization_servers": [auth.issuer], "scopes_supported": [RESOURCE_SCOPE]}
            )
        if request.url.path == "/openapi.json":
            return None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token and await verifier.verify_token(token) is not None:
            return None
        challenge = f'Bearer error="invalid_token", resource_metadata="{metadata}"'
        return JSONResponse({"error": "invalid_token"}, status_code=401, headers={"WWW-Authenticate": challenge})

    return guard


@contextlib.asynccontextmanager
async def serve_items(auth: AuthorizationServer | None = None) -> AsyncIterator[RunningApp]:
    """Our items API on a free loopback port; with ``auth``, only ``auth``'s access tokens for its URL pass."""
    seen = Seen()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    guard = oauth_guard(f"http://127.0.0.1:{port}", auth) if auth is not None else None
    server = uvicorn.Server(uvicorn.Config(items_app(seen, guard), log_level="warning", lifespan="off", http="h11"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    async def up() -> bool:
        try:
            async with httpx.AsyncClient() as c:
                return (await c.get(url + "/openapi.json")).status_code == 200
        except httpx.HTTPError:
            return False

    await eventually(up, timeout=20)
    try:
        yield RunningApp(url, seen)
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)
        sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def prism_github() -> Iterator[tuple[str, dict[str, Any]]]:
    """Prism mocking GitHub's document cut to a few operations: yields (base URL, the document)."""
    doc = github_subset()
    with tempfile.TemporaryDirectory(prefix="fbx-prism-") as tmp:
        spec = Path(tmp) / "github.json"
        spec.write_text(json.dumps(doc))
        port = _free_port()
        proc = subprocess.Popen(
            [str(PRISM), "mock", "-h", "127.0.0.1", "-p", str(port), str(spec)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "NO_COLOR": "1"},
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_http(url + "/", proc)
            yield url, doc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    import time

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prism exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("prism did not start listening within 90 s")
