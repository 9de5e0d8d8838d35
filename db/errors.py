"""The database driver's errors that callers above ``db/`` act on, under names of our own.

Only ``db/`` imports the driver (an import-linter contract); a service or a command that must tell
"this key was taken" or "the schema is not migrated yet" apart catches these.
"""

from __future__ import annotations

import asyncpg

DatabaseError = asyncpg.PostgresError
UniqueViolation = asyncpg.UniqueViolationError
# A table or column that a later migration adds is missing: the database is not migrated that far yet.
SchemaNotReady = (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError)

__all__ = ["DatabaseError", "SchemaNotReady", "UniqueViolation"]
