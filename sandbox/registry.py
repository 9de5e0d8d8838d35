"""Execution providers by name: plain dispatch, because the set is small and fixed at build time."""

from __future__ import annotations

from core.ports import ExecutionProvider
from sandbox.bubblewrap import BubblewrapProvider

KNOWN_PROVIDERS = ("bwrap",)


def make_provider(name: str, *, bwrap_path: str = "bwrap") -> ExecutionProvider:
    """Build the execution provider called ``name``.

    Raises:
        ValueError: no provider has that name.
    """
    if name == "bwrap":
        return BubblewrapProvider(bwrap_path=bwrap_path)
    raise ValueError(f"unknown execution provider {name!r}; known: {', '.join(KNOWN_PROVIDERS)}")
