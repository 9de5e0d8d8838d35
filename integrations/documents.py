"""Documents a client sends (OpenAPI documents, policy documents), read so that nothing in them can make the
control plane fetch, read or expand anything.

- **YAML** is loaded with aliases refused and nesting bounded: a 440-byte document of nested aliases expands
  tenfold per level (gigabytes after a few), and PyYAML's composer recurses once per level of nesting, so a
  5,000-deep document would overflow it. Dates stay strings, so what YAML gives is what JSON could have given.
- **Trees** (parsed YAML or JSON) are measured iteratively before anything walks them recursively: depth and
  node count have ceilings.
- **References**: only local JSON pointers (``#/…``) are followed. A ``$ref`` naming a file or a URL is refused
  before any validator sees the document, and the validator itself is handed retrieval handlers that refuse
  every scheme, so a base URI smuggled in through ``$id`` cannot make it fetch either.

Errors::

    DocumentError       the document is refused; the message names why and where, never quotes loaded content
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import yaml

MAX_DEPTH = 64
MAX_NODES = 1_000_000
# The reference keywords of JSON Schema and OpenAPI that name another document.
REFERENCE_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


class DocumentError(ValueError):
    """A client's document is refused (too deep, too large, an alias, a reference outside itself)."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with aliases refused and nesting and size bounded while composing."""

    def __init__(self, stream: str, max_depth: int, max_nodes: int) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._max_depth = max_depth
        self._max_nodes = max_nodes

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise DocumentError(f"YAML aliases (*name) are not accepted (line {mark.line + 1})")
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise DocumentError(f"the YAML document has more than {self._max_nodes} nodes")
        self._depth += 1
        if self._depth > self._max_depth:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise DocumentError(f"the YAML document nests deeper than {self._max_depth} levels (line {mark.line + 1})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# Plain scalars that look like dates stay strings: a policy's or a document's values round-trip through JSON.
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(text: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """Parse YAML (or JSON, which is YAML) a client sent.

    Raises:
        DocumentError: an alias, nesting deeper than ``max_depth``, more than ``max_nodes`` nodes.
        yaml.YAMLError: the text is not YAML.
    """
    loader = _BoundedLoader(text, max_depth, max_nodes)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _nodes(doc: Any) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every node of a tree with its path, without recursion (the tree has been measured first)."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), doc)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if isinstance(node, dict):
            stack.extend(((*path, str(k)), v) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(node))))


def check_tree(doc: Any, *, what: str = "the document", max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Refuse a parsed tree that nests deeper than ``max_depth`` or holds more than ``max_nodes`` nodes.

    Raises:
        DocumentError: naming the path where the limit was crossed.
    """
    count = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > max_nodes:
            raise DocumentError(f"{what} has more than {max_nodes} values")
        if depth > max_depth:
            raise DocumentError(f"{what} nests deeper than {max_depth} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def pointer(path: tuple[str | int, ...]) -> str:
    """A path as a JSON pointer (``#/paths/~1items/get``)."""
    return "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def refuse_external_references(doc: Any) -> None:
    """Refuse any reference that is not a local JSON pointer (``#`` or ``#/…``). Call :func:`check_tree` first.

    Raises:
        DocumentError: naming where the reference is (never what it points to: that is the caller's own text,
            but it might be a path on our host a message would seem to confirm).
    """
    for path, node in _nodes(doc):
        if not isinstance(node, dict):
            continue
        for key in REFERENCE_KEYS:
            if key in node:
                ref = node[key]
                if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
                    raise DocumentError(
                        f"the {key} at {pointer(path)} does not point inside the document: only local references "
                        "(#/…) are followed, never a file or a URL"
                    )


def _refuse(uri: str) -> NoReturn:
    raise DocumentError("the document refers outside itself: only local references (#/…) are followed")


class NoRetrieval(Mapping[str, Any]):
    """Retrieval handlers for ``jsonschema-path`` that refuse every scheme.

    Its retriever falls back to ``requests``/``urllib`` for a scheme it has no handler for, so an empty mapping
    would not do: this one claims every scheme and answers each with a refusal."""

    def __getitem__(self, scheme: str) -> Any:
        return _refuse

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
