"""Watermark reads of one MySQL/MariaDB table: preflight, the safe upper bound, and the window read.

Why a window is safe (docs/pitfalls.md#watermark-increments). A window is half-open,
``lower <= cursor < upper``, read in ONE consistent snapshot, and ``upper`` is the minimum of:

* the interval end (settlements over an Airflow data interval);
* the database clock minus ``safety_lag`` (NOW(6) of the reading session, never the worker's clock);
* the start of the oldest read-write transaction still open on the server (``information_schema.innodb_trx``
  ``trx_started``, converted from the SYSTEM zone it is shown in to the session zone) minus one second: ``trx_started`` has second precision and is
  stamped when InnoDB starts the transaction, a moment after the first statement's NOW(). A transaction
  that commits after the read writes cursor values at or after its start, so none of them can fall below
  ``upper``. The guard cannot tell which tables a transaction touches, so any open writer holds the window,
  InnoDB's own background transactions included (thread id 0: persistent statistics after DDL or bulk
  changes; seen on MariaDB 10.11). That only delays the window; ignoring thread 0 would also ignore XA
  transactions recovered in PREPARED state, which can still commit old cursor values.

The database clock is read first, then the guard, BEFORE the snapshot starts (and again inside it; the
minimum counts): a transaction that is not committed when the snapshot starts was either open at the guard's
first read (so it bounds ``upper``) or started after it, with cursor values after the database time of that
read, which is above ``upper`` (NOW() is fixed when a statement starts, and InnoDB starts the transaction
when that statement first locks an InnoDB table; the one-second margin, and ``safety_lag`` for transactions
not yet started, cover that gap).

A closed settlement interval (``interval_end`` at or below the clock minus ``safety_lag``) is not cut short by
an open writer: the rows it commits later would land in the next interval's batch, and a nightly report
would count them on the wrong night. The read waits instead (``open_transaction_timeout``) until every
transaction open at the guard's read that began before ``interval_end`` + the margin has ended, then takes
``upper = interval_end``. Writers that began later can only write values at or after their start, above
``interval_end``, so they neither hold the window nor fall into it. Known limit, not handled yet: a first statement that waits longer than that before InnoDB
starts its transaction (e.g. on a metadata lock behind DDL) can write a NOW() below ``upper``;
``information_schema.PROCESSLIST.TIME_MS`` of running statements would bound that case too.

``innodb_trx`` is a cache: InnoDB refills it only when nobody has read it for 100 ms (measured on MariaDB
10.11: a read right after another misses a transaction begun in between; a session polling every 50 ms kept
it stale for 3 s and counting). A stale answer would let a writer's row fall below ``upper`` unseen, so every
guard read checks that it refilled the cache itself: it reads inside a transaction of its own, with a unique
token in the statement's comment, and the answer counts only if its own row's ``trx_query`` holds that token
(the cache took the statement as it ran). A stale read is retried after a random 0.12-0.25 s pause (several
pipelines reading one server take turns). If no read is fresh within :data:`GUARD_FRESH_TIMEOUT` (a monitor
polling ``innodb_trx`` more often than every 100 ms), the log says so and the window relies on
``safety_lag``, as without the PROCESS privilege.
``upper`` is truncated to the column's fractional precision, so a row stored with a truncated NOW() in the
same second lands in the next window, never below a bound already read.

Id cursors (auto-increment or another monotonic allocator): ids are allocated at insert, not commit, so a
lower id can commit after a higher one. The read takes ``MAX(id)`` first, then the set of open read-write
transactions; any uncommitted id below that maximum was allocated before, by a transaction in that set.
The read waits until every one of them has ended, then snapshots: every id ``<= MAX`` is then committed (or
rolled back) and visible, so ``upper = MAX + 1``. Id cursors see inserts only; updates need a timestamp.

When ``innodb_trx`` is not readable (it needs the PROCESS privilege) the log says so and the window relies
on the safety lag alone (id cursors then wait ``safety_lag`` between MAX and the snapshot).

Assumed: cursor values come from the database clock at statement time (``DEFAULT``/``ON UPDATE
CURRENT_TIMESTAMP`` or ``NOW()``). Application-supplied timestamps need a safety lag larger than the gap
between the value and the commit. Hard deletes are invisible to any cursor: use the binlog (CDC) mode.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as dtime
from decimal import Decimal
from typing import Any

import MySQLdb

from exactly_once_provider.errors import SourceConfigurationError
from exactly_once_provider.source.identifiers import quote_identifier, quote_table

CURSOR_KINDS = ("timestamp", "id")
TIME_TYPES = ("timestamp", "datetime")
ID_TYPES = ("tinyint", "smallint", "mediumint", "int", "bigint")
# information_schema.innodb_trx needs PROCESS: access denied codes mean "not readable", not "no writers".
ACCESS_DENIED = {1044, 1142, 1227}
GUARD_MARGIN = timedelta(seconds=1)
# innodb_trx is refilled only after 100 ms without a reader; waiting a little longer makes our read refill it.
TRX_CACHE_IDLE = 0.12
# How long a guard read retries before it gives up on a fresh innodb_trx (someone else keeps it stale).
GUARD_FRESH_TIMEOUT = 5.0
CURSOR_FORMAT = "%Y-%m-%d %H:%M:%S.%f"


@dataclass(frozen=True)
class WatermarkTable:
    """A table checked for watermark reads: what to select and how the cursor compares."""

    schema: str
    table: str
    cursor_column: str
    cursor_kind: str
    data_type: str
    precision: int
    primary_key: tuple[str, ...]
    columns: tuple[str, ...]
    deleted_column: str | None
    session_time_zone: str
    warnings: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return quote_table(self.schema, self.table)


@dataclass(frozen=True)
class Window:
    """The rows of one window, read in one consistent snapshot, and its bounds."""

    lower: Any
    upper: Any
    upper_reason: str
    rows: list[dict[str, Any]]
    guard: str


def preflight(
    conn: Any,
    table: str,
    cursor_column: str,
    cursor_kind: str,
    deleted_column: str | None = None,
    datetime_time_zone: str | None = None,
) -> WatermarkTable:
    """
    Check that ``table`` can be read by watermark and return how; raise what to fix otherwise.

    :param conn: an open source connection (session time zone UTC).
    :param table: ``table`` or ``schema.table``.
    :param cursor_column: the cursor column.
    :param cursor_kind: ``"timestamp"`` (TIMESTAMP or DATETIME) or ``"id"`` (an integer type).
    :param deleted_column: a soft-delete flag column (rows with a true value are published as deletes).
    :param datetime_time_zone: the zone DATETIME cursor values are written in; default the server's
        ``@@global.time_zone``.
    """
    if cursor_kind not in CURSOR_KINDS:
        raise ValueError(
            f"cursor_kind={cursor_kind!r}: use 'timestamp' (TIMESTAMP/DATETIME column) or 'id' "
            "(monotonically assigned integer)."
        )
    cur = conn.cursor()
    schema, _, name = table.rpartition(".")
    if not schema:
        cur.execute("SELECT DATABASE()")
        schema = cur.fetchone()[0]
        if not schema:
            raise ValueError(f"table={table!r} has no schema and the connection has none: write 'schema.table'.")
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, DATETIME_PRECISION FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (schema, name),
    )
    columns = {row[0]: (row[1].lower(), row[2]) for row in cur.fetchall()}
    where = f"{quote_identifier(schema)}.{quote_identifier(name)}"
    if not columns:
        raise SourceConfigurationError(
            f"Table {where} does not exist or the connection's user cannot see it: check `table` and grant "
            "SELECT on it."
        )
    if cursor_column not in columns:
        raise SourceConfigurationError(
            f"Cursor column {quote_identifier(cursor_column)} is not in {where} (columns: "
            f"{', '.join(columns)}). Set cursor_column to an existing column, e.g. an `updated_at TIMESTAMP(6) "
            "NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)`."
        )
    data_type, precision = columns[cursor_column]
    allowed = TIME_TYPES if cursor_kind == "timestamp" else ID_TYPES
    if data_type not in allowed:
        hint = (
            "a TIMESTAMP(6) column maintained with DEFAULT/ON UPDATE CURRENT_TIMESTAMP(6)"
            if cursor_kind == "timestamp"
            else "an integer AUTO_INCREMENT (or sequence-assigned) column"
        )
        raise SourceConfigurationError(
            f"Cursor column {quote_identifier(cursor_column)} of {where} is {data_type.upper()}, which "
            f"cursor_kind={cursor_kind!r} does not support (it needs {' or '.join(t.upper() for t in allowed)}). "
            f"Use {hint}."
        )
    if deleted_column is not None and deleted_column not in columns:
        raise SourceConfigurationError(
            f"Soft-delete column {quote_identifier(deleted_column)} is not in {where}: set deleted_column to the "
            "flag column, or leave it unset."
        )
    cur.execute(
        "SELECT INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME FROM information_schema.STATISTICS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX",
        (schema, name),
    )
    indexes = cur.fetchall()
    if not any(seq == 1 and column == cursor_column for _, seq, column in indexes):
        raise SourceConfigurationError(
            f"No index of {where} starts with cursor column {quote_identifier(cursor_column)}: every window "
            f"would scan the whole table. Add one: ALTER TABLE {where} ADD INDEX "
            f"({quote_identifier(cursor_column)})."
        )
    primary_key = tuple(column for index, _, column in indexes if index == "PRIMARY")
    if not primary_key:
        raise SourceConfigurationError(
            f"{where} has no PRIMARY KEY: window records are keyed by it so downstream can upsert. Add one."
        )
    warnings: list[str] = []
    zone = "+00:00"
    if data_type == "datetime":
        zone = datetime_time_zone or _global_time_zone(cur)
        if _has_dst(cur, zone):
            warnings.append(
                f"Cursor column {quote_identifier(cursor_column)} of {where} is DATETIME in time zone {zone!r}, "
                "which observes daylight saving time: when clocks go back, an hour of values repeats and "
                "rows written in the second pass can sort before a bound already read. Use a TIMESTAMP "
                "column (UTC internally), or run the server in a zone without DST."
            )
    return WatermarkTable(
        schema,
        name,
        cursor_column,
        cursor_kind,
        data_type,
        int(precision or 0),
        primary_key,
        tuple(columns),
        deleted_column,
        zone,
        tuple(warnings),
    )


def _global_time_zone(cur: Any) -> str:
    cur.execute("SELECT @@global.time_zone")
    return cur.fetchone()[0]


def _has_dst(cur: Any, zone: str) -> bool:
    """Return whether ``zone`` has two UTC offsets in a year (January vs July), measured by the server."""
    cur.execute("SELECT @@session.time_zone")
    previous = cur.fetchone()[0]
    try:
        cur.execute("SET time_zone = %s", (zone,))
    except MySQLdb.MySQLError as err:
        raise SourceConfigurationError(
            f"The server does not know time zone {zone!r} ({err}): load its time zone tables "
            "(mariadb-tzinfo-to-sql) or set datetime_time_zone to an offset like '+08:00'."
        ) from err
    try:
        year = datetime.now().year
        cur.execute(
            "SELECT UNIX_TIMESTAMP(%s), UNIX_TIMESTAMP(%s)", (f"{year}-01-15 12:00:00", f"{year}-07-15 12:00:00")
        )
        january, july = cur.fetchone()
        return int(july) - int(january) != (datetime(year, 7, 15) - datetime(year, 1, 15)).total_seconds()
    finally:
        cur.execute("SET time_zone = %s", (previous,))


def format_cursor(value: Any) -> Any:
    """Return a cursor value as stored in the ledger (datetimes as text with microseconds, ids as int)."""
    if isinstance(value, datetime):
        return value.strftime(CURSOR_FORMAT)
    return None if value is None else int(value)


def parse_cursor(value: Any, cursor_kind: str) -> Any:
    """Return a ledger cursor value as the database driver expects it."""
    if value is None:
        return None
    return datetime.strptime(value, CURSOR_FORMAT) if cursor_kind == "timestamp" else int(value)


def truncate(value: datetime, precision: int) -> datetime:
    """Return ``value`` truncated to ``precision`` fractional digits (the column's precision)."""
    step = 10 ** (6 - precision)
    return value.replace(microsecond=value.microsecond - value.microsecond % step)


def read_window(
    conn: Any,
    spec: WatermarkTable,
    lower: Any,
    *,
    interval_end: datetime | None = None,
    safety_lag: float = 5.0,
    fixed_upper: Any = None,
    open_transaction_timeout: float = 300,
    log: Any,
) -> Window:
    """
    Read the next window ``[lower, upper)`` of ``spec`` in one consistent snapshot.

    :param conn: a source connection used for nothing else meanwhile.
    :param spec: the checked table (:func:`preflight`).
    :param lower: the last committed upper bound (driver type), None on the first window.
    :param interval_end: the data interval end, naive in the session zone (timestamp cursors only).
    :param safety_lag: seconds kept behind the database clock.
    :param fixed_upper: re-read recorded bounds ``[lower, fixed_upper)`` instead of computing ``upper``.
    :param open_transaction_timeout: seconds to wait for older open transactions to end (id cursors, and a
        closed ``interval_end``).
    :param log: the task logger.
    """
    cur = conn.cursor()
    cur.execute("SET time_zone = %s", (spec.session_time_zone,))
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    if fixed_upper is not None:
        upper, reason, guard = fixed_upper, "recorded", "bounds replayed from the ledger"
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
    elif spec.cursor_kind == "timestamp":
        upper, reason, guard = _timestamp_upper(cur, spec, interval_end, safety_lag, open_transaction_timeout, log)
    else:
        upper, reason, guard = _id_upper(cur, spec, safety_lag, open_transaction_timeout, log)
    if lower is not None and (upper is None or upper < lower):
        upper, reason = lower, "lower_bound"  # nothing safe beyond the last window yet: an empty window
    rows: list[dict[str, Any]] = []
    if upper is not None:
        column = quote_identifier(spec.cursor_column)
        order = ", ".join(quote_identifier(c) for c in (spec.cursor_column, *spec.primary_key))
        sql = (
            f"SELECT {', '.join(quote_identifier(c) for c in spec.columns)} FROM {spec.qualified} "
            f"WHERE {column} < %s" + (f" AND {column} >= %s" if lower is not None else "") + f" ORDER BY {order}"
        )
        cur.execute(sql, (upper,) if lower is None else (upper, lower))
        rows = [dict(zip(spec.columns, row)) for row in cur.fetchall()]
    conn.rollback()
    return Window(lower, upper, reason, rows, guard)


def _timestamp_upper(
    cur: Any, spec: WatermarkTable, interval_end: datetime | None, safety_lag: float, timeout: float, log: Any
) -> tuple[datetime, str, str]:
    cur.execute("SELECT NOW(6)")  # before the guard: a writer begun after the guard's read writes values above it
    now = cur.fetchone()[0]
    open_before = _open_transactions(cur, log)
    lag_bound = now - timedelta(seconds=safety_lag)
    waited = ""
    if open_before and interval_end is not None and interval_end <= lag_bound:
        # A closed interval: wait for its writers rather than move their rows to the next interval's batch.
        older = {trx for trx in open_before if trx[1] - GUARD_MARGIN < interval_end}
        if older:
            if _wait_until_ended(cur, older, timeout, f"cursor values below the interval end {interval_end}", log):
                open_before -= older  # ended: they no longer bound upper
            waited = f"waited for {len(older)} transaction(s) begun before the interval end; "
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
    inside = _open_transactions(cur, log, in_transaction=True)  # also in the read's own snapshot; the minimum counts
    candidates = [(lag_bound, "safety_lag")]
    if interval_end is not None:
        candidates.append((interval_end, "interval_end"))
    for transactions in (open_before, inside):
        if transactions:
            candidates.append((min(started for _, started in transactions) - GUARD_MARGIN, "open_transaction"))
    upper, reason = min(candidates, key=lambda c: c[0])
    return truncate(upper, spec.precision), reason, waited + _describe_guard(open_before)


def _id_upper(cur: Any, spec: WatermarkTable, safety_lag: float, timeout: float, log: Any) -> tuple[Any, str, str]:
    cur.execute(f"SELECT MAX({quote_identifier(spec.cursor_column)}) FROM {spec.qualified}")
    highest = cur.fetchone()[0]
    open_before = _open_transactions(cur, log)
    if open_before is None:
        time.sleep(safety_lag)  # no guard: give writers of ids <= MAX the lag to commit
        guard = f"off (innodb_trx not readable or kept stale); waited the safety lag of {safety_lag}s"
    else:
        if _wait_until_ended(cur, open_before, timeout, f"ids below {highest}", log):
            guard = "older open transactions ended" if open_before else "no open transaction"
        else:
            time.sleep(safety_lag)
            guard = f"went stale while waiting for older transactions; waited the safety lag of {safety_lag}s"
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
    return (None if highest is None else int(highest) + 1), "max_id", guard


def _wait_until_ended(cur: Any, transactions: set[tuple[int, datetime]], timeout: float, what: str, log: Any) -> bool:
    """
    Wait until every one of ``transactions`` (thread id, start) has ended; raise after ``timeout`` s.

    Returns False if the guard went blind meanwhile (no fresh ``innodb_trx`` read): the caller falls back to
    its safety lag.
    """
    pending = set(transactions)
    if pending:
        log.info(
            "Waiting for %d open transaction(s) that may still commit %s: %s",
            len(pending),
            what,
            ", ".join(f"thread {thread} since {started}" for thread, started in sorted(pending)),
        )
    deadline = time.monotonic() + timeout
    while pending:
        still_open = _open_transactions(cur, log)
        if still_open is None:
            return False
        pending &= still_open
        if not pending:
            return True
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Transactions {sorted(pending)} (thread id, started) stayed open over {timeout}s and may still "
                f"commit {what}. Find them with SHOW PROCESSLIST, or raise open_transaction_timeout."
            )
        time.sleep(0.2)
    return True


