"""The settings table is the operator's contract: every variable ``docs/operations.md`` names exists in the
settings model (or is one of the few read straight from the environment by a process), and every setting in
the model is documented there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from config.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "operations.md").read_text()
# Read with os.environ by one process, not by the settings model: each must appear in that process's source.
PROCESS_ENVIRONMENT = {
    "FLUIDBOX_LOG_LEVEL": ("api/serve.py", "worker.py"),
    "FLUIDBOX_URL": ("cli/client.py",),
    "FLUIDBOX_WORKER_PROCESSES": ("cli/main.py",),
    "FLUIDBOX_API_PROCESSES": ("cli/main.py",),
    "FLUIDBOX_DESTROY_SANDBOXES_ON_STOP": ("cli/main.py",),
}


def env_names() -> set[str]:
    names = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        names.add(alias if isinstance(alias, str) else f"FLUIDBOX_{name.upper()}")
    return names


def test_every_variable_the_operations_guide_names_exists() -> None:
    named = set(re.findall(r"\bFLUIDBOX_[A-Z0-9_]*[A-Z0-9]\b", DOC))
    unknown = named - env_names() - set(PROCESS_ENVIRONMENT)
    assert not unknown, f"docs/operations.md names variables nothing reads: {sorted(unknown)}"
    # Abbreviations such as `FLUIDBOX_X_CERT`/`_KEY` hide a name from this check: spell every variable out.
    assert not re.findall(r"`_[A-Z][A-Z0-9_]*`", DOC)


def test_every_setting_is_documented() -> None:
    missing = {name for name in env_names() if f"`{name}`" not in DOC}
    assert not missing, f"settings with no entry in docs/operations.md: {sorted(missing)}"


def test_the_variables_read_from_the_environment_are_read_where_the_guide_says() -> None:
    for name, files in PROCESS_ENVIRONMENT.items():
        assert f"`{name}`" in DOC, name
        for file in files:
            assert name in (ROOT / file).read_text(), (name, file)


def test_the_sandbox_group_gathers_the_flat_variables_and_shares_their_defaults(monkeypatch: Any) -> None:
    from config.settings import SandboxSettings

    assert Settings().sandbox.model_dump(exclude={"state_dir"}) == SandboxSettings().model_dump(exclude={"state_dir"})
    monkeypatch.setenv("FLUIDBOX_SANDBOX_MEMORY_MB", "512")
    monkeypatch.setenv("FLUIDBOX_KUBE_NAMESPACE", "agents")
    monkeypatch.setenv("FLUIDBOX_SANDBOX_PROVIDER", "kubernetes")
    group = Settings().sandbox
    assert (group.memory_mb, group.kube_namespace, group.provider) == (512, "agents", "kubernetes")
