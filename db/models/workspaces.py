"""Workspace archives that travel over the runner plane (sandboxes that do not share the worker's disk).

``initial`` is the prepared tree the runner downloads (its sha256 is in the Pod's spec); ``final`` is what
the runner uploads before its result, from which any worker rebuilds the diff. Both go when the run ends.
"""

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BIGINT, BYTEA, NOW, TEXT, TIMESTAMPTZ


class WorkspaceArchive(SQLModel, table=True):
    """One gzip'd tar of a run's workspace, addressed by run and kind, verified by its sha256."""

    __tablename__ = "workspace_archives"
    __table_args__ = (sa.CheckConstraint("kind IN ('initial', 'final')", name="workspace_archives_kind"),)

    session_id: uuid.UUID = Field(primary_key=True, foreign_key="sessions.id", ondelete="CASCADE")
    kind: str = Field(primary_key=True, sa_type=TEXT)
    sha256: str = Field(sa_type=TEXT)
    size: int = Field(sa_type=BIGINT)
    data: bytes = Field(sa_type=BYTEA)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
