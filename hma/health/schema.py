"""The state store's schema: the migrations that make it, step by step (``PRAGMA user_version``),
and the check at open that a file holds it (``settle``).

A file's tables are compared with those the migrations make at its version: each table's columns
(name, type, NOT NULL, default, primary key, in order) and its unique keys. A table that is
missing is created (its rows were lost: the store says so); a ``user_version`` that does not
match the tables is set to the version whose tables they are; a table with other columns or keys,
or a version newer than hma's, cannot be repaired (``SchemaError``: the store moves the file
aside). Tables hma does not know are left alone.
"""

from __future__ import annotations

import functools
import sqlite3
from typing import NamedTuple

SCHEMA_VERSION = 5

# MIGRATIONS[n] takes a database from version n to n + 1.
MIGRATIONS: list[str] = [
    # 0 -> 1: the first schema.
    """
    CREATE TABLE faults (component TEXT NOT NULL, code TEXT NOT NULL, data TEXT NOT NULL,
                         PRIMARY KEY (component, code));
    CREATE TABLE history (id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL,
                          code TEXT, component TEXT, severity TEXT, message TEXT, details TEXT);
    CREATE TABLE boots (boot_id TEXT PRIMARY KEY, first_seen REAL NOT NULL);
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE actions (id INTEGER PRIMARY KEY, key TEXT UNIQUE, kind TEXT, node TEXT,
                          reason TEXT, payload TEXT, state TEXT, attempts INTEGER DEFAULT 0,
                          last_error TEXT DEFAULT '', created REAL, updated REAL, next_try REAL);
    """,
    # 1 -> 2: who did what (acks), operator requests to the daemon, history index for retention.
    """
    ALTER TABLE history ADD COLUMN who TEXT DEFAULT '';
    CREATE INDEX history_ts ON history (ts);
    CREATE TABLE requests (id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL,
                           payload TEXT NOT NULL, who TEXT DEFAULT '', done REAL);
    """,
    # 2 -> 3: the node's remediations (docs/remediation.md "Repeat offenders").
    """
    CREATE TABLE remediations (id INTEGER PRIMARY KEY, ts REAL NOT NULL, episode INTEGER,
                               code TEXT NOT NULL, component TEXT NOT NULL, action TEXT NOT NULL,
                               boot_id TEXT DEFAULT '', who TEXT DEFAULT '', note TEXT DEFAULT '');
    """,
    # 3 -> 4: occurrences of counted codes ([codes.X] after/within), per (scope, code).
    """
    CREATE TABLE occurrences (scope TEXT NOT NULL, code TEXT NOT NULL, data TEXT NOT NULL,
                              PRIMARY KEY (scope, code));
    """,
    # 4 -> 5: maintenance mode (hma maintenance): at most one row, the window.
    """
    CREATE TABLE maintenance (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL);
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION


class SchemaError(sqlite3.DatabaseError):
    """The file's tables are not hma's schema and cannot be repaired."""


Shape = dict[str, tuple[object, ...]]  # table -> its columns and unique keys


class Reference(NamedTuple):
    """What the migrations make at one version: each table's shape, and the SQL that creates
    each table and index (by name, with the table an index is on)."""

    shape: Shape
    tables: dict[str, str]
    indexes: dict[str, tuple[str, str]]


def shape(conn: sqlite3.Connection) -> Shape:
    """The shape of every table in ``conn`` but SQLite's own."""
    out: Shape = {}
    names = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    for (name,) in names:
        columns = conn.execute(
            'SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info(?)', (name,)
        ).fetchall()
        keys = sorted(
            tuple(c for (c,) in conn.execute("SELECT name FROM pragma_index_info(?)", (index,)))
            for index, unique, origin in conn.execute(
                'SELECT name, "unique", origin FROM pragma_index_list(?)', (name,)
            )
            if unique and origin in ("u", "pk")
        )
        out[name] = (tuple(columns), tuple(keys))
    return out


def migrate(conn: sqlite3.Connection, version: int, to: int = SCHEMA_VERSION) -> None:
    """Take ``conn`` from ``version`` to ``to``, one transaction per step."""
    for step in range(version, to):
        statements = [s for s in MIGRATIONS[step].split(";") if s.strip()]
        _commit(conn, statements, step + 1)


def _commit(conn: sqlite3.Connection, statements: list[str], version: int) -> None:
    """Run ``statements`` and set ``user_version`` to ``version``, in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


@functools.cache
def reference(version: int) -> Reference:
    """The tables the migrations make at ``version``."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, 0, version)
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL"
        ).fetchall()
        return Reference(
            shape(conn),
            {name: sql for kind, name, _t, sql in rows if kind == "table"},
            {name: (table, sql) for kind, name, table, sql in rows if kind == "index"},
        )
    finally:
        conn.close()


def _fits(found: Shape, version: int) -> bool:
    """Whether every table of ``found`` is one the migrations make at ``version``, as they make
    it (tables of that version may be missing)."""
    want = reference(version).shape
    return all(want.get(name) == have for name, have in found.items())


def settle(conn: sqlite3.Connection) -> str:
    """Bring the file's schema to ``SCHEMA_VERSION``: repair what can be repaired, then migrate.
    Returns what was repaired, in words ("" nothing); raises ``SchemaError`` when the tables
    cannot be hma's (a sqlite3.OperationalError when the file cannot be written)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SchemaError(f"schema version {version} is newer than {SCHEMA_VERSION}")
    known = reference(SCHEMA_VERSION).shape
    found = {name: have for name, have in shape(conn).items() if name in known}
    fits = [v for v in range(SCHEMA_VERSION + 1) if _fits(found, v)]
    if not fits:
        raise SchemaError(_unfit(found))
    at = version if version in fits else fits[0]
    ref = reference(at)
    missing = sorted(set(ref.tables) - set(found))
    indexes = [sql for name, (_table, sql) in ref.indexes.items() if _absent(conn, name)]
    done = []
    if at != version:
        done.append(f"user_version {version} set to {at}, the version of its tables")
    if missing:
        done.append(f"missing table(s) {', '.join(missing)} created empty")
    if done or indexes:
        # IF NOT EXISTS: another process may repair the same file at the same time
        creates = [ref.tables[name] for name in missing] + indexes
        _commit(conn, [_if_absent(sql) for sql in creates], at)
    migrate(conn, at)
    return "; ".join(done)


def _if_absent(sql: str) -> str:
    """``CREATE TABLE x ...`` as ``CREATE TABLE IF NOT EXISTS x ...`` (likewise an index)."""
    for kind in ("CREATE TABLE ", "CREATE INDEX "):
        if sql.startswith(kind):
            return kind + "IF NOT EXISTS " + sql[len(kind) :]
    return sql


def _absent(conn: sqlite3.Connection, index: str) -> bool:
    return not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (index,)).fetchall()


def _unfit(found: Shape) -> str:
    """Why no version's tables are those of ``found``, in words."""
    versions = range(SCHEMA_VERSION + 1)
    wrong = [
        n for n, have in found.items() if all(reference(v).shape.get(n) != have for v in versions)
    ]
    if wrong:
        return f"table(s) {', '.join(sorted(wrong))}: columns or keys not as hma makes them"
    return "tables of different schema versions"
