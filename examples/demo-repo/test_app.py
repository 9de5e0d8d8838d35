"""The demo's test suite: plain asserts, no test framework, so it runs anywhere python3 does."""

import sys

from app import greet


def test_greet():
    got = greet("Ada")
    assert got == "Hello, Ada!", f"greet(\"Ada\") returned {got!r}, expected 'Hello, Ada!'"


if __name__ == "__main__":
    try:
        test_greet()
    except AssertionError as exc:
        print(f"FAIL test_greet: {exc}")
        print("1 test failed")
        sys.exit(1)
    print("1 test passed")
