"""The binlog capture loop: source transactions -> change records -> Kafka transactions with the offset.

Where the guarantees live:

* **commit**: only the writer commits (:meth:`~exactly_once_provider.kafka.writer.PipelineWriter.submit_batch`,
  committed by ``PipelineWriter._commit_batch`` while the next batch is read): the change records of whole
  source transactions and the ledger record of the position after the last of them, in ONE Kafka transaction.
  A Kafka transaction may hold many source transactions, never part of one.
* **resume point**: the ledger (:mod:`exactly_once_provider.kafka.offsets`), read when the writer opens. Only a first
  run (no ledger record) starts from the full loads' handoff positions (the smallest chunk position).
* **handoff**: :class:`HandoffFilter` drops a change at or before the snapshot position of the chunk holding its
  key, until the transaction ends after the largest chunk position.

Ledger offset (JSON)::

    {"format": 1, "file": "binlog.000003", "pos": 4711,      # end of the last committed source transaction
     "gtid": "0-1-77", "tables": ["eo.orders", ...],        # its GTID; the captured tables when it was committed
     "server_id": 1,                                        # the server the file/position is on
     "gtid_pos": "0-1-77",                                  # MariaDB: last GTID of each domain (null: no GTIDs)
     "version_base": 0,                                     # added to change-record versions (raised at failover)
     "table_gtids": {"eo.orders": "0-1-75"},                # each table's last delivered change (GTID position)
     "handed_off": {"eo.orders": "load-id"}}                # full loads whose handoff the capture has passed

``server_id``, ``gtid_pos``, ``version_base``, ``table_gtids`` and ``handed_off`` are optional (older records lack them); where a
capture resumes and the divergence check are in :mod:`exactly_once_provider.capture.resume`.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from exactly_once_provider.capture.change_record import records_of, schema_record
from exactly_once_provider.errors import PipelineError
from exactly_once_provider.faults import fault_point
from exactly_once_provider.full_load.handoff import Handoff
from exactly_once_provider.kafka.writer import Message, PipelineWriter, TransactionPolicy
from exactly_once_provider.positions import BinlogPosition, parse_position
from exactly_once_provider.source.binlog import SchemaChange, SourceTransaction, TableName, removes_tables
from exactly_once_provider.source.gtid import Gtid, advance
from exactly_once_provider.source.gtid import format_position as gtid_text

if TYPE_CHECKING:
    from exactly_once_provider.capture.resume import Resume
    from exactly_once_provider.source.server import MySqlBinlogSource

OFFSET_FORMAT = 1
MODES = ("bounded", "continuous")
# A row costs ~10 container objects that live until its Kafka commit (image dicts, row and record tuples,
# messages); at the default gen-0 threshold (700) the collector re-scans the pending batch every ~50 rows.
# None of them form cycles, so while capturing the collector runs every 50,000 allocations instead
# (measured: ~8 % less CPU per row; `make bench-capture`).
CAPTURE_GC_THRESHOLD = 50_000
log = logging.getLogger(__name__)


class CaptureStoppedError(PipelineError):
    """Raise when the capture stops at a statement the stream cannot follow (everything before it is committed).

    A :class:`~exactly_once_provider.errors.PipelineError`: the operator fails its task with it (as an
    ``AirflowException``); this module stays free of Airflow.
    """


class HandoffFilter:
    """
    Drops changes already in a table's full load: at or before the snapshot position of the key's chunk.

    :param handoffs: the full loads of the tables that have one.
    :param locators: ``{table: key -> chunk index}`` for keys Python cannot order like the server (string keys
        under a collation: :class:`~exactly_once_provider.source.snapshot.ServerChunkLocator`); the other
        tables bisect the chunk bounds in Python.
    """

    def __init__(
        self, handoffs: dict[TableName, Handoff], locators: dict[TableName, Callable[[tuple], int]] | None = None
    ) -> None:
        self._tables = {}
        for name, handoff in handoffs.items():
            chunks = sorted(handoff.chunks, key=lambda c: c.chunk.index)
            uppers = [c.chunk.upper for c in chunks[:-1]]
            locate = (locators or {}).get(name) or functools.partial(bisect.bisect_left, uppers)
            self._tables[name] = (locate, [c.position for c in chunks], handoff.max_position)
        self.dropped = 0

    def active(self, end: BinlogPosition) -> bool:
        """Return whether a transaction ending at ``end`` may still hold changes already loaded."""
        return any(end <= highest for _, _, highest in self._tables.values())

    def already_loaded(self, table: TableName, key: tuple, end: BinlogPosition) -> bool:
        """Return whether the change of ``key`` in a transaction ending at ``end`` is in the snapshot."""
        entry = self._tables.get(table)
        if entry is None:
            return False
        locate, positions, highest = entry
        if end > highest:
            return False
        # chunk i holds lower_i < key <= upper_i, with lower_i = upper_(i-1): the first upper >= key.
        return end <= positions[locate(key)]


@dataclass
class CaptureStats:
    """What a capture run did (mirrored to XCom and the task log)."""

    transactions: int = 0
    rows: int = 0
    dropped_by_handoff: int = 0
    kafka_transactions: int = 0
    schema_changes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class CaptureRequest:
    """
    What to capture and how.

    :param tables: ``{(schema, table): key columns}``.
    :param topics: ``{(schema, table): topic}``.
    :param handoffs: the full loads of the tables that have one.
    :param start_position: where a first run starts when some table has no full load.
    :param mode: ``bounded`` (up to the binlog end seen at start) or ``continuous``.
    :param max_runtime: continuous: seconds before finishing (after a commit).
    :param policy: Kafka transaction size / interval.
    :param server_id: the replica server id of the binlog reader.
    :param progress_interval: seconds between progress lines.
    :param heartbeat_seconds: continuous: how often an idle stream wakes up.
    :param chunk_locators: ``{table: key -> chunk index}`` where the server orders the key (see
        :class:`HandoffFilter`).
    :param on_drop: what a ``DROP TABLE`` (or a rename) of a captured table does: ``fail`` stops the capture
        before it, asking for a reload; ``stop`` stops following that table from there (everything before the
        statement is captured; its later rows, a table created again under the name included, are not, and the
        ledger no longer lists it: captured again only after a new full load of it).
    """

    tables: dict[TableName, tuple[str, ...]]
    topics: dict[TableName, str]
    handoffs: dict[TableName, Handoff]
    start_position: BinlogPosition | None
    mode: str
    max_runtime: float | None
    policy: TransactionPolicy
    server_id: int
    progress_interval: float = 10.0
    heartbeat_seconds: float = 1.0
    chunk_locators: dict[TableName, Callable[[tuple], int]] = field(default_factory=dict)
    on_drop: str = "fail"

    @property
    def table_names(self) -> list[str]:
        return sorted(f"{s}.{t}" for s, t in self.tables)


@dataclass(frozen=True)
class CaptureResult:
    """The committed position after the run, and what the run did."""

    position: BinlogPosition
    gtid: str | None
    stats: CaptureStats
    resumed_from: BinlogPosition
    first_run: bool


def resolve_resume(source: MySqlBinlogSource, request: CaptureRequest, committed: Any) -> Resume:
    """Return where this run resumes (:func:`exactly_once_provider.capture.resume.resolve`)."""
    from exactly_once_provider.capture.resume import resolve

    return resolve(source, request, committed)


def start_position(request: CaptureRequest, committed: Any, check_tables: bool = True) -> tuple[BinlogPosition, bool]:
    """
    Return where to read from: the ledger's offset, or (first run) the smallest handoff/start position.

    Where the ledger's offset is on another server (a failover), :mod:`exactly_once_provider.capture.resume`
    finds the place on the server the connection names.

    :param request: the capture request.
    :param committed: the writer's last committed ledger record (or None).
    :param check_tables: refuse tables added behind the ledger's position (only meaningful on its server).
    """
    if committed is not None:
        offset = committed.offset
        if not isinstance(offset, dict) or offset.get("format") != OFFSET_FORMAT:
            raise ValueError(
                f"The ledger of this pipeline holds {offset!r}, not a binlog capture offset: another "
                "kind of pipeline uses the same pipeline/source_partition name. Use a new name."
            )
        position = parse_position(offset)
        known = set(offset.get("tables", []))
        for (schema, table), handoff in request.handoffs.items() if check_tables else ():
            name = f"{schema}.{table}"
            if name not in known and handoff.min_position < position:
                raise ValueError(
                    f"Table {name} was added to a capture already at {position}, but its full load's snapshot is at "
                    f"{handoff.min_position}: changes between the two would be lost. Capture it in a new pipeline, "
                    "or run its full load again so its snapshot is after the capture's position (the history -> "
                    f"stream template: trigger it with resnapshot=[{table!r}])."
                )
        return position, False
    candidates = [h.min_position for h in request.handoffs.values()]
    if len(request.handoffs) < len(request.tables):
        if request.start_position is None:
            missing = sorted(f"{s}.{t}" for s, t in request.tables if (s, t) not in request.handoffs)
            raise ValueError(
                f"Tables {missing} have no full load (full_load_paths) and no start_position is "
                "given: the first run would not know where their changes begin. Run their full "
                "load, or pass start_position='FILE:POS' to capture changes only."
            )
        candidates.append(request.start_position)
    return min(candidates, key=lambda p: p.sort_key), True


_gc_lock = threading.Lock()
_gc_captures: list[tuple[int, ...]] = []  # the threshold before the first running capture, one entry per capture


@contextlib.contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """Raise the collector's gen-0 threshold to :data:`CAPTURE_GC_THRESHOLD` while captures run; restore it after
    the last one (captures in several threads of one process)."""
    with _gc_lock:
        before = _gc_captures[0] if _gc_captures else gc.get_threshold()
        _gc_captures.append(before)
        gc.set_threshold(max(before[0], CAPTURE_GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        with _gc_lock:
            _gc_captures.pop()
            if not _gc_captures:
                gc.set_threshold(*before)


@_fewer_gc_passes()  # see CAPTURE_GC_THRESHOLD
def run_capture(
    source: MySqlBinlogSource,
    writer: PipelineWriter,
    request: CaptureRequest,
    should_stop: Callable[[], bool] = lambda: False,
    progress_log: Any = log,
) -> CaptureResult:
    """
    Capture the binlog into Kafka until the mode says stop; return the committed position.

    :param source: the source server's binlog (the operator passes its hook).
    :param writer: an open pipeline writer (its ledger record is the resume point).
    :param request: what to capture.
    :param should_stop: polled between transactions and at heartbeats (continuous mode's stop signal).
    :param progress_log: where progress lines go (the task log).
    """
    where = resolve_resume(source, request, writer.last_committed)  # divergence check first: may refuse
    resume, first_run = where.position, where.first_run
    source.check_capture(resume)
    until = source.binlog_end() if request.mode == "bounded" else None
    deadline = time.monotonic() + request.max_runtime if request.max_runtime else None
    # A handoff the capture has passed is never compared again: after a failover its positions are another
    # server's coordinates. The rest are passed once the committed position reaches their largest chunk position.
    handed_off = dict(where.handed_off)
    pending_handoffs = {n: h for n, h in request.handoffs.items() if handed_off.get(f"{n[0]}.{n[1]}") != h.load_id}
    from exactly_once_provider.capture.resume import check_full_loads

    check_full_loads(where.version_base, where.server_id, pending_handoffs, writer.pipeline)  # versions compare
    handoff = HandoffFilter(pending_handoffs, request.chunk_locators)
    stats = CaptureStats()
    progress_log.info(
        "Capturing %s from %s (%s)%s",
        ", ".join(request.table_names),
        resume,
        where.how,
        f" up to the binlog end {until}"
        if until
        else f", continuous for {request.max_runtime}s"
        if request.max_runtime
        else ", continuous until stopped",
    )
    gtids = dict(where.gtid_position) if where.gtid_position is not None else None
    table_gtids = {name: dict(at) for name, at in (where.table_gtids or {}).items()}
    base = where.version_base
    batch: list[Message] = []
    batch_txns = 0
    position = resume
    gtid = writer.last_committed.offset.get("gtid") if writer.last_committed is not None else None
    committed_position = resume if not first_run else None
    last_commit = time.monotonic()
    next_progress = time.monotonic() + request.progress_interval
    reader = source.reader(request.tables, request.server_id, request.heartbeat_seconds)
    dropped: set[TableName] = set()  # on_drop="stop": tables no longer followed from their DROP on
    dropped_names: set[str] = set()

    submitted_position = committed_position

    def commit() -> None:
        # The Kafka commit of the batch finishes in the writer's background thread while the next transactions
        # are read; committed_position moves only once the writer reports that commit returned (settle()).
        nonlocal batch, batch_txns, last_commit, committed_position, submitted_position
        if position == submitted_position and not batch:
            return
        handed_off.update(
            {f"{s}.{t}": h.load_id for (s, t), h in pending_handoffs.items() if position >= h.max_position}
        )
        offset = {
            "format": OFFSET_FORMAT,
            **position.to_json(),
            "gtid": gtid,
            "tables": [n for n in request.table_names if n not in dropped_names],
            "handed_off": handed_off,
            "server_id": where.server_id,
            "gtid_pos": gtid_text(gtids) if gtids else None,
            "version_base": base,
            "table_gtids": {name: gtid_text(at) for name, at in table_gtids.items()},
        }
        if writer.submit_batch(next(iter(request.topics.values())), batch, offset) is not None:
            committed_position = submitted_position
        submitted_position = position
        stats.kafka_transactions += 1
        batch, batch_txns, last_commit = [], 0, time.monotonic()

    def settle() -> None:
        nonlocal committed_position
        if writer.wait() is not None:
            committed_position = submitted_position

    try:
        for item in reader.transactions(resume, until, blocking=request.mode == "continuous"):
            if isinstance(item, SchemaChange):
                gone = _dropped(item, request, dropped, progress_log)
                if gone or (dropped and set(item.tables) <= dropped):  # a DDL of tables no longer followed
                    dropped |= gone
                    dropped_names |= {f"{s}.{t}" for s, t in gone}
                    if gone:
                        stats.schema_changes.append(f"{item.end}: {item.query[:200]} (no longer followed)")
                    position, gtid = item.end, item.gtid or gtid
                    if item.gtid and gtids is not None:
                        advance(gtids, item.gtid)
                    continue
                stop = _schema_change(item, request, stats, progress_log)
                if stop is not None:
                    stats.rows += len(batch)
                    commit()  # everything before the statement; the position stays before it
                    settle()
                    raise stop
                if item.kind == "alter" and not _covered(item, request):
                    # A typed sink evolves its columns from the statement (spark_jobs.schema_change).
                    batch.extend(schema_record(item, request.topics))
                    fault_point("capture_schema_change")  # read, in the open transaction, not yet committed
                position, gtid = item.end, item.gtid or gtid
                if item.gtid and gtids is not None:
                    advance(gtids, item.gtid)
            elif isinstance(item, SourceTransaction):
                last = Gtid.parse(item.gtid) if item.gtid and gtids is not None else None
                if item.rows:
                    if last is not None:
                        for schema, table in item.tables:
                            table_gtids.setdefault(f"{schema}.{table}", {})[last.domain] = last
                    if dropped and dropped.intersection(item.tables):  # rows of a table created again
                        item = _without(item, dropped)
                    if handoff.active(item.end):
                        for record in records_of(item, request.topics, base):
                            if handoff.already_loaded((record.schema, record.table), record.key_values, item.end):
                                stats.dropped_by_handoff += 1
                                continue
                            batch.append(record)
                    else:
                        batch.extend(records_of(item, request.topics, base))  # a ChangeRecord is a Message
                    stats.transactions += 1
                    batch_txns += 1
                position, gtid = item.end, item.gtid or gtid
                if last is not None:
                    gtids[last.domain] = last
            now = time.monotonic()
            if (
                len(batch) >= request.policy.max_records
                or (now - last_commit) * 1000 >= request.policy.commit_interval_ms
            ):
                stats.rows += len(batch)
                commit()
            if now >= next_progress:
                _progress(source, stats, position, committed_position, len(batch), progress_log)
                next_progress = now + request.progress_interval
            if (deadline is not None and now >= deadline) or should_stop():
                break
        stats.rows += len(batch)
        commit()
        settle()
    finally:
        reader.close()
    _progress(source, stats, position, committed_position, 0, progress_log)
    return CaptureResult(position, gtid, stats, resume, first_run)


def _dropped(
    change: SchemaChange, request: CaptureRequest, dropped: set[TableName], progress_log: Any
) -> set[TableName]:
    """Return the captured tables a DROP/RENAME stops following (``on_drop="stop"``), empty when it does not."""
    followed = {n for n in change.tables if n in request.tables and n not in dropped}
    if request.on_drop != "stop" or not followed or _covered(change, request) or not removes_tables(change.query):
        return set()
    others = set(change.tables) - followed - dropped
    if any(n in request.tables for n in others):  # e.g. a rename onto a followed table: not a plain end
        return set()
    progress_log.warning(
        "%s at %s ends table(s) %s: everything before it is captured; no longer followed (their current tables "
        "keep their last state; a table created again under the name is followed after a new full load of it).",
        change.query[:200],
        change.end,
        ", ".join(f"{s}.{t}" for s, t in sorted(followed)),
    )
    return followed


def _without(transaction: SourceTransaction, dropped: set[TableName]) -> SourceTransaction:
    """Return the transaction without the rows of tables no longer followed."""
    rows = [r for r in transaction.rows if (r.shape.schema, r.shape.table) not in dropped]
    return replace(transaction, rows=rows, tables=transaction.tables - dropped)


def _covered(change: SchemaChange, request: CaptureRequest) -> bool:
    """Return whether the statement is before the full load's snapshot of every table it touches."""
    return all(
        (s, t) in request.handoffs and change.end <= request.handoffs[(s, t)].min_position for s, t in change.tables
    )


def _schema_change(
    change: SchemaChange, request: CaptureRequest, stats: CaptureStats, progress_log: Any
) -> CaptureStoppedError | None:
    """Log a DDL on a captured table; return the error to stop with if the stream cannot follow it."""
    names = ", ".join(f"{s}.{t}" for s, t in change.tables)
    if _covered(change, request):
        progress_log.info(
            "DDL at %s on %s is before the full load's snapshot; skipped: %s", change.end, names, change.query[:200]
        )
        return None
    if change.kind == "alter":
        stats.schema_changes.append(f"{change.end}: {change.query[:200]}")
        progress_log.warning(
            "Schema change at %s on %s: %s. Following records carry a new schema_version "
            "(column names come from the binlog's row metadata).",
            change.end,
            names,
            change.query[:200],
        )
        return None
    return CaptureStoppedError(
        f"{change.query[:200]!r} at {change.end} changes or removes rows of captured table(s) {names} without row "
        "events, so the stream alone can no longer rebuild them. Everything before it is committed. Run a full "
        "reload of these tables (trigger with full_reload=true): the capture continues past this statement once "
        "their snapshot is after it."
    )


def _progress(
    source: MySqlBinlogSource,
    stats: CaptureStats,
    position: BinlogPosition,
    committed: BinlogPosition | None,
    pending: int,
    progress_log: Any,
) -> None:
    try:
        lag_bytes, lag_files = source.lag(position)
        lag = f"{lag_bytes} bytes / {lag_files} files behind the binlog end"
    except Exception as err:  # noqa: BLE001 - progress must never stop the capture
        lag = f"lag unknown ({err.__class__.__name__})"
    seconds = stats.seconds
    progress_log.info(
        "capture: %d transactions, %d rows committed (%.0f rows/s), %d pending, %d dropped as already loaded, "
        "%d Kafka transactions; read up to %s, committed %s; %s",
        stats.transactions,
        stats.rows,
        stats.rows / seconds if seconds > 0 else 0.0,
        pending,
        stats.dropped_by_handoff,
        stats.kafka_transactions,
        position,
        committed or "nothing yet",
        lag,
    )
