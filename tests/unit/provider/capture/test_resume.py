"""The resume decision: same server by file/position, another server by GTID, the divergence check and the
refusals (no services: the server's answers are given; tests/integration/provider/capture/test_failover.py runs
the same decisions against a real primary and replica)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from exactly_once_provider.capture.resume import DivergedSourceError, committed_position_on, resolve
from exactly_once_provider.errors import PipelineError
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.source.gtid import ServerIdentity, parse_list, parse_position
from tests.unit.provider.capture.test_loop import HANDOFF, pos, request


class Server:
    """The answers of the server a connection reaches."""

    def __init__(self, server_id=1, state="0-1-100", mariadb=True, at=None, located=None):
        self.identity = ServerIdentity(server_id, mariadb, parse_list(state) if mariadb else None)
        self.at = at or {}
        self.located = located
        self.asked: list = []

    def server_identity(self):
        return self.identity

    def gtid_position_at(self, position):
        self.asked.append(("at", position))
        return parse_position(self.at.get(position, ""))

    def locate_gtid(self, position, server_id):
        self.asked.append(("locate", position))
        return self.located


def ledger(**offset):
    return SimpleNamespace(offset={"format": 1, "file": "binlog.000002", "pos": 4000, "tables": ["eo.t"], **offset})


def test_the_same_server_resumes_by_file_position_without_scanning_the_binlog():
    server = Server(server_id=1)
    found = resolve(server, request(), ledger(server_id=1, gtid_pos="0-1-100", gtid="0-1-100", version_base=7))
    assert (found.position, found.first_run, found.version_base, found.handed_off) == (pos(4000), False, 7, {})
    assert server.asked == []  # no BINLOG_GTID_POS, no GTID dump


def test_another_server_resumes_by_gtid_with_a_version_base_above_everything_delivered():
    replica = Server(server_id=2, state="0-1-100,0-2-3", located=BinlogPosition("binlog.000001", 900))
    found = resolve(
        replica, request(), ledger(server_id=1, gtid_pos="0-1-100", version_base=5, table_gtids={"eo.t": "0-1-99"})
    )
    assert found.position == BinlogPosition("binlog.000001", 900)
    # From the ledger record alone (a full load on the new server finds the same base before the capture moves).
    assert found.version_base == 5 + pos(4000).version
    assert found.version_base + found.position.version > 5 + pos(4000).version  # above everything delivered
    assert found.handed_off == {"eo.t": "load"} and found.server_id == 2  # never compared with the new server's
    assert replica.asked == [("locate", parse_position("0-1-100"))]
    assert "found at binlog.000001:900 on server_id 2" in found.how


def test_the_failover_base_depends_on_the_ledger_record_only_not_on_where_the_new_server_has_it():
    record = ledger(server_id=1, gtid_pos="0-1-100", version_base=5)
    bases = {
        resolve(Server(server_id=2, located=at), request(), record).version_base
        for at in (BinlogPosition("binlog.000009", 4), BinlogPosition("binlog.000001", 900))
    }
    assert bases == {5 + pos(4000).version}


def test_a_server_lacking_delivered_transactions_stops_the_capture_naming_them_and_their_tables():
    replica = Server(server_id=2, state="0-1-95,0-2-120")
    with pytest.raises(DivergedSourceError) as caught:
        resolve(
            replica,
            request(),
            ledger(server_id=1, gtid_pos="0-1-100", table_gtids={"eo.t": "0-1-97", "eo.old": "0-1-90"}),
        )
    text = str(caught.value)
    assert "0-1-96 .. 0-1-100" in text and "(tables touched: eo.t)" in text and "eo.old" not in text
    assert "ReconcileOperator" in text and "Nothing more was written" in text
    # A full reload under the same pipeline is refused the same way (docs/failover.md): the fix is a new pipeline.
    assert "NEW pipeline name" in text and "full_reload under this pipeline keeps refusing" in text
    assert replica.asked == []  # refused before looking for a position


def test_the_divergence_check_runs_on_the_same_server_too():
    restored = Server(server_id=1, state="0-1-80")  # a primary restored from a backup, same server_id
    with pytest.raises(DivergedSourceError, match="0-1-81 .. 0-1-100"):
        resolve(restored, request(), ledger(server_id=1, gtid_pos="0-1-100"))


def test_file_position_on_another_server_without_gtids_is_refused():
    with pytest.raises(
        PipelineError,
        match="server_id 1, but the connection reaches server_id 2 .MySQL.*MySQL capture on another server",
    ):
        resolve(Server(server_id=2, mariadb=False), request(), ledger(server_id=1))
    with pytest.raises(PipelineError, match="holds no GTID position"):
        resolve(Server(server_id=2), request(), ledger(server_id=1, gtid_pos=None, gtid=None))


def test_an_old_ledger_record_resumes_on_the_same_server_after_checking_its_gtid():
    server = Server(server_id=1, at={pos(4000): "0-1-100,1-3-5"})
    found = resolve(server, request(), ledger(gtid="0-1-100"))
    assert (found.position, found.version_base) == (pos(4000), 0)
    assert found.gtid_position == parse_position("0-1-100,1-3-5")  # every domain from now on
    assert server.asked == [("at", pos(4000))]
    assert resolve(Server(), request(), ledger(gtid=None)).position == pos(4000)  # nothing to check with


def test_an_old_ledger_record_on_another_server_moves_by_its_last_gtid():
    replica = Server(server_id=2, at={pos(4000): "0-2-7"}, located=BinlogPosition("binlog.000001", 500))
    found = resolve(replica, request(), ledger(gtid="0-1-100"))
    assert found.position == BinlogPosition("binlog.000001", 500) and found.handed_off == {"eo.t": "load"}


def test_a_failover_before_the_full_load_snapshots_were_passed_is_refused():
    replica = Server(server_id=2, located=BinlogPosition("binlog.000001", 500))
    behind = ledger(server_id=1, gtid_pos="0-1-100", pos=600)  # HANDOFF's chunks end at 900
    with pytest.raises(PipelineError, match=r"before the full load snapshots of \['eo.t'\]"):
        resolve(replica, request(), behind)


def test_a_first_run_starts_at_the_handoff_and_records_the_gtid_position_there():
    server = Server(at={pos(300): "0-1-40"})
    found = resolve(server, request(handoffs={("eo", "t"): HANDOFF}), None)
    assert (found.position, found.first_run, found.gtid_position) == (pos(300), True, parse_position("0-1-40"))


def test_a_first_run_at_a_position_the_server_cannot_place_leaves_the_purge_check_to_the_capture():
    class Purged(Server):
        def gtid_position_at(self, position):
            from exactly_once_provider.source.binlog import PurgedPositionError

            raise PurgedPositionError("gone")

    found = resolve(Purged(), request(handoffs={("eo", "t"): HANDOFF}), None)
    assert (found.position, found.gtid_position) == (pos(300), None)


def test_the_retention_guard_measures_the_committed_position_on_the_server_the_connection_names():
    offset = ledger(server_id=1, gtid_pos="0-1-100").offset
    assert committed_position_on(Server(server_id=1), offset, 9) == (pos(4000), "committed offset (server_id 1)")
    replica = Server(server_id=2, located=BinlogPosition("binlog.000001", 900))
    found, how = committed_position_on(replica, offset, 9)
    assert found == BinlogPosition("binlog.000001", 900) and "at binlog.000001:900 on server_id 2" in how
    with pytest.raises(DivergedSourceError, match="0-1-96 .. 0-1-100"):
        committed_position_on(Server(server_id=2, state="0-1-95"), offset, 9)
    with pytest.raises(PipelineError, match="no GTID position"):
        committed_position_on(Server(server_id=2, mariadb=False), ledger(server_id=1).offset, 9)


def test_handoffs_passed_before_a_failover_stay_passed_on_the_new_server():
    # The first run on the new server recorded them; the next run is a same-server resume.
    found = resolve(
        Server(server_id=2),
        request(),
        ledger(server_id=2, gtid_pos="0-1-100", handed_off={"eo.t": "load"}, file="binlog.000001", pos=10),
    )
    assert found.handed_off == {"eo.t": "load"}
    # A failover of a capture that recorded the handoff as passed is not refused for it.
    replica = Server(server_id=3, located=BinlogPosition("binlog.000001", 500))
    assert resolve(
        replica,
        request(),
        ledger(server_id=2, gtid_pos="0-1-100", handed_off={"eo.t": "load"}, file="binlog.000001", pos=10),
    ).position == BinlogPosition("binlog.000001", 500)
    # A full reload (a new load id) is not passed: on another server its positions cannot be placed.
    with pytest.raises(PipelineError, match="before the full load snapshots"):
        resolve(
            replica,
            request(),
            ledger(server_id=2, gtid_pos="0-1-100", handed_off={"eo.t": "older-load"}, file="binlog.000001", pos=10),
        )


class Capture(Server):
    """A server whose binlog holds transactions without captured rows (positions and GTIDs only)."""

    def __init__(self, ends, **kwargs):
        super().__init__(**kwargs)
        self.ends = ends

    def check_capture(self, start):
        pass

    def binlog_end(self):
        return self.ends[-1]

    def lag(self, position):
        return 0, 0

    def reader(self, tables, server_id, heartbeat):
        from exactly_once_provider.source.binlog import SourceTransaction

        ends = self.ends

        class Reader:
            def transactions(self, start, until, blocking):
                for seq, end in enumerate(ends, 101):
                    if end > start:
                        yield SourceTransaction(f"0-1-{seq}", 1, start, end, 0)

            def close(self):
                pass

        return Reader()


class Ledger:
    pipeline = "p"

    def __init__(self, offset=None):
        self.last_committed = SimpleNamespace(offset=offset) if offset else None
        self.offsets = []

    def submit_batch(self, topic, batch, offset):
        self.offsets.append(offset)

    def wait(self):
        return None


def test_the_ledger_records_each_handoff_once_the_capture_has_passed_it():
    from exactly_once_provider.capture.loop import run_capture

    source = Capture([pos(950), pos(1000)], server_id=1)
    writer = Ledger(ledger(server_id=1, gtid_pos="0-1-100", pos=800).offset)  # before the last chunk (900)
    result = run_capture(source, writer, request())
    assert result.position == pos(1000)
    assert writer.offsets[-1]["handed_off"] == {"eo.t": "load"} and writer.offsets[-1]["gtid_pos"] == "0-1-102"
    assert writer.offsets[-1]["server_id"] == 1 and writer.offsets[-1]["version_base"] == 0


def loaded(load_id="load-2", version_base=0, server_id=2, at=600):
    """A full load of eo.t (one chunk) taken with ``version_base`` on ``server_id``."""
    from exactly_once_provider.full_load.handoff import ChunkPosition, Handoff
    from exactly_once_provider.source.snapshot import Chunk

    return Handoff(
        load_id,
        "eo",
        "t",
        ("id",),
        1,
        (ChunkPosition(Chunk(0, None, None), pos(at), 1),),
        0,
        version_base=version_base,
        server_id=server_id,
    )


def test_a_full_load_hands_off_only_with_the_capture_s_version_base_and_server():
    from exactly_once_provider.capture.resume import check_full_loads

    check_full_loads(0, 1, {("eo", "t"): loaded(server_id=1)}, "p")  # no failover: as always
    check_full_loads(2**40, 2, {("eo", "t"): loaded(version_base=2**40)}, "p")  # taken after a failover
    check_full_loads(2**40, 2, {}, "p")
    with pytest.raises(
        PipelineError,
        match=r"eo\.t \(load load-2: version base 0 on server_id 2\).*"
        r"without capture_pipeline.*full_reload=true",
    ):
        check_full_loads(2**40, 2, {("eo", "t"): loaded()}, "p")
    with pytest.raises(PipelineError, match=r"version base 1099511627776 on server_id 1\)"):
        check_full_loads(2**40, 2, {("eo", "t"): loaded(version_base=2**40, server_id=1)}, "p")


def test_a_full_load_after_a_failover_takes_the_base_the_capture_will_take_there():
    from exactly_once_provider.capture.resume import full_load_version_base

    record = ledger(server_id=1, gtid_pos="0-1-100", version_base=5, table_gtids={"eo.t": "0-1-99"})
    replica = Server(server_id=2, state="0-1-100,0-2-3", located=BinlogPosition("binlog.000001", 900))
    assert full_load_version_base(replica, None) == (0, 2)  # the capture never committed
    assert full_load_version_base(Server(server_id=1), record) == (5, 1)  # the capture reads this server
    base, server_id = full_load_version_base(replica, record)
    assert (base, server_id) == (resolve(replica, request(), record).version_base, 2)
    with pytest.raises(DivergedSourceError, match="0-1-96 .. 0-1-100"):
        full_load_version_base(Server(server_id=2, state="0-1-95"), record)


def test_a_full_load_taken_on_the_new_server_stays_pending_through_the_failover():
    replica = Server(server_id=2, located=BinlogPosition("binlog.000001", 500))
    record = ledger(server_id=1, gtid_pos="0-1-100", pos=600)  # the old load's chunks end at 900: not passed
    fresh = loaded(version_base=pos(600).version, at=700)
    found = resolve(replica, request(handoffs={("eo", "t"): fresh}), record)
    assert found.handed_off == {} and found.version_base == fresh.version_base  # filtered by its own positions
