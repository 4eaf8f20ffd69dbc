"""Consistent snapshots with their exact binlog position, chunk planning by key, and chunk reading.

Two ways to open a snapshot whose binlog position matches its read view exactly
(docs/pitfalls.md#mysql-and-mariadb-sources):

* **MariaDB** (lock-free): ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` then
  ``SHOW STATUS LIKE 'binlog_snapshot_%'``. Each chunk opens its own snapshot and gets its own position.
* **MySQL 8**: ``FLUSH TABLES WITH READ LOCK`` -> ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` ->
  ``SHOW BINARY LOG STATUS`` (``SHOW MASTER STATUS`` before 8.2) -> ``UNLOCK TABLES``. The snapshot is
  opened *before* the unlock (DBZ-9006). No MySQL 8 server is available to this project's tests: this path
  is tested against a fake cursor only (tests/unit/provider/source/test_snapshot.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import MySQLdb
import MySQLdb.cursors

from exactly_once_provider.connections import mysql_connect_kwargs, mysql_tls_required, pymysql_tls
from exactly_once_provider.errors import ServiceAccessError, SourceConfigurationError
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.identifiers import quote_identifier, quote_table
from exactly_once_provider.source.preflight import column_catalog

# Error 1064 (syntax) / 1295 / 1227 cover "SHOW BINARY LOG STATUS" on servers older than MySQL 8.2.
_OLD_SYNTAX_CODES = {1064, 1295}
_ACCESS_DENIED = 1227
_LOGIN_DENIED = 1045  # ER_ACCESS_DENIED_ERROR: a wrong password, or a REQUIRE SSL user without TLS
# The statements opening a MariaDB snapshot whose binlog_snapshot_file/position are exactly its read view's.
# Every reader of a MariaDB chunk opens its snapshot with these (begin_snapshot; provider/source/native_reader.py).
MARIADB_SNAPSHOT_STATEMENTS = (
    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
)
# How long the MySQL path waits for FLUSH TABLES WITH READ LOCK before giving up (seconds).
FTWRL_LOCK_WAIT_TIMEOUT = 60
_NAME = re.compile(r"[A-Za-z0-9_]+")


def begin_snapshot(cur: Any, is_mariadb: bool) -> BinlogPosition:
    """Open a consistent snapshot on ``cur``'s connection and return its exact binlog position.

    The transaction stays open: read through this connection, then roll back.

    :param cur: a cursor of a connection with autocommit on and no open transaction.
    :param is_mariadb: MariaDB (lock-free status variables) or MySQL 8 (brief global read lock).
    """
    if is_mariadb:
        for statement in MARIADB_SNAPSHOT_STATEMENTS:
            cur.execute(statement)
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(name).lower(): value for name, value in cur.fetchall()}
        return snapshot_position(status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position"))
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    return _mysql_locked_snapshot(cur)


def _mysql_locked_snapshot(cur: Any) -> BinlogPosition:
    cur.execute(f"SET SESSION lock_wait_timeout = {FTWRL_LOCK_WAIT_TIMEOUT}")
    try:
        cur.execute("FLUSH TABLES WITH READ LOCK")
    except MySQLdb.Error as error:
        if error.args and error.args[0] == _ACCESS_DENIED:
            raise SourceConfigurationError(
                f"FLUSH TABLES WITH READ LOCK was denied ({error.args[1]}): on MySQL the exact snapshot position "
                "needs it briefly. GRANT RELOAD (or FLUSH_TABLES) ON *.* TO the connection's user."
            ) from None
        raise
    try:
        # Opened while writes are blocked, so the position below is exactly this read view's (DBZ-9006).
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            cur.execute("SHOW BINARY LOG STATUS")
        except MySQLdb.Error as error:
            if not (error.args and error.args[0] in _OLD_SYNTAX_CODES):
                raise
            cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
    finally:
        cur.execute("UNLOCK TABLES")
    return snapshot_position(row[0] if row else None, row[1] if row else None)


def snapshot_position(file: Any, pos: Any) -> BinlogPosition:
    """Return the snapshot's binlog position, refusing a server without a binary log (every reader's check)."""
    if not file:
        raise SourceConfigurationError(
            "The server has no binary log (no snapshot binlog file): start it with log_bin enabled, "
            "binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL."
        )
    return BinlogPosition(str(file), int(pos))


@dataclass(frozen=True)
class Chunk:
    """A key range ``lower < key <= upper`` (``None`` = unbounded); the chunks of a plan cover every key."""

    index: int
    lower: tuple | None
    upper: tuple | None


def _compare(
    columns: Sequence[str], values: Sequence[Any], last_op: str, literal: Callable[[Any], str] | None = None
) -> tuple[str, list]:
    """Lexicographic ``(columns) <op> (values)`` spelled out so the range optimizer uses the key.

    Values are parameters (``%s``), or inlined with ``literal`` (then no parameters are returned).
    """
    terms, params = [], []
    for i, column in enumerate(columns):
        if literal is None:
            slots = ["%s"] * (i + 1)
            params.extend(values[: i + 1])
        else:
            slots = [literal(v) for v in values[: i + 1]]
        parts = [f"{quote_identifier(c)} = {slot}" for c, slot in zip(columns[:i], slots)]
        op = last_op if i == len(columns) - 1 else last_op[0]
        parts.append(f"{quote_identifier(column)} {op} {slots[i]}")
        terms.append("(" + " AND ".join(parts) + ")")
    return "(" + " OR ".join(terms) + ")", params


def range_predicate(
    columns: Sequence[str], chunk: Chunk, literal: Callable[[Any], str] | None = None
) -> tuple[str, list]:
    """Return the SQL condition (and its parameters) selecting exactly the keys of ``chunk``.

    :param columns: the chunk key columns.
    :param chunk: the key range.
    :param literal: inline the bounds with this renderer (:func:`~.mysql_identifiers.sql_literal`) instead of
        returning them as parameters, for a client that cannot bind them.
    """
    clauses, params = [], []
    if chunk.lower is not None:
        sql, values = _compare(columns, chunk.lower, ">", literal)
        clauses.append(sql)
        params += values
    if chunk.upper is not None:
        sql, values = _compare(columns, chunk.upper, "<=", literal)
        clauses.append(sql)
        params += values
    return (" AND ".join(clauses) or "TRUE"), params


def server_ordered_columns(cur: Any, schema: str, table: str, key: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Return the key columns Python cannot order like the server: ``{column: (charset, collation)}``.

    A character column compares by its collation (case- and accent-insensitive, PAD SPACE, ...) while Python
    compares ``str`` by code point; only the ``*_nopad_bin`` collations agree with it. Numbers, dates and binary
    strings compare the same way on both sides.

    :param cur: an open cursor.
    :param schema: the database name.
    :param table: the table name.
    :param key: the chunk key columns.
    """
    catalog = column_catalog(cur, schema, table)
    text = {c: catalog[c.lower()] for c in key if c.lower() in catalog and catalog[c.lower()].collation}
    return {c: (info.charset, info.collation) for c, info in text.items() if not info.collation.endswith("_nopad_bin")}


