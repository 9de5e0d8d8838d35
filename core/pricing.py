"""Model prices and the cost of a response. Pure: the price list arrives as a parsed document.

The list itself is the data file ``core/pricing.yaml``, read by whoever wires the facade (``db.usage``),
because ``core`` does no I/O and imports no YAML parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fnmatch import fnmatchcase
from typing import Any

from core.usage import Usage

MTOK = Decimal(1_000_000)


class PricingError(ValueError):
    """The price list is malformed (raised at load, never while metering)."""


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal

    def cost(self, usage: Usage) -> Decimal:
        total = (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_tokens * self.cache_read
            + usage.cache_write_tokens * self.cache_write
        )
        return total / MTOK


def _number(rule: dict[str, Any], key: str, default: float | None = None) -> Decimal:
    value = rule.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise PricingError(f"pricing rule {rule.get('match')!r}: '{key}' must be a non-negative number")
    return Decimal(str(value))


@dataclass(frozen=True)
class PriceTable:
    rules: tuple[tuple[tuple[str, ...], Price], ...]

    @classmethod
    def from_doc(cls, doc: Any) -> PriceTable:
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
            raise PricingError("the price list needs a 'models' list")
        rules = []
        for rule in doc["models"]:
            if not isinstance(rule, dict):
                raise PricingError("each pricing rule is a mapping")
            match = rule.get("match")
            patterns = (match,) if isinstance(match, str) else tuple(match) if isinstance(match, list) else ()
            if not patterns or not all(isinstance(p, str) and p for p in patterns):
                raise PricingError(f"pricing rule {match!r}: 'match' must be a pattern or a list of patterns")
            inp = _number(rule, "input")
            price = Price(
                input=inp,
                output=_number(rule, "output"),
                cache_read=inp * _number(rule, "cache_read", 1.0),
                cache_write=inp * _number(rule, "cache_write", 1.0),
            )
            rules.append((tuple(p.lower() for p in patterns), price))
        return cls(tuple(rules))

    def price(self, model: str) -> Price | None:
        name = model.lower()
        for patterns, price in self.rules:
            if any(fnmatchcase(name, p) for p in patterns):
                return price
        return None

    def cost(self, model: str, usage: Usage) -> Decimal | None:
        """USD for this usage, or ``None`` when the model is unpriced."""
        price = self.price(model)
        return None if price is None else price.cost(usage)

    def estimate(self, model: str, input_tokens: int, output_tokens: int) -> Decimal | None:
        """A reservation's cost bound: input at the dearest input-side rate, output at the output rate."""
        price = self.price(model)
        if price is None:
            return None
        return (input_tokens * max(price.input, price.cache_write) + output_tokens * price.output) / MTOK
