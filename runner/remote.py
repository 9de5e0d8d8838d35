"""A runner off the worker's host (a Kubernetes Pod): bootstrap exchange and workspace transfer.

Standard library only, like the rest of the runner's start path. The Pod holds no run token: it holds a
one-time bootstrap credential (a Secret mount) that :func:`exchange` spends for the run's tokens, kept in
this process's memory. The workspace arrives as an archive whose sha256 the Pod's spec names
(:func:`fetch_workspace` refuses any other bytes) and leaves as one (:func:`upload_workspace`), before
the result, so the control plane can compute the diff.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from core.wire import (
    ENV_BOOTSTRAP_FILE,
    ENV_CONTROL_URL,
    ENV_LLM_TOKEN,
    ENV_SESSION_ID,
    ENV_SESSION_TOKEN,
    ENV_TOOL_TOKEN,
    ENV_WORKSPACE,
    ENV_WORKSPACE_REF,
    ENV_WORKSPACE_SHA256,
    SANDBOX_WORKSPACE,
    WORKSPACE_DIGEST_HEADER,
)

TIMEOUT_SECS = 60.0
ATTEMPTS = 5
MAX_EXPANDED_BYTES = 8 * 64 * 1024 * 1024


class RemoteError(Exception):
    """The exchange or a transfer failed for good (the runner exits; the control plane says why)."""


@dataclass(frozen=True)
class Exchanged:
    tokens: dict[str, str]  # by the environment names take_credentials knows (never put in the environment)
    workspace_token: str


def _request(
    base_url: str, method: str, path: str, token: str, body: bytes | None = None, headers: Mapping[str, str] = {}
) -> tuple[int, bytes, dict[str, str]]:
    parts = urlsplit(base_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    last = ""
    for attempt in range(ATTEMPTS):
        conn = cls(parts.hostname or "fluidbox", parts.port, timeout=TIMEOUT_SECS)
        try:
            conn.request(
                method,
                parts.path.rstrip("/") + path,
                body=body,
                headers={"authorization": f"Bearer {token}", "connection": "close", **headers},
            )
            answer = conn.getresponse()
            data = answer.read()
            if answer.status < 500 and answer.status != 429:
                return answer.status, data, {k.lower(): v for k, v in answer.getheaders()}
            last = f"HTTP {answer.status}"
        except (OSError, http.client.HTTPException) as exc:
            last = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        time.sleep(min(8.0, 0.5 * 2**attempt))
    raise RemoteError(f"{method} {path}: control plane unreachable ({last})")


def _error(status: int, data: bytes) -> str:
    try:
        body = json.loads(data)
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return f"HTTP {status}: {body['error']}"
    except ValueError:
        pass
    return f"HTTP {status}"


def _prefix(environ: Mapping[str, str]) -> str:
    return f"/internal/sessions/{quote(environ.get(ENV_SESSION_ID, ''), safe='')}"


def exchange(environ: Mapping[str, str]) -> Exchanged:
    """Spend the bootstrap credential for the run's tokens (once: the server burns it).

    Raises:
        RemoteError: no credential file, or the control plane refused or could not be reached.
    """
    path = environ.get(ENV_BOOTSTRAP_FILE, "")
    try:
        credential = Path(path).read_text().strip()
    except OSError as exc:
        raise RemoteError(f"cannot read the bootstrap credential at {path!r}: {exc}") from None
    base = environ.get(ENV_CONTROL_URL, "")
    status, data, _ = _request(base, "POST", _prefix(environ) + "/bootstrap", credential)
    del credential
    if status != 200:
        raise RemoteError(f"bootstrap exchange refused: {_error(status, data)}")
    body = json.loads(data)
    tokens = {ENV_SESSION_TOKEN: body["control"], ENV_TOOL_TOKEN: body["tool"]}
    if body.get("llm"):
        tokens[ENV_LLM_TOKEN] = body["llm"]
    return Exchanged(tokens=tokens, workspace_token=body["workspace"])


def fetch_workspace(environ: Mapping[str, str], token: str) -> int:
    """Download the prepared workspace, check its digest against the spec's, unpack it; returns its size.

    Raises:
        RemoteError: refused, unreachable, or bytes whose sha256 is not the one the spec names.
    """
    want = environ.get(ENV_WORKSPACE_SHA256, "").lower()
    ref = environ.get(ENV_WORKSPACE_REF) or _prefix(environ) + "/workspace"
    status, data, _ = _request(environ.get(ENV_CONTROL_URL, ""), "GET", ref, token)
    if status != 200:
        raise RemoteError(f"workspace download refused: {_error(status, data)}")
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise RemoteError(f"workspace archive digest mismatch: expected {want}, got {got}")
    dest = Path(environ.get(ENV_WORKSPACE) or SANDBOX_WORKSPACE)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = tar.getmembers()
            if sum(m.size for m in members) > MAX_EXPANDED_BYTES:
                raise RemoteError("the workspace archive expands past its limit")
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise RemoteError(f"cannot unpack the workspace archive: {exc}") from None
    return len(data)


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if not (info.isfile() or info.isdir() or info.issym()):
        return None  # fifos, sockets, devices do not travel
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def upload_workspace(environ: Mapping[str, str], token: str) -> None:
    """Send the workspace's final state (links as links, never followed).

    Raises:
        RemoteError: refused or unreachable.
    """
    tree = Path(environ.get(ENV_WORKSPACE) or SANDBOX_WORKSPACE)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(os.listdir(tree)):
            tar.add(tree / entry, arcname=entry, recursive=True, filter=_normalized)
    data = buf.getvalue()
    headers = {"content-type": "application/gzip", WORKSPACE_DIGEST_HEADER: hashlib.sha256(data).hexdigest()}
    ref = environ.get(ENV_WORKSPACE_REF) or _prefix(environ) + "/workspace"
    status, body, _ = _request(environ.get(ENV_CONTROL_URL, ""), "PUT", ref, token, data, headers)
    if status != 200:
        raise RemoteError(f"workspace upload refused: {_error(status, body)}")