class ServerChunkLocator:
    """
    Find the chunk of a plan that holds a key by asking the server, so keys order exactly as the plan was cut.

    The plan's bounds were found by the server in its collation order (:func:`plan_chunks`); comparing them in
    Python would put a key like ``'B'`` after ``'a'``'s chunk under a case-insensitive collation and give it the
    wrong snapshot position. One query per key (cached) evaluates the plan's own predicate on a probe row that
    carries the column's collation.

    :param connect: opens a connection (UTC, autocommit) on first use.
    :param key: the chunk key columns.
    :param collations: ``{column: (charset, collation)}`` of the key columns ordered by a collation.
    :param uppers: the upper bounds of every chunk but the last, in chunk order.
    """

    CACHE_SIZE = 100_000

    def __init__(
        self,
        connect: Callable[[], Any],
        key: Sequence[str],
        collations: dict[str, tuple[str, str]],
        uppers: Sequence[tuple],
    ) -> None:
        for charset, collation in collations.values():
            if not (_NAME.fullmatch(charset) and _NAME.fullmatch(collation)):
                raise ValueError(f"Unexpected character set or collation name {charset!r}/{collation!r}.")
        self._connect = connect
        self._conn: Any = None
        self._cache: dict[tuple, int] = {}
        self._uppers = len(uppers)
        probe = ", ".join(
            f"CONVERT(%s USING {collations[c][0]}) COLLATE {collations[c][1]} AS {quote_identifier(c)}"
            if c in collations
            else f"%s AS {quote_identifier(c)}"
            for c in key
        )
        # The number of upper bounds below the key is the index of its chunk (lower < key <= upper).
        terms, self._bound_params = [], []
        for upper in uppers:
            sql, values = _compare(key, upper, ">")
            terms.append(f"({sql})")
            self._bound_params += values
        self._sql = f"SELECT {' + '.join(terms) or '0'} FROM (SELECT {probe}) AS probe"

    def __call__(self, key_values: tuple) -> int:
        """Return the index of the chunk holding ``key_values``."""
        if not self._uppers:
            return 0
        index = self._cache.get(key_values)
        if index is None:
            if self._conn is None:
                self._conn = self._connect()
            cur = self._conn.cursor()
            try:
                cur.execute(self._sql, (*self._bound_params, *key_values))
                index = int(cur.fetchone()[0])
            finally:
                cur.close()
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            self._cache[key_values] = index
        return index

    def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def plan_chunks(cur: Any, schema: str, table: str, key: Sequence[str], chunk_rows: int) -> list[Chunk]:
    """Split a table into key ranges of about ``chunk_rows`` rows each, walking the key in index order.

    Boundaries are actual key values found every ``chunk_rows`` rows, so skewed, composite and string keys
    give even chunks. The last chunk is open-ended: rows inserted after planning still belong to a chunk.
    A boundary that would be the table's last key is not taken (the open-ended chunk reads those rows), so a
    table of exactly ``n * chunk_rows`` rows gives ``n`` chunks, not ``n`` and an empty one: every chunk is
    a Spark task and an empty one could cost a wave of its own.

    :param cur: an open cursor.
    :param schema: the database name.
    :param table: the table name.
    :param key: the unique NOT NULL key columns, in index order.
    :param chunk_rows: target rows per chunk.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}.")
    columns = ", ".join(quote_identifier(c) for c in key)
    bounds: list[tuple] = []
    while True:
        where, params = ("", [])
        if bounds:
            sql, params = _compare(key, bounds[-1], ">")
            where = f"WHERE {sql} "
        cur.execute(  # the boundary, and the next key if there is one
            f"SELECT {columns} FROM {quote_table(schema, table)} {where}ORDER BY {columns} LIMIT 2 OFFSET %s",
            (*params, chunk_rows - 1),
        )
        rows = cur.fetchall()
        if len(rows) < 2:
            break
        bounds.append(tuple(rows[0]))
    edges: list[tuple | None] = [None, *bounds, None]
    return [Chunk(i, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


@dataclass(frozen=True)
class ConnectionSettings:
    """What a Spark executor needs to open its own connection (built on the driver from the Airflow conn)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)  # never in a log line, not even through a repr
    database: str
    connect_timeout: int = 10
    # TLS as the MySQL provider's MySqlHook reads it from the connection's Extra (connections.mysql_connect_kwargs).
    ssl: dict | None = None
    ssl_mode: str | None = None

    @classmethod
    def of_connection(cls, mysql_conn_id: str) -> ConnectionSettings:
        """Return the settings of the Airflow ``mysql`` connection ``mysql_conn_id`` (in the process that has it).

        Read as the MySQL provider's ``MySqlHook`` reads the connection: TLS from the Extra ``ssl`` dict and
        ``ssl_mode`` (:func:`~exactly_once_provider.connections.mysql_connect_kwargs`).

        :param mysql_conn_id: the ``mysql`` connection.
        """
        kwargs = mysql_connect_kwargs(mysql_conn_id)
        return cls(
            host=kwargs["host"],
            port=kwargs["port"],
            user=kwargs["user"],
            password=kwargs["passwd"],
            database=kwargs["db"],
            connect_timeout=kwargs["connect_timeout"],
            ssl=kwargs.get("ssl"),
            ssl_mode=kwargs.get("ssl_mode"),
        )

    def to_json(self) -> dict[str, Any]:
        """Return the settings as JSON, password included: for a 0600 secrets file only, never a log or a spec."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConnectionSettings:
        """Return the settings :meth:`to_json` wrote.

        :param data: the JSON object.
        """
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"MySQL connection settings with unknown fields {unknown}; expected those of to_json().")
        return cls(**data)

    def connect(self, conv: dict | None = None) -> MySQLdb.connections.Connection:
        """Open a UTC, utf8mb4 connection with autocommit on.

        :param conv: MySQLdb type conversions replacing the defaults (e.g. keep some types as bytes).
        """
        extra = {"conv": conv} if conv is not None else {}
        extra.update({k: v for k, v in (("ssl", self.ssl), ("ssl_mode", self.ssl_mode)) if v})
        try:
            conn = MySQLdb.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                database=self.database,
                charset="utf8mb4",
                init_command="SET time_zone = '+00:00'",
                connect_timeout=self.connect_timeout,
                autocommit=True,
                **extra,
            )
        except MySQLdb.OperationalError as err:
            raise self._refusal(err) from None
        if mysql_tls_required(self.ssl, self.ssl_mode):
            self._check_encrypted(conn)
        return conn

    def _refusal(self, err: MySQLdb.OperationalError) -> Exception:
        """Say what to fix when the server refuses the login or the TLS handshake; other errors pass unchanged."""
        code, message = (err.args + ("",))[:2]
        where = f"MySQL server {self.host}:{self.port} refused user {self.user!r} ({code}: {message})"
        if code == _LOGIN_DENIED:
            hint = (
                "Check the connection's login and password."
                if self.ssl or self.ssl_mode
                else "Check the connection's login and password; a user created REQUIRE SSL is refused the same way "
                'when the connection does not ask for TLS: set its Extra ssl, e.g. {"ssl": {"ca": '
                '"/path/ca.pem"}}.'
            )
            return ServiceAccessError(f"{where}. {hint}")
        if "certificate" in str(message).lower() or "ssl" in str(message).lower() or "tls" in str(message).lower():
            return ServiceAccessError(
                f"{where}. The TLS handshake failed: put the CA that signed the server's "
                "certificate in the connection's Extra ssl.ca (and check ssl_mode)."
            )
        return err

    def _check_encrypted(self, conn: MySQLdb.connections.Connection) -> None:
        # mysqlclient built on MariaDB Connector/C connects in plaintext with ssl_mode=REQUIRED when the server
        # offers no TLS (seen with Connector/C 3.3): check the session instead of trusting the option.
        cur = conn.cursor()
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        row = cur.fetchone()
        cur.close()
        if not row or not row[1]:
            conn.close()
            raise SourceConfigurationError(
                f"The connection's TLS settings require encryption (ssl_mode={self.ssl_mode or 'from ssl'}) but the "
                f"session with {self.host}:{self.port} is not encrypted: enable TLS on the server (ssl_cert, "
                "ssl_key), or fix the connection's Extra 'ssl'/'ssl_mode'."
            )

    def replication_settings(self) -> dict[str, Any]:
        """Return PyMySQL connection settings (python-mysql-replication's ``connection_settings``), TLS included."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "passwd": self.password,
            "connect_timeout": self.connect_timeout,
            **pymysql_tls(self.ssl, self.ssl_mode),
        }