def _open_transactions(cur: Any, log: Any, in_transaction: bool = False) -> set[tuple[int, datetime]] | None:
    """
    Return the other sessions' open read-write transactions as (thread id, start in the session zone).

    Only an answer the read refilled itself counts (module docstring): the read runs in a transaction of its
    own (or the caller's, ``in_transaction``) so that it is listed, and its row must show this statement.
    ``trx_started`` is shown in the server's SYSTEM zone whatever the session zone (checked on MariaDB
    10.11), so it is turned into epoch seconds under ``time_zone = 'SYSTEM'`` and back into the session zone.
    Returns None if ``innodb_trx`` is not readable, or not fresh within :data:`GUARD_FRESH_TIMEOUT`.
    """
    cur.execute("SELECT @@session.time_zone, CONNECTION_ID()")
    zone, own_thread = cur.fetchone()
    cur.execute("SET time_zone = 'SYSTEM'")
    deadline = time.monotonic() + GUARD_FRESH_TIMEOUT
    try:
        pause = TRX_CACHE_IDLE  # let InnoDB refill its innodb_trx cache (module docstring)
        while True:
            time.sleep(pause)
            token = f"eo-guard {secrets.token_hex(8)}"
            found = _read_innodb_trx(cur, token, in_transaction)
            own = [row for row in found if row[0] == own_thread]
            if own and token in (own[0][3] or ""):
                break
            if time.monotonic() > deadline:
                log.warning(
                    "information_schema.innodb_trx stayed stale for %.0fs: another session reads it more often "
                    "than every 100 ms, so InnoDB does not refill it. The late-commit guard is off for this read "
                    "and the window relies on the safety lag alone; stop the frequent reader to enable it.",
                    GUARD_FRESH_TIMEOUT,
                )
                return None
            pause = random.uniform(TRX_CACHE_IDLE, 2 * TRX_CACHE_IDLE)  # readers of one server take turns
    except MySQLdb.OperationalError as err:
        if err.args[0] not in ACCESS_DENIED:
            raise
        log.warning(
            "Cannot read information_schema.innodb_trx (%s): the late-commit guard is off and the "
            "window relies on the safety lag alone. Grant PROCESS to the source user to enable it.",
            err,
        )
        return None
    finally:
        cur.execute("SET time_zone = %s", (zone,))
    result = set()
    for thread, epoch, read_only, _ in found:
        if thread == own_thread or read_only:
            continue
        cur.execute("SELECT FROM_UNIXTIME(%s)", (int(epoch),))
        result.add((int(thread), cur.fetchone()[0]))
    return result


