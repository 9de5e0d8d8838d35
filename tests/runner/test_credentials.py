"""The runner takes its tokens from the private secrets file and deletes it before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.contract import ENV_SECRETS_FILE, ENV_SESSION_ID, ENV_SESSION_TOKEN, ENV_TOOL_TOKEN
from runner.gateway import MissingEnv, take_credentials


def test_tokens_come_from_the_secrets_file_which_is_then_deleted(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({ENV_SESSION_TOKEN: "fbx_sess_control", ENV_TOOL_TOKEN: "fbx_sess_tool"}))
    environ = {ENV_SESSION_ID: "run-1", ENV_SECRETS_FILE: str(secrets)}
    creds = take_credentials(environ)
    assert (creds.control_token, creds.tool_token) == ("fbx_sess_control", "fbx_sess_tool")
    assert not secrets.exists()
    assert ENV_SECRETS_FILE not in environ


def test_an_unreadable_secrets_file_is_a_missing_environment_error(tmp_path: Path) -> None:
    bad = tmp_path / "secrets.json"
    bad.write_text("not json")
    with pytest.raises(MissingEnv, match="cannot read the secrets file"):
        take_credentials({ENV_SESSION_ID: "run-1", ENV_SECRETS_FILE: str(bad)})
    assert not bad.exists(), "a bad secrets file is deleted too"
