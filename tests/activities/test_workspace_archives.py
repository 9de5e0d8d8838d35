"""Workspace archives, the form a tree takes over the runner plane: what survives the trip, what never lands."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from activities import workspace
from core import wire
from runner import remote

MIB = 1024 * 1024


def test_a_tree_survives_the_round_trip_with_its_links_and_modes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "app.py").write_text("print('hi')\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("pkg/app.py")
    os.mkfifo(src / "pipe")  # special files do not travel
    data = workspace.pack(src, MIB)
    dest = tmp_path / "dest"
    assert workspace.unpack(data, dest, MIB) == []
    assert (dest / "pkg" / "app.py").read_text() == "print('hi')\n"
    assert os.readlink(dest / "link") == "pkg/app.py"
    assert (dest / "run.sh").stat().st_mode & 0o111
    assert not (dest / "pipe").exists()


def _archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, body in members:
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body else None)
    return buf.getvalue()


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, b""


def test_an_uploaded_state_cannot_write_outside_its_tree(tmp_path: Path) -> None:
    """A sandbox controls what it uploads: escapes are skipped and named, the rest lands."""
    dest = tmp_path / "run" / "workspace"
    setuid = tarfile.TarInfo("tool")
    setuid.mode = 0o4755
    data = _archive(
        [
            (tarfile.TarInfo("ok.txt"), b"fine"),
            (tarfile.TarInfo("../escaped.txt"), b"out"),
            (tarfile.TarInfo("/etc/planted"), b"abs"),
            _link("passwd", "/etc/passwd"),
            _link("up", "../../.."),
            (setuid, b"#!/bin/sh\n"),
        ]
    )
    skipped = workspace.unpack(data, dest, MIB)
    assert (dest / "ok.txt").read_text() == "fine"
    assert not (tmp_path / "run" / "escaped.txt").exists() and not (dest / "passwd").exists()
    assert {s.split(":")[0] for s in skipped} == {"../escaped.txt", "passwd", "up"}
    assert (dest / "etc" / "planted").read_text() == "abs"  # an absolute name lands inside, made relative
    assert not (dest / "tool").stat().st_mode & 0o4000  # the setuid bit does not survive


def test_an_archive_that_expands_past_its_limit_is_refused(tmp_path: Path) -> None:
    data = _archive([(tarfile.TarInfo("big"), b"\0" * (2 * MIB))])
    assert len(data) < MIB
    with pytest.raises(workspace.WorkspaceError, match="expands past"):
        workspace.unpack(data, tmp_path / "dest", MIB)
    with pytest.raises(workspace.WorkspaceError, match="cannot be read"):
        workspace.unpack(b"not a tar", tmp_path / "dest", MIB)
    with pytest.raises(workspace.WorkspaceError, match="over the"):
        workspace.pack(tmp_path, 10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """An HTTP server answering the workspace download with a fixed archive."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "README").write_text("hello\n")
    data = workspace.pack(src, MIB)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", data
    finally:
        server.shutdown()
        server.server_close()


def test_the_runner_unpacks_only_the_archive_its_spec_names(served: tuple[str, bytes], tmp_path: Path) -> None:
    url, data = served
    env = {wire.ENV_CONTROL_URL: url, wire.ENV_SESSION_ID: "r", wire.ENV_WORKSPACE: str(tmp_path / "ws")}
    (tmp_path / "ws").mkdir()
    with pytest.raises(remote.RemoteError, match="digest mismatch"):
        remote.fetch_workspace({**env, wire.ENV_WORKSPACE_SHA256: "0" * 64}, "token")
    assert list((tmp_path / "ws").iterdir()) == []  # nothing of the unverified bytes landed
    size = remote.fetch_workspace({**env, wire.ENV_WORKSPACE_SHA256: hashlib.sha256(data).hexdigest()}, "token")
    assert size == len(data) and (tmp_path / "ws" / "README").read_text() == "hello\n"
