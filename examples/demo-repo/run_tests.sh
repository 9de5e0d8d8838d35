#!/bin/sh
# Run the test suite from the repository root, whatever the caller's directory.
cd "$(dirname "$0")" || exit 1
exec python3 test_app.py
