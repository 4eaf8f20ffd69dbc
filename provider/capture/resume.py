"""Where a capture resumes, on whichever server the connection names: THE place of the resume decision.

The ledger record of every commit (:mod:`exactly_once_provider.capture.loop`) holds the binlog file/position
after the last delivered transaction, the ``server_id`` it was read from and, on MariaDB, the GTID position
there (``gtid_pos``: the last GTID of each domain). At every resume, before anything is written:

1. **Divergence check** (MariaDB): every GTID the ledger shows as delivered must be in the server's binlog
   (``gtid_binlog_state``, :func:`exactly_once_provider.source.gtid.missing`). A promoted replica that lost the
   old primary's last commits does not hold them, yet the lake does: the capture stops with
   :class:`DivergedSourceError`, naming the missing GTIDs and the tables they touched. Nothing is written.
2. **Same server** (the recorded ``server_id`` is this server's): resume by file/position, as before. It is
   the exact place the previous run stopped, needs no binlog scan (``BINLOG_GTID_POS`` reads the file from its
   start), and step 1 has already caught a binlog that was reset or restored under the same server id.
3. **Another server** (a failover: the connection's host now names the new primary): resume by GTID. The
   server finds the first transaction after the ledger's GTID position (a GTID dump in strict mode) and
   ``BINLOG_GTID_POS`` there must equal that position. From then on the capture reads that server by
   file/position like any other run, and the next ledger record names it. The stream itself is never read in
   python-mysql-replication's GTID mode: its reconnect there resends the first GTID and repeats events (#367),
   while the reader's file/position restarts at transaction boundaries are tested (:mod:`exactly_once_provider.source.binlog`).
   Change-record versions (``file_index * 2**32 + offset``) of another server's binlog are not comparable with
   the old server's, so the ledger carries a ``version_base`` added to every version: raised at a failover so
   the first change on the new server is newer than everything delivered before ("newer version wins" in the
   current table keeps holding). Resuming by file/position on another server, or on a server without GTIDs,
   is refused: the same file/position names other transactions there.

Ledger records written before this (no ``server_id``/``gtid_pos``) resume on the same server as before; when they
hold the last transaction's GTID, the position is checked against it with ``BINLOG_GTID_POS`` first.

The capture loop runs this without Airflow: a refused resume raises :class:`~exactly_once_provider.errors.PipelineError`
(the operator fails its task with it as an ``AirflowException``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exactly_once_provider.errors import PipelineError
from exactly_once_provider.positions import BinlogPosition, parse_position
from exactly_once_provider.source import gtid

if TYPE_CHECKING:
    from exactly_once_provider.capture.loop import CaptureRequest
    from exactly_once_provider.source.server import MySqlBinlogSource


class DivergedSourceError(PipelineError):
    """Raise when the source server lacks transactions the capture already delivered downstream."""


def failover_base(offset: dict) -> int:
    """Return the version base of a capture moving to another server from the ledger record ``offset``.

    The new base is the old one plus the version of the record's position (after the last delivered change):
    every version read on the new server (its binlog coordinates plus the base) is then larger than every
    version delivered before. It depends on the ledger record only, so a full load taken on the new server
    before the capture resumed there (:func:`full_load_version_base`) finds the same base the capture will take.

    :param offset: the capture's last committed ledger record (written on another server).
    """
    return int(offset.get("version_base") or 0) + parse_position(offset).version


def full_load_version_base(hook: MySqlBinlogSource, committed: Any) -> tuple[int, int]:
    """
    Return ``(version_base, server_id)`` a full load's rows must carry to compare with the capture's changes.

    A full load's rows carry their snapshot's version (binlog coordinates of the server it reads) plus the
    capture's version base on that server: the ledger's base when the capture reads this server (or never
    committed), the base the capture will take when it resumes here after a failover (:func:`failover_base`).
    The capture checks at its handoff that the load used its base (:func:`check_full_loads`).

    :param hook: the binlog hook of the server the full load reads.
    :param committed: the capture's last committed ledger record (or None).
    :raises DivergedSourceError: after a failover, the server lacks delivered transactions.
    """
    server = hook.server_identity()
    if committed is None:
        return 0, server.server_id
    offset = committed.offset
    recorded, base = offset.get("server_id"), int(offset.get("version_base") or 0)
    if recorded is None or recorded == server.server_id:
        return base, server.server_id
    delivered = _delivered(offset)
    if server.is_mariadb and delivered:
        table_gtids = {name: gtid.parse_position(text) for name, text in (offset.get("table_gtids") or {}).items()}
        check_divergence(delivered, server, table_gtids, offset)
    # Without GTIDs the capture refuses to resume here anyway (resolve); the base is what it would take.
    return failover_base(offset), server.server_id


def check_full_loads(version_base: int, server_id: int, pending: dict[tuple[str, str], Any], pipeline: str) -> None:
    """Refuse full loads whose rows' versions do not compare with the capture's: THE check of a load's base.

    A full load's rows carry its snapshot version plus the version base it took (:func:`full_load_version_base`);
    the capture's changes carry their binlog coordinates plus the ledger's base. They compare only if the load
    was taken on the server the capture reads, with the same base. Otherwise changes read before the snapshot
    but not yet merged could overwrite newer rows (or newer changes lose against older rows), so the capture
    stops before writing anything.

    :param version_base: the capture's version base on the server it reads.
    :param server_id: that server's ``server_id``.
    :param pending: the full loads whose handoff the capture has not passed, ``{(schema, table): handoff}``.
    :param pipeline: the capture's pipeline (named in the message).
    """
    wrong = {
        name: h
        for name, h in pending.items()
        if h.version_base != version_base or (h.server_id is not None and h.server_id != server_id)
    }
    if not wrong:
        return
    tables = "; ".join(
        f"{s}.{t} (load {h.load_id}: version base {h.version_base} on server_id "
        f"{h.server_id if h.server_id is not None else 'not recorded'})"
        for (s, t), h in sorted(wrong.items())
    )
    raise PipelineError(
        f"Capture {pipeline!r} reads server_id {server_id} with version base {version_base}, but full loads "
        f"still to hand off were taken with another base or on another server: {tables}. Their rows' versions "
        "do not compare with the capture's, so changes could overwrite newer rows. Nothing was written. This "
        "happens when the full load ran without capture_pipeline (it then takes base 0), or when the capture "
        "committed (or moved to another server) between the full load and this run. Run the full load again "
        "(trigger the DAG with full_reload=true); see docs/failover.md."
    )


@dataclass(frozen=True)
class Resume:
    """Where and how a capture run starts.

    :param position: the binlog position on the server the connection names.
    :param first_run: no ledger record yet.
    :param gtid_position: the GTID position there (MariaDB), tracked through the run into the ledger.
    :param server_id: the server's ``server_id``.
    :param version_base: added to every change-record version (raised at a failover).
    :param table_gtids: ``{"schema.table": GTID position of its last delivered change}``, from the ledger.
    :param handed_off: ``{"schema.table": load id}`` of the full loads whose handoff the capture has passed
        (ledger). Their positions are never compared again: after a failover they are another server's
        coordinates. A new full load of the table (``full_reload``) has a new load id and is filtered as usual.
    :param how: how the position was found, for the task log.
    """

    position: BinlogPosition
    first_run: bool
    gtid_position: gtid.GtidPosition | None
    server_id: int
    version_base: int = 0
    table_gtids: dict[str, gtid.GtidPosition] | None = None
    handed_off: dict[str, str] = field(default_factory=dict)
    how: str = ""


def resolve(hook: MySqlBinlogSource, request: CaptureRequest, committed: Any) -> Resume:
    """
    Return where to resume, after the divergence check; refuse a resume that would lose or repeat changes.

    :param hook: the binlog hook of the server the connection names.
    :param request: the capture request.
    :param committed: the writer's last committed ledger record (or None).
    :raises DivergedSourceError: the server lacks delivered transactions.
    """
    from exactly_once_provider.capture.loop import start_position  # the ledger format's parser

    server = hook.server_identity()
    position, first_run = start_position(request, committed, check_tables=committed is None)
    if first_run:
        at = _gtids_at(hook, position) if server.is_mariadb else None
        return Resume(
            position, True, at, server.server_id, how="first run: smallest full-load snapshot or start_position"
        )
    offset = committed.offset
    recorded = offset.get("server_id")
    delivered = _delivered(offset)
    table_gtids = {name: gtid.parse_position(text) for name, text in (offset.get("table_gtids") or {}).items()}
    base = int(offset.get("version_base") or 0)
    handed_off = dict(offset.get("handed_off") or {})
    if server.is_mariadb and delivered:
        check_divergence(delivered, server, table_gtids, offset)
    if recorded == server.server_id:
        start_position(request, committed)  # tables added behind the capture: positions of this server
        return Resume(
            position,
            False,
            delivered or None,
            server.server_id,
            base,
            table_gtids,
            handed_off,
            how=f"last committed offset (server_id {server.server_id}, by file/position)",
        )
    at = _gtids_at(hook, position) if recorded is None and server.is_mariadb else None
    if recorded is None and (not delivered or _same_gtids(at, delivered)):
        # A ledger record from before server ids were recorded: the server it was read from is unknown. Its GTID
        # matches the binlog there: the full GTID position (every domain) is tracked from now on.
        start_position(request, committed)
        return Resume(
            position,
            False,
            at or delivered or None,
            server.server_id,
            base,
            table_gtids,
            handed_off,
            how="last committed offset (by file/position; the record names no server)",
        )
    where = f"server_id {recorded}" if recorded is not None else "a server whose binlog is at another GTID there"
    if not server.is_mariadb or not delivered:
        raise PipelineError(
            f"The capture's committed position {position} is on {where}, but the connection reaches server_id "
            f"{server.server_id}{'' if server.is_mariadb else ' (MySQL)'}: the same file/position names other "
            "transactions on another server, so the capture refuses to resume there. "
            + (
                "Resuming a MySQL capture on another server by its GTID set is not supported yet. "
                if not server.is_mariadb
                else "The ledger holds no GTID position to find the place on this server. "
            )
            + "Point the connection back at the server the capture read, or run a full reload (trigger the DAG "
            "with full_reload=true) to start the pipeline from a new snapshot of this server."
        )
    # Full loads taken on this server (after the failover) stay pending: their positions are this server's,
    # and their rows carry the base taken below (check_full_loads). The others are the old server's.
    old = {n: h for n, h in request.handoffs.items() if h.server_id != server.server_id}
    late = sorted(
        f"{s}.{t}" for (s, t), h in old.items() if handed_off.get(f"{s}.{t}") != h.load_id and position < h.max_position
    )
    if late:
        raise PipelineError(
            f"The capture stopped at {position} on {where}, before the full load snapshots of {late} were all "
            "passed: their handoff positions are on that server's binlog and mean nothing on this one. Run a full "
            "reload of these tables (trigger the DAG with full_reload=true)."
        )
    known = set(offset.get("tables", []))
    added = sorted(f"{s}.{t}" for s, t in request.handoffs if f"{s}.{t}" not in known)
    if added:
        raise ValueError(
            f"Tables {added} were added to the capture while it moves to another server: resume it "
            "on the new server first, then add them (after their full load on that server)."
        )
    found = hook.locate_gtid(delivered, request.server_id)
    new_base = failover_base(offset)
    passed = {**handed_off, **{f"{s}.{t}": h.load_id for (s, t), h in old.items()}}  # the old server's: passed
    return Resume(
        found,
        False,
        delivered,
        server.server_id,
        new_base,
        table_gtids,
        passed,
        how=f"GTID position {gtid.format_position(delivered)} of {where}, found at {found} on server_id "
        f"{server.server_id} (version base {new_base})",
    )


def committed_position_on(hook: MySqlBinlogSource, offset: dict, dump_server_id: int) -> tuple[BinlogPosition, str]:
    """
    Return the ledger record's position on the server the connection names, and how it was found.

    For the retention guard and lag figures: they must measure the server the capture reads, also after a
    failover before the capture has resumed there. Same checks as a resume (divergence first).

    :param hook: the binlog hook of the server the connection names.
    :param offset: the capture's ledger offset.
    :param dump_server_id: the replica server id for the GTID dump (not the capture's: that would end its stream).
    :raises DivergedSourceError: the server lacks delivered transactions.
    """
    position, recorded = parse_position(offset), offset.get("server_id")
    if recorded is None:
        return position, "committed offset"
    server = hook.server_identity()
    if recorded == server.server_id:
        return position, f"committed offset (server_id {recorded})"
    delivered = _delivered(offset)
    if not server.is_mariadb or not delivered:
        raise PipelineError(
            f"The capture's committed position {position} is on server_id {recorded}, but the connection reaches "
            f"server_id {server.server_id}, and the ledger holds no GTID position to find it there: the capture "
            "will refuse to resume on this server. Point the connection back, or run a full reload (full_reload=true)."
        )
    table_gtids = {name: gtid.parse_position(text) for name, text in (offset.get("table_gtids") or {}).items()}
    check_divergence(delivered, server, table_gtids, offset)
    found = hook.locate_gtid(delivered, dump_server_id)
    return found, (
        f"GTID position {gtid.format_position(delivered)} of server_id {recorded} (committed at {position}),"
        f" at {found} on server_id {server.server_id}"
    )


def _gtids_at(hook: MySqlBinlogSource, position: BinlogPosition) -> gtid.GtidPosition | None:
    """Return the GTID position at ``position``, None where the server cannot tell (a purged file: the capture's
    own check then asks for a full reload)."""
    from exactly_once_provider.source.binlog import PurgedPositionError

    try:
        return hook.gtid_position_at(position)
    except PurgedPositionError:
        return None


def _same_gtids(at: gtid.GtidPosition | None, delivered: gtid.GtidPosition) -> bool:
    """Return whether the server's GTID position ``at`` is at the delivered GTIDs (their domains only)."""
    return at is not None and {domain: at.get(domain) for domain in delivered} == delivered


def _delivered(offset: dict) -> gtid.GtidPosition:
    """Return the GTID position the ledger record shows as delivered (older records: the last GTID only)."""
    if offset.get("gtid_pos"):
        return gtid.parse_position(offset["gtid_pos"])
    if offset.get("gtid"):
        last = gtid.Gtid.parse(offset["gtid"])
        return {last.domain: last}
    return {}


def check_divergence(
    delivered: gtid.GtidPosition, server: gtid.ServerIdentity, table_gtids: dict[str, gtid.GtidPosition], offset: dict
) -> None:
    """
    Stop with :class:`DivergedSourceError` unless the server's binlog holds every delivered GTID.

    :param delivered: the GTID position after the last delivered transaction.
    :param server: the server the connection reaches.
    :param table_gtids: the last delivered change of each table (ledger), to name the tables touched.
    :param offset: the ledger record (its position and tables, for the message).
    """
    lost = gtid.missing(delivered, server.gtid_state or [])
    if not lost:
        return
    touched = sorted({name for name, at in table_gtids.items() for span in lost if span.touches(at)})
    tables = (
        f"tables touched: {', '.join(touched)}"
        if touched
        else f"the ledger does not know which of {', '.join(offset.get('tables', [])) or 'the captured tables'} "
        "they touched (treat all as touched)"
    )
    raise DivergedSourceError(
        f"The source server (server_id {server.server_id}) lacks transactions the capture already delivered to "
        f"Kafka: {'; '.join(str(span) for span in lost)} ({tables}). Its binlog holds "
        f"{','.join(str(g) for g in sorted(server.gtid_state or [])) or 'no GTID'}; the capture delivered up to "
        f"{gtid.format_position(delivered)} (at {offset.get('file')}:{offset.get('pos')} on server_id "
        f"{offset.get('server_id', 'unknown')}). This happens after a failover to a replica that had not received "
        "the old primary's last commits: the lake holds changes the source no longer has. Nothing more was written. "
        "The way back: recover those transactions onto this server if they still exist (then the capture "
        "resumes), or reconcile the tables against it (ReconcileOperator) and start them afresh under a NEW "
        "pipeline name (its own ledger key, topic and current table): a full_reload under this pipeline keeps "
        "refusing this server the same way; see docs/failover.md, 'The divergence error'."
    )
