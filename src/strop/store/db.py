"""Opening the strop store: which database, how it is connected, and bringing its schema up to date.

The store is SQLite at `$STROP_HOME/strop.db` unless `$STROP_DATABASE_URL` names another database
(any SQLAlchemy URL; `postgresql://user:pass@host/strop` uses psycopg 3, from `pip install 'strop[postgres]'`).

    from strop.store import Run, open_store, session_scope
    engine = open_store()                      # creates or upgrades the schema, then returns the engine
    with session_scope(engine) as s:           # commits at the end of the block, rolls back on error
        s.add(...)
    with session_scope(engine, read_only=True) as s:
        runs = s.scalars(select(Run)).all()

SQLite is set up for several processes at once (a CLI, background training workers): WAL journal so
readers never block the writer, a 30 s busy timeout instead of instant "database is locked", foreign keys
enforced, and write transactions that take the write lock at BEGIN (`BEGIN IMMEDIATE`). The last matters:
a transaction that reads, then writes, and meanwhile sees another process commit would otherwise fail at
once with "database is locked" however long the busy timeout is. Read-only scopes use a plain BEGIN.

`open_store` is safe to call from many processes at once: the upgrade runs under a lock (a file lock beside
a SQLite database, an advisory lock on PostgreSQL) and inside one transaction, and a process that finds the
schema already at head does nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from strop.errors import StropError
from strop.paths import strop_home

ENV_VAR = "STROP_DATABASE_URL"
EXAMPLE_URLS = "'sqlite:////home/me/strop.db' or 'postgresql://strop:secret@localhost:5432/strop'"
BUSY_TIMEOUT_S = 30
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Our own name, so a PostgreSQL database shared with another Alembic-managed app keeps both histories apart.
VERSION_TABLE = "strop_schema_version"
_READ_ONLY = "strop_read_only"
# Any fixed 64-bit number works; every strop process must use the same one.
_PG_LOCK_KEY = zlib.crc32(b"strop store schema upgrade")


class StoreError(StropError):
    """The store could not be opened or used: a bad URL, a missing driver, an unreachable or newer database."""


def database_url() -> str:
    """`$STROP_DATABASE_URL` when set, else SQLite at `$STROP_HOME/strop.db`."""
    url = os.environ.get(ENV_VAR, "").strip()
    return url or f"sqlite:///{strop_home() / 'strop.db'}"


_engines: dict[str, Engine] = {}
_upgraded: set[str] = set()
_lock = threading.Lock()


def get_engine(url: str | URL | None = None) -> Engine:
    """The engine for `url` (default `database_url()`), made once per URL and process.

    It does not touch the schema; use `open_store` unless you know the schema is at head.
    """
    parsed = _parse_url(url)
    key = parsed.render_as_string(hide_password=False)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _make_engine(parsed, _source(url))
        return engine


def clear_engine_cache() -> None:
    """Dispose every cached engine and forget which stores were upgraded (tests; a forked child needs
    nothing: its inherited connections are dropped automatically)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _upgraded.clear()


def _after_fork_in_child() -> None:
    # A forked child (a background worker) must open its own connections: sharing the parent's pooled
    # SQLite handles or server sockets corrupts both sides' transactions. dispose(close=False) forgets them
    # without closing what the parent still uses.
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    for engine in _engines.values():
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def open_store(url: str | URL | None = None) -> Engine:
    """The engine for `url` (default `database_url()`) with its schema created or upgraded to head."""
    engine = get_engine(url)
    key = engine.url.render_as_string(hide_password=False)
    if key in _upgraded:
        return engine
    try:
        with _schema_lock(engine):
            _upgrade(engine)
    except StropError:
        raise
    except SQLAlchemyError as exc:
        raise StoreError(
            f"could not open the store at {_shown(engine.url)} ({_source(url)}): {_first_line(exc)}. "
            f"Check that the database is reachable and the URL is right, or unset {ENV_VAR} to use SQLite "
            f"under $STROP_HOME."
        ) from exc
    _upgraded.add(key)
    return engine


@contextlib.contextmanager
def session_scope(engine: Engine | None = None, *, read_only: bool = False) -> Iterator[Session]:
    """A session that commits when the block ends and rolls back if it raises.

    Objects stay readable after the block (no expiry on commit), so `run.id` works once it is closed.
    `read_only=True` never commits and, on SQLite, does not take the write lock.
    """
    engine = engine if engine is not None else open_store()
    bind = engine.execution_options(**{_READ_ONLY: True}) if read_only else engine
    session = Session(bind=bind, expire_on_commit=False)
    try:
        yield session
        if read_only:
            session.rollback()
        else:
            session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str | URL | None = None):
    """An Alembic Config for the packaged migrations, e.g. to write the next one after changing schema.py:

        from alembic import command
        command.revision(alembic_config("sqlite:////tmp/dev.db"), "add X", autogenerate=True, rev_id="0002")
    """
    # lazy: alembic is heavy or optional, loaded only when this runs
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # ConfigParser treats '%' as interpolation; URL-encoded passwords contain it.
        config.set_main_option("sqlalchemy.url", str(url).replace("%", "%%"))
    return config


# --- URLs and engines ---------------------------------------------------------------------------------------


def _source(url) -> str:
    if url is not None:
        return "the url argument"
    return f"from ${ENV_VAR}" if os.environ.get(ENV_VAR, "").strip() else "the default under $STROP_HOME"