def read_chunk(
    conn: Any,
    is_mariadb: bool,
    schema: str,
    table: str,
    select: Sequence[str],
    key: Sequence[str],
    chunk: Chunk,
    fetch_rows: int = 10_000,
) -> tuple[BinlogPosition, Iterator[list[tuple]]]:
    """Open a snapshot, return its position and an iterator of row batches of ``chunk`` read inside it.

    Rows stream through a server-side cursor (``SSCursor``), so memory stays at one batch. The snapshot is
    rolled back when the iterator is exhausted.

    :param conn: a fresh connection (UTC session) used only for this chunk.
    :param is_mariadb: which snapshot path to use.
    :param schema: the database name.
    :param table: the table name.
    :param select: one SQL expression per output column (quoted names, or casts of them), in output order.
    :param key: the chunk key columns.
    :param chunk: the key range to read.
    :param fetch_rows: rows per batch.
    """
    position = begin_snapshot(conn.cursor(), is_mariadb)
    where, params = range_predicate(key, chunk)
    stream = conn.cursor(MySQLdb.cursors.SSCursor)
    stream.execute(f"SELECT {', '.join(select)} FROM {quote_table(schema, table)} WHERE {where}", params)

    def batches() -> Iterator[list[tuple]]:
        try:
            while batch := stream.fetchmany(fetch_rows):
                yield batch
        finally:
            stream.close()
            conn.rollback()

    return position, batches()
