"""Real OpenAPI documents for the transport tests: GitHub's own (npm ``@octokit/openapi``), cut to a few operations.

The whole document is 13 MB and slow for the mock server to load; :func:`github_subset` keeps the chosen
operations and only the components they reach (following ``$ref`` names to collect them, without resolving
anything: the document the server and the broker see is still GitHub's, refs and all).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GITHUB_DOCUMENT = ROOT / ".node/node_modules/@octokit/openapi/generated/api.github.com.json"
PRISM = ROOT / ".node/node_modules/.bin/prism"
GITHUB_OPERATIONS = ("repos/get", "issues/list-for-repo", "issues/create", "issues/get", "meta/root")


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            out.add(ref)
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)


@cache
def _github() -> dict[str, Any]:
    return dict(json.loads(GITHUB_DOCUMENT.read_text()))


def github_subset(operation_ids: tuple[str, ...] = GITHUB_OPERATIONS) -> dict[str, Any]:
    doc = _github()
    paths: dict[str, Any] = {}
    for path, item in doc["paths"].items():
        kept = {m: op for m, op in item.items() if isinstance(op, dict) and op.get("operationId") in operation_ids}
        if kept:
            paths[path] = {**{k: v for k, v in item.items() if k == "parameters"}, **kept}
    components: dict[str, dict[str, Any]] = {}
    pending: set[str] = set()
    _refs(paths, pending)
    seen: set[str] = set()
    while pending:
        ref = pending.pop()
        if ref in seen or not ref.startswith("#/components/"):
            continue
        seen.add(ref)
        _, _, kind, name = ref.split("/", 3)
        node = doc["components"][kind][name]
        components.setdefault(kind, {})[name] = node
        _refs(node, pending)
    return {
        "openapi": doc["openapi"],
        "info": doc["info"],
        "servers": doc.get("servers", []),
        "paths": paths,
        "components": components,
    }