def _read_innodb_trx(cur: Any, token: str, in_transaction: bool) -> list[tuple[int, int, int, str | None]]:
    """Read every transaction of ``innodb_trx`` (thread, started epoch, read only, query) with ``token``."""
    if not in_transaction:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")  # listed while it reads
    try:
        cur.execute(
            f"SELECT /* {token} */ trx_mysql_thread_id, UNIX_TIMESTAMP(trx_started), trx_is_read_only, trx_query "
            "FROM information_schema.innodb_trx"
        )
        return [(int(t), e, int(r), q) for t, e, r, q in cur.fetchall()]
    finally:
        if not in_transaction:
            cur.execute("COMMIT")


def _describe_guard(transactions: set[tuple[int, datetime]] | None) -> str:
    if transactions is None:
        return "off (innodb_trx not readable or kept stale); safety lag only"
    if not transactions:
        return "no open transaction"
    thread, started = min(transactions, key=lambda t: t[1])
    return f"oldest open transaction: thread {thread} since {started}"


def row_message(spec: WatermarkTable, row: dict[str, Any]) -> tuple[bytes, bytes]:
    """
    Return the Kafka (key, value) of one row: key = primary key JSON; value = op, cursor and the row.

    A row whose soft-delete flag is true is published with ``"op": "delete"``.
    """
    key = json.dumps(
        {c: row[c] for c in spec.primary_key}, default=_json_value, sort_keys=True, separators=(",", ":")
    ).encode()
    deleted = spec.deleted_column is not None and bool(row[spec.deleted_column])
    value = json.dumps(
        {
            "op": "delete" if deleted else "upsert",
            "table": f"{spec.schema}.{spec.table}",
            "cursor": format_cursor(row[spec.cursor_column]),
            "row": row,
        },
        default=_json_value,
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return key, value


def checksum(values: list[bytes]) -> str:
    """Return the checksum of a window: SHA-256 over its record values in read order."""
    digest = hashlib.sha256()
    for value in values:
        digest.update(len(value).to_bytes(8, "big"))
        digest.update(value)
    return f"sha256:{digest.hexdigest()}"


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.strftime(CURSOR_FORMAT)
    if isinstance(value, (date, dtime)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    raise TypeError(f"Cannot serialise {type(value).__name__} {value!r}")
