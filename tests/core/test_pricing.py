"""The price list (core/pricing.yaml) and cost arithmetic."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from core.harnesses import HARNESSES
from core.pricing import PriceTable, PricingError
from core.usage import Usage

TABLE = PriceTable.from_doc(yaml.safe_load((Path(__file__).parents[2] / "core" / "pricing.yaml").read_text()))
MTOK = 1_000_000


@pytest.mark.parametrize(
    ("model", "inp", "out", "read", "write"),
    [
        ("claude-opus-4-8", "5", "25", "0.5", "6.25"),
        ("claude-sonnet-5", "2", "10", "0.2", "2.5"),
        ("claude-sonnet-4-5", "2", "10", "0.2", "2.5"),
        ("claude-haiku-4-5", "1", "5", "0.1", "1.25"),
        ("anthropic/claude-haiku-4-5", "1", "5", "0.1", "1.25"),
        ("gpt-5.4-mini", "0.25", "2", "0.025", "0"),
        ("gpt-5.4", "1.25", "10", "0.125", "0"),
        ("gpt-5.6-sol", "1.25", "10", "0.125", "0"),
    ],
)
def test_the_spec_prices(model: str, inp: str, out: str, read: str, write: str) -> None:
    one = {"input_tokens": MTOK}
    assert TABLE.cost(model, Usage(**one)) == Decimal(inp)
    assert TABLE.cost(model, Usage(output_tokens=MTOK)) == Decimal(out)
    assert TABLE.cost(model, Usage(cache_read_tokens=MTOK)) == Decimal(read)
    assert TABLE.cost(model, Usage(cache_write_tokens=MTOK)) == Decimal(write)


def test_every_harness_model_is_priced_and_replay_is_not() -> None:
    for harness, info in HARNESSES.items():
        for model in info["models"]:
            priced = TABLE.price(model["id"]) is not None
            assert priced == (harness != "replay"), model["id"]
    assert TABLE.cost("replay", Usage(input_tokens=10)) is None
    assert TABLE.cost("llama-3", Usage(input_tokens=10)) is None


def test_a_mixed_response_costs_the_sum_of_its_parts() -> None:
    usage = Usage(input_tokens=1200, output_tokens=300, cache_read_tokens=50_000, cache_write_tokens=4000)
    # haiku: 1/5 per MTok, cache read 0.1, cache write 1.25
    assert TABLE.cost("claude-haiku-4-5", usage) == Decimal("0.0012") + Decimal("0.0015") + Decimal("0.005") + Decimal(
        "0.005"
    )


def test_reservation_estimate_bounds_the_real_cost() -> None:
    estimate = TABLE.estimate("claude-haiku-4-5", 10_000, 2_000)
    assert estimate == Decimal("0.0225")  # 10k at the cache-write rate 1.25 + 2k at 5
    worst = Usage(cache_write_tokens=10_000, output_tokens=2_000)
    assert estimate >= (TABLE.cost("claude-haiku-4-5", worst) or 0)
    assert TABLE.estimate("replay", 1, 1) is None


@pytest.mark.parametrize(
    "doc",
    [
        None,
        {"models": "x"},
        {"models": [{"match": "a*"}]},
        {"models": [{"match": "", "input": 1, "output": 1}]},
        {"models": [{"match": "a*", "input": -1, "output": 1}]},
        {"models": [{"match": "a*", "input": True, "output": 1}]},
    ],
)
def test_a_malformed_price_list_is_refused(doc: object) -> None:
    with pytest.raises(PricingError):
        PriceTable.from_doc(doc)