def _parse_url(url: str | URL | None) -> URL:
    raw = database_url() if url is None else url
    try:
        parsed = raw if isinstance(raw, URL) else make_url(str(raw).strip())
    except (ArgumentError, ValueError) as exc:
        raise StoreError(
            f"database URL {str(raw)!r} ({_source(url)}) is not a SQLAlchemy URL: {exc}. "
            f"Set {ENV_VAR} to something like {EXAMPLE_URLS}, or unset it to use SQLite under $STROP_HOME."
        ) from None
    # The optional dependency is psycopg 3; plain 'postgresql://' would otherwise mean psycopg2.
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _make_engine(url: URL, source: str) -> Engine:
    try:
        if url.get_backend_name() == "sqlite":
            return _make_sqlite_engine(url)
        # pre_ping: a server restart between two CLI calls in one long-lived process is survivable.
        return create_engine(url, pool_pre_ping=True)
    except NoSuchModuleError:
        raise StoreError(
            f"database URL {_shown(url)} ({source}) names an unknown database kind {url.drivername!r}. "
            f"Set {ENV_VAR} to something like {EXAMPLE_URLS}."
        ) from None
    except ImportError as exc:
        hint = "pip install 'strop[postgres]'" if url.get_backend_name() == "postgresql" else "install its driver"
        raise StoreError(
            f"database URL {_shown(url)} ({source}) needs the Python driver {exc.name or url.drivername!r}, "
            f"which is not installed: {hint}."
        ) from None
    except ArgumentError as exc:
        raise StoreError(f"database URL {_shown(url)} ({source}) was refused: {exc}. "
                         f"Set {ENV_VAR} to something like {EXAMPLE_URLS}.") from None


def _make_sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    memory = database in ("", ":memory:") or "mode=memory" in database
    uri = str(url.query.get("uri", "")).lower() in ("true", "1")
    if not memory and not uri:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        _create_private(Path(database))
    kwargs = {"poolclass": StaticPool} if memory else {}
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S}, **kwargs
    )
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _create_private(path: Path) -> None:
    """A new store file readable by its owner alone (SQLite gives its -wal and -shm files the same mode): a grader
    or another user of the machine must not read the registry's contents. An existing file keeps its mode, so a
    store deliberately shared with a group stays shared."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError:
        pass  # a folder we cannot write: SQLite's own open will say so with the path


def _sqlite_connect(dbapi_connection, _record) -> None:
    # Hand BEGIN to us (see _sqlite_begin); the driver's own would skip it for SELECT and DDL.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA foreign_keys = ON")
        # Persistent in the file; switching a new file to WAL briefly needs it to itself, which the busy
        # timeout covers. In-memory databases answer 'memory' and stay so.
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _sqlite_begin(conn) -> None:
    read_only = conn.get_execution_options().get(_READ_ONLY, False)
    conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _shown(url: URL) -> str:
    return repr(url.render_as_string(hide_password=True))


def _first_line(exc: BaseException) -> str:
    inner = getattr(exc, "orig", None) or exc
    return (str(inner).strip().splitlines() or [type(inner).__name__])[0]


# --- schema upgrades ---------------------------------------------------------------------------------------


def _head_and_known() -> tuple[str, set[str]]:
    # lazy: alembic is heavy or optional, loaded only when this runs
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    return script.get_current_head(), {rev.revision for rev in script.walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None for an empty database)."""
    # lazy: alembic is heavy or optional, loaded only when this runs
    from alembic.runtime.migration import MigrationContext

    with engine.execution_options(**{_READ_ONLY: True}).connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        heads = context.get_current_heads()
    return heads[0] if heads else None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the migrations up to `revision` on `engine`, under the schema lock (open_store does this)."""
    with _schema_lock(engine):
        _run_upgrade(engine, revision)


def _upgrade(engine: Engine) -> None:
    head, known = _head_and_known()
    current = current_revision(engine)
    if current == head:
        return
    if current is not None and current not in known:
        raise StoreError(
            f"the store at {_shown(engine.url)} has schema revision {current!r}, which this strop does not "
            f"know: it was written by a newer strop. Upgrade strop (pip install -U strop), or point "
            f"{ENV_VAR} at another database."
        )
    _run_upgrade(engine, "head")


def _run_upgrade(engine: Engine, revision: str) -> None:
    # lazy: alembic is heavy or optional, loaded only when this runs
    from alembic import command

    config = alembic_config()
    with engine.connect() as conn:
        # env.py uses this connection, so the migration sees our SQLite pragmas and BEGIN IMMEDIATE.
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        if conn.in_transaction():
            conn.commit()


@contextlib.contextmanager
def _schema_lock(engine: Engine) -> Iterator[None]:
    backend = engine.url.get_backend_name()
    database = engine.url.database or ""
    if backend == "sqlite" and database not in ("", ":memory:") and not database.startswith("file:"):
        with _file_lock(Path(database).expanduser().with_name(Path(database).name + ".lock")):
            yield
    elif backend == "postgresql":
        # Held on its own connection: the lock is per database, so other processes wait whichever
        # connection they migrate on.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
    else:
        yield


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # The lock file stays: removing it would race with a process that has just opened it.
    with open(path, "a+b") as handle:
        try:
            # lazy: optional, its absence is handled here
            import fcntl
        except ImportError:  # Windows
            # lazy: msvcrt is platform-specific
            import msvcrt

            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:  # LK_LOCK gives up after about 10 s; keep waiting like flock does
                    time.sleep(0.1)
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
