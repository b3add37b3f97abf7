"""Alembic's entry point for the strop store's migrations; strop runs it through `strop.store.open_store`.

Revisions live in `versions/`, named `NNNN_what.py` with `revision = "NNNN"`. After changing
`strop/store/schema.py`, write the next one against a store at the current head:

    from alembic import command
    from strop.store.db import alembic_config, open_store
    open_store("sqlite:////tmp/dev.db")
    command.revision(alembic_config("sqlite:////tmp/dev.db"), "add runs.priority", autogenerate=True,
                     rev_id="0002")

then read and tidy what it wrote (autogenerate misses renames and CHECK constraints), and run the store
tests: they fail while the migrated database and schema.py disagree.
"""

from __future__ import annotations

from alembic import context

from strop.store.db import VERSION_TABLE, get_engine
from strop.store.schema import Base, UTCDateTime

config = context.config


def _render_item(type_, obj, autogen_context):
    # Generated migrations spell our UTC type as the plain column type it stores, so they never import
    # strop.store.schema (which keeps changing after the migration is written).
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _options(dialect_name: str) -> dict:
    return {
        "target_metadata": Base.metadata,
        "version_table": VERSION_TABLE,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        "render_as_batch": dialect_name == "sqlite",
        "render_item": _render_item,
        # SQLite supports transactional DDL, so a failed upgrade leaves the old schema intact.
        "transactional_ddl": True,
        "compare_type": True,
    }


def run_offline() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set sqlalchemy.url (alembic_config(url)) to render the SQL for a database kind")
    dialect = url.split(":", 1)[0].split("+", 1)[0]
    context.configure(url=url, literal_binds=True, **_options(dialect))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        with get_engine(config.get_main_option("sqlalchemy.url") or None).connect() as connection:
            _migrate(connection)
            connection.commit()
    else:
        _migrate(connection)


def _migrate(connection) -> None:
    context.configure(connection=connection, **_options(connection.dialect.name))
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
