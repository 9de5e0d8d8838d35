"""The runner takes its tokens from an inherited pipe, reads it to its end and closes it before anything runs."""

from __future__ import annotations

import json
import os

import pytest

from core.contract import ENV_SECRETS_FD, ENV_SESSION_ID, ENV_SESSION_TOKEN, ENV_TOOL_TOKEN
from runner.gateway import MissingEnv, take_credentials


def _pipe_holding(data: bytes) -> int:
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    return read_end


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_tokens_come_from_the_secrets_pipe_which_is_then_closed() -> None:
    fd = _pipe_holding(json.dumps({ENV_SESSION_TOKEN: "fbx_sess_control", ENV_TOOL_TOKEN: "fbx_sess_tool"}).encode())
    environ = {ENV_SESSION_ID: "run-1", ENV_SECRETS_FD: str(fd)}
    creds = take_credentials(environ)
    assert (creds.control_token, creds.tool_token) == ("fbx_sess_control", "fbx_sess_tool")
    assert not _is_open(fd), "nothing the runner starts may inherit the pipe"
    assert ENV_SECRETS_FD not in environ


def test_unreadable_secrets_are_a_missing_environment_error_and_the_pipe_is_closed_too() -> None:
    fd = _pipe_holding(b"not json")
    with pytest.raises(MissingEnv, match="cannot read the secrets from descriptor"):
        take_credentials({ENV_SESSION_ID: "run-1", ENV_SECRETS_FD: str(fd)})
    assert not _is_open(fd)
    with pytest.raises(MissingEnv, match="not a descriptor number"):
        take_credentials({ENV_SESSION_ID: "run-1", ENV_SECRETS_FD: "four"})
