"""Read one chunk in its own MariaDB consistent snapshot straight into Arrow (connectorx), with its position.

The row reader (:func:`~exactly_once_provider.source.snapshot.read_chunk`) makes a Python object of every
value before Arrow sees it; on the full load's benchmark that alone cost about what ``mysqldump`` spends on the
whole table. connectorx reads the server's binary-protocol rows into Arrow columns in native code.

The snapshot and its position stay exact: connectorx runs its ``pre_execution_query`` statements in the
session that then runs the query, so the session opens the snapshot with
:data:`~exactly_once_provider.source.snapshot.MARIADB_SNAPSHOT_STATEMENTS`, stores that snapshot's
``binlog_snapshot_file:position`` in a session variable, and the query hands it back on its first row only
(one extra column, NULL on every other row). A chunk with no rows carries no position: the caller reads it
with the row reader instead (a new snapshot is as good as any other for a chunk: each chunk only needs
its rows and the position of the snapshot they were read in).

MariaDB only: MySQL's exact position needs ``SHOW BINARY LOG STATUS`` under a read lock, whose result a
pre-execution statement cannot return.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from urllib.parse import quote, urlencode

import pyarrow as pa

from exactly_once_provider.connections import connectorx_tls_query
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.identifiers import quote_table, sql_literal
from exactly_once_provider.source.snapshot import (
    MARIADB_SNAPSHOT_STATEMENTS,
    Chunk,
    ConnectionSettings,
    range_predicate,
    snapshot_position,
)

_POSITION_STATEMENTS = (
    "SELECT CONCAT(MAX(IF(VARIABLE_NAME = 'BINLOG_SNAPSHOT_FILE', VARIABLE_VALUE, NULL)), ':',"
    " MAX(IF(VARIABLE_NAME = 'BINLOG_SNAPSHOT_POSITION', VARIABLE_VALUE, NULL))) INTO @eo_snapshot_position"
    " FROM information_schema.SESSION_STATUS"
    " WHERE VARIABLE_NAME IN ('BINLOG_SNAPSHOT_FILE', 'BINLOG_SNAPSHOT_POSITION')",
    "SET @eo_row = 0",
)
# The first row's extra column: the snapshot position; every later row's: NULL (one byte on the wire).
_POSITION_COLUMN = "IF((@eo_row := @eo_row + 1) = 1, CAST(@eo_snapshot_position AS CHAR), NULL)"


class NativeReadError(Exception):
    """connectorx could not read or convert the chunk (a value it has no Arrow form for, a lost connection)."""


def connection_url(settings: ConnectionSettings) -> str:
    """Return the connectorx URL of ``settings`` (TCP to the configured host and port, never a local socket).

    It holds the password: pass it to connectorx only, never to a log line.
    """
    user, password = quote(settings.user, safe=""), quote(settings.password, safe="")
    query = {
        "prefer_socket": "false",
        "tcp_connect_timeout_ms": str(settings.connect_timeout * 1000),
        **connectorx_tls_query(settings.ssl, settings.ssl_mode),
    }
    return (
        f"mysql://{user}:{password}@{settings.host}:{settings.port}/{quote(settings.database, safe='')}"
        f"?{urlencode(query, quote_via=quote)}"
    )


def chunk_query(schema: str, table: str, select: Sequence[str], key: Sequence[str], chunk: Chunk) -> str:
    """Return the chunk's query: ``select`` expressions, then the position column, rows of ``chunk`` only."""
    where, _ = range_predicate(key, chunk, literal=sql_literal)
    return f"SELECT {', '.join([*select, _POSITION_COLUMN])} FROM {quote_table(schema, table)} WHERE {where}"


def read_chunk_arrow(
    settings: ConnectionSettings,
    schema: str,
    table: str,
    select: Sequence[str],
    key: Sequence[str],
    chunk: Chunk,
    batch_rows: int,
) -> tuple[BinlogPosition | None, Iterator[pa.RecordBatch]]:
    """Open a snapshot, return its position and the chunk's record batches (``select`` columns) read inside it.

    The position is None when the chunk has no rows (read it with the row reader). Raises
    :class:`NativeReadError` when connectorx fails, before or while the batches are read.

    :param settings: the connection settings (executor side).
    :param schema: the database name.
    :param table: the table name.
    :param select: one SQL expression per output column (quoted names, or casts of them).
    :param key: the chunk key columns.
    :param chunk: the key range to read.
    :param batch_rows: rows per record batch at most.
    """
    import connectorx

    pre = ["SET NAMES utf8mb4", "SET time_zone = '+00:00'", *MARIADB_SNAPSHOT_STATEMENTS, *_POSITION_STATEMENTS]
    try:
        reader = connectorx.read_sql(
            connection_url(settings),
            chunk_query(schema, table, select, key, chunk),
            return_type="arrow_stream",
            protocol="binary",
            pre_execution_query=pre,
            batch_size=batch_rows,
        )
    except BaseException as error:  # connectorx raises a pyo3 PanicException (a BaseException) on bad values
        raise _native_error(error, settings.password) from None
    batches = _batches(reader, len(select), settings.password)
    first = next(batches, None)
    if first is None:
        return None, iter(())
    found = first.column(len(select))
    if found.null_count == len(found) or found[0].as_py() is None:
        raise NativeReadError("The chunk's first row did not carry the snapshot position.")
    file, _, pos = found[0].as_py().rpartition(":")
    position = snapshot_position(file, pos)
    return position, (b.drop_columns([b.schema.names[-1]]) for b in itertools.chain([first], batches))


def _batches(reader, width: int, secret: str) -> Iterator[pa.RecordBatch]:
    """Yield the non-empty batches of ``reader``, turning connectorx's failures into :class:`NativeReadError`."""
    try:
        for batch in reader:
            if batch.num_columns != width + 1:
                raise NativeReadError(f"connectorx returned {batch.num_columns} columns, expected {width + 1}.")
            if batch.num_rows:
                yield batch
    except NativeReadError:
        raise
    except BaseException as error:
        raise _native_error(error, secret) from None


def _native_error(error: BaseException, secret: str) -> BaseException:
    """Return ``error`` as a :class:`NativeReadError` (interrupts stay themselves), the password masked."""
    if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return error
    text = (str(error).splitlines() or [""])[0][:500]
    for form in {secret, quote(secret, safe="")} - {""}:
        text = text.replace(form, "***")  # connectorx names the failing value, not the URL; masked regardless
    return NativeReadError(f"{type(error).__name__}: {text}")
