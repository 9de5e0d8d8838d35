"""Input digests bind a tool_call_id to its tool and input."""

from __future__ import annotations

import re

from core.digests import canonical_json, document_digest, input_digest, sha256_hex

SHAPE = re.compile(r"^sha256:[0-9a-f]{16}$")


def test_input_digest_has_the_shape_sha256_colon_16_hex() -> None:
    assert SHAPE.match(input_digest("Bash", {"command": "ls"}))
    assert SHAPE.match(input_digest("Read", {}))
    assert SHAPE.match(input_digest("X", None))


def test_input_digest_is_stable_under_key_order() -> None:
    a = {"command": "ls", "timeout": 5, "nested": {"x": 1, "y": [1, 2]}}
    b = {"nested": {"y": [1, 2], "x": 1}, "timeout": 5, "command": "ls"}
    assert input_digest("Bash", a) == input_digest("Bash", b)


def test_input_digest_is_deterministic() -> None:
    assert input_digest("Bash", {"command": "ls"}) == input_digest("Bash", {"command": "ls"})


def test_input_digest_differs_when_the_input_differs() -> None:
    assert input_digest("Bash", {"command": "ls"}) != input_digest("Bash", {"command": "ls -la"})
    assert input_digest("Bash", {"command": "ls"}) != input_digest("Bash", {"command": "ls", "x": None})
    assert input_digest("Bash", {"n": 1}) != input_digest("Bash", {"n": "1"})
    assert input_digest("Bash", {"l": [1, 2]}) != input_digest("Bash", {"l": [2, 1]})


def test_input_digest_differs_when_the_tool_differs() -> None:
    assert input_digest("Bash", {"command": "ls"}) != input_digest("BashOutput", {"command": "ls"})


def test_input_digest_is_the_first_16_hex_of_sha256_of_the_canonical_json() -> None:
    text = canonical_json({"tool": "Bash", "input": {"command": "ls"}})
    assert text == '{"input":{"command":"ls"},"tool":"Bash"}'
    assert input_digest("Bash", {"command": "ls"}) == "sha256:" + sha256_hex(text)[:16]


def test_canonical_json_keeps_non_ascii_text_literal() -> None:
    assert canonical_json({"b": "é", "a": 1}) == '{"a":1,"b":"é"}'


def test_document_digest_is_a_full_sha256_and_stable_under_key_order() -> None:
    digest = document_digest({"a": 1, "b": 2})
    assert re.match(r"^sha256:[0-9a-f]{64}$", digest)
    assert digest == document_digest({"b": 2, "a": 1})


def test_sha256_hex_accepts_text_and_bytes_alike() -> None:
    assert sha256_hex("abc") == sha256_hex(b"abc")
    assert sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
