"""How the CLI prints runs: a run waiting for a connection says what a person must do."""

from __future__ import annotations

from cli.render import run_line


def test_a_parked_run_line_names_its_slot_reason_and_how_to_connect() -> None:
    run = {
        "id": "r1",
        "status": "waiting_for_connection",
        "task": "t",
        "run_spec": {"agent_name": "a"},
        "pending_action": {"slot": "calc", "reason": "the bound connection is revoked", "how": "PUT …/credential"},
    }
    line = run_line(run)
    assert "waiting_for_connection" in line
    assert "waits for slot 'calc': the bound connection is revoked — PUT …/credential" in line


def test_a_running_run_is_one_line() -> None:
    run = {"id": "r2", "status": "running", "task": "t", "run_spec": {"agent_name": "a"}, "pending_action": None}
    assert "\n" not in run_line(run)
