"""The SQLModel models and the migrations describe the same schema (issue 13).

Two views of one real PostgreSQL server, started once for this module:

* alembic's autogenerate comparison (``db.autogen.schema_diff``, what ``alembic check`` runs) of a
  database migrated to head against ``SQLModel.metadata``: tables, columns, types, nullability,
  server defaults, indexes, unique constraints, foreign keys;
* PostgreSQL's own catalog of that database against one of a second database built from the models
  (``create_all``): this adds what alembic does not compare (CHECK constraints, partial-index
  predicates, ON DELETE actions, constraint names), in PostgreSQL's canonical rendering.

Functions and triggers are not modelled; the migrated database must have exactly the ones
``db.models`` lists. The last tests mutate a copy of the metadata and show each view reports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from cli.stack import Postgres, ensure_database
from db.autogen import TARGET_METADATA, schema_diff
from db.engine import migrate, sqlalchemy_url
from db.models import MIGRATION_ONLY_FUNCTIONS, MIGRATION_ONLY_TRIGGERS, NAMING_CONVENTION

Catalog = dict[str, set[tuple[Any, ...]]]


@dataclass
class Server:
    admin_url: str
    migrated: AsyncEngine
    migrated_url: str

    async def database_from(self, name: str, metadata: sa.MetaData) -> str:
        """A fresh database holding ``metadata``'s tables as ``create_all`` builds them."""
        url = await ensure_database(self.admin_url, name)
        engine = create_async_engine(sqlalchemy_url(url))
        try:
            async with engine.begin() as conn:
                await conn.run_sync(metadata.create_all)
        finally:
            await engine.dispose()
        return url

    async def diff(self, metadata: sa.MetaData) -> list[Any]:
        async with self.migrated.connect() as conn:
            return await conn.run_sync(schema_diff, metadata)


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    pg = Postgres(tmp_path_factory.mktemp("models") / "pg")
    try:
        admin_url = await asyncio.to_thread(pg.start)
        migrated_url = await ensure_database(admin_url, "migrated")
        await migrate(migrated_url)
        engine = create_async_engine(sqlalchemy_url(migrated_url))
        try:
            yield Server(admin_url, engine, migrated_url)
        finally:
            await engine.dispose()
    finally:
        pg.stop()


async def catalog(url: str) -> Catalog:
    """Columns, constraints and indexes of the public schema as PostgreSQL renders them."""
    conn = await asyncpg.connect(url)
    try:
        columns = await conn.fetch(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
            " pg_get_expr(d.adbin, d.adrelid)"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
            " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND a.attnum > 0"
            " AND NOT a.attisdropped AND c.relname <> 'alembic_version'"
        )
        constraints = await conn.fetch(
            "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text <> 'alembic_version'"
        )
        indexes = await conn.fetch(
            "SELECT tablename, indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
        )
    finally:
        await conn.close()
    return {
        "columns": {tuple(r) for r in columns},
        "constraints": {tuple(r) for r in constraints},
        "indexes": {tuple(r) for r in indexes},
    }


async def unmodelled(url: str) -> tuple[set[str], set[str]]:
    """The public schema's functions, and its triggers other than PostgreSQL's internal (FK) ones."""
    conn = await asyncpg.connect(url)
    try:
        functions = await conn.fetch("SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
        triggers = await conn.fetch(
            "SELECT c.relname || '.' || t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal"
        )
    finally:
        await conn.close()
    return {r[0] for r in functions}, {r[0] for r in triggers}


def mismatches(left: Catalog, right: Catalog) -> dict[str, dict[str, list[tuple[Any, ...]]]]:
    return {
        kind: {"only_migrations": sorted(left[kind] - right[kind]), "only_models": sorted(right[kind] - left[kind])}
        for kind in left
        if left[kind] != right[kind]
    }


def copy_of_models() -> sa.MetaData:
    copy = sa.MetaData(naming_convention=NAMING_CONVENTION)
    for table in TARGET_METADATA.sorted_tables:
        table.to_metadata(copy)
    return copy


def kinds(diff: list[Any]) -> list[str]:
    """The operation names of a diff (``modify_*`` entries come grouped in an inner list)."""
    return [entry[0][0] if isinstance(entry, list) else entry[0] for entry in diff]


async def test_every_table_the_migrations_create_has_a_model(server: Server) -> None:
    async with server.migrated.connect() as conn:
        names = await conn.run_sync(lambda c: set(sa.inspect(c).get_table_names()))
    assert names - {"alembic_version"} == set(TARGET_METADATA.tables)


async def test_alembic_finds_no_difference_between_the_migrated_database_and_the_models(server: Server) -> None:
    assert await server.diff(TARGET_METADATA) == []


async def test_a_database_built_from_the_models_has_the_migrated_catalog(server: Server) -> None:
    built = await server.database_from("modelled", TARGET_METADATA)
    assert mismatches(await catalog(server.migrated_url), await catalog(built)) == {}


async def test_the_only_objects_left_to_the_migrations_are_the_listed_functions_and_triggers(
    server: Server,
) -> None:
    functions, triggers = await unmodelled(server.migrated_url)
    assert functions == set(MIGRATION_ONLY_FUNCTIONS)
    assert triggers == set(MIGRATION_ONLY_TRIGGERS)


async def test_alembic_reports_a_column_the_migrations_never_added(server: Server) -> None:
    models = copy_of_models()
    models.tables["sessions"].append_column(sa.Column("priority", sa.Integer(), nullable=True))
    diff = await server.diff(models)
    assert kinds(diff) == ["add_column"]
    assert diff[0][2:4] == ("sessions", models.tables["sessions"].c.priority)


async def test_alembic_reports_a_changed_nullability(server: Server) -> None:
    models = copy_of_models()
    models.tables["approvals"].c.status.nullable = True
    diff = await server.diff(models)
    assert kinds(diff) == ["modify_nullable"]
    assert diff[0][0][2:4] == ("approvals", "status")


async def test_alembic_reports_a_changed_type_and_server_default(server: Server) -> None:
    models = copy_of_models()
    models.tables["events"].c.seq.type = sa.Integer()
    models.tables["sessions"].c.trust_tier.server_default = sa.DefaultClause(sa.text("'untrusted'"))
    diff = await server.diff(models)
    assert sorted(kinds(diff)) == ["modify_default", "modify_type"]


async def test_the_catalog_comparison_reports_a_changed_check_constraint(server: Server) -> None:
    """alembic does not compare CHECK constraints; the catalog comparison does."""
    models = copy_of_models()
    check = next(c for c in models.tables["deliveries"].constraints if c.name == "deliveries_status_check")
    assert isinstance(check, sa.CheckConstraint)
    check.sqltext = sa.text("status IN ('pending', 'delivered', 'failed')")
    assert await server.diff(models) == []
    built = await server.database_from("mutated_check", models)
    found = mismatches(await catalog(server.migrated_url), await catalog(built))
    assert list(found) == ["constraints"]
    assert [c[1] for c in found["constraints"]["only_models"]] == ["deliveries_status_check"]
