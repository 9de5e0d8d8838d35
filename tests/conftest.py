"""Shared test setup: a private XDG runtime dir for embedded PostgreSQL's lock files."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="fbx-xdg-"))
