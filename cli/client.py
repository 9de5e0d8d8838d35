"""A small HTTP client for the CLI: the CLI talks to the API only, never to the database or Temporal."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


class CliError(Exception):
    """One readable line for the user; ``code`` is the exit status (2: the input was bad)."""

    def __init__(self, message: str, *, code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        """The API's HTTP status when the API refused the request."""


def home() -> Path:
    return Path(os.environ.get("FLUIDBOX_HOME", ".fluidbox"))


def api_url() -> str:
    if url := os.environ.get("FLUIDBOX_URL"):
        return url.rstrip("/")
    return "http://" + os.environ.get("FLUIDBOX_BIND", "127.0.0.1:8787")


def token() -> str:
    if tok := os.environ.get("FLUIDBOX_ADMIN_TOKEN"):
        return tok
    path = home() / "admin-token"
    if path.exists():
        return path.read_text().strip()
    raise CliError(f"no admin token: set FLUIDBOX_ADMIN_TOKEN or start the stack (`fluidbox up` writes {path})")


class Api:
    def __init__(self, base_url: str | None = None, admin_token: str | None = None, timeout: float = 30) -> None:
        self.base_url = base_url or api_url()
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"authorization": f"Bearer {admin_token or token()}"},
            timeout=timeout,
        )

    def request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            r = self._client.request(method, path, json=body)
        except httpx.ConnectError:
            raise CliError(f"cannot reach the fluidbox API at {self.base_url} (is `fluidbox up` running?)") from None
        except httpx.HTTPError as exc:
            raise CliError(f"request to {self.base_url}{path} failed: {exc}") from None
        if r.status_code >= 400:
            try:
                message = r.json().get("error", r.text)
            except ValueError:
                message = r.text
            raise CliError(f"{method} {path} → {r.status_code}: {message}", status=r.status_code)
        return r.json()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def stream(self, run_id: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """Follow a run's ledger over SSE, resuming after ``after``."""
        headers = {"last-event-id": str(after)}
        try:
            with self._client.stream(
                "GET", f"/v1/sessions/{run_id}/events/stream", headers=headers, timeout=httpx.Timeout(30, read=60)
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise CliError(f"stream → {r.status_code}: {r.text}")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        yield json.loads(line[6:])
        except httpx.ConnectError:
            raise CliError(f"cannot reach the fluidbox API at {self.base_url}") from None
