"""What the service tests share beyond tests/conftest.py (which starts the real OAuth servers): a sealer."""

from __future__ import annotations

import pytest

from integrations.sealing import Sealer, generate_key, parse_key


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(parse_key(generate_key()))
