"""The reconciliation's dead-lettered keys: read from the letters' raw values, reported as such, not as mismatches."""

from __future__ import annotations

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile import engine, letters
from exactly_once_provider.reconcile.keys import Key
from exactly_once_provider.reconcile.sides import SinkSpec

ID = Key.of(Column("id", "int", "int", None, None))
CURRENT = SinkSpec("delta", "/lake/t", deleted_column="_eo_deleted")


def test_a_current_tables_letters_name_their_keys_from_the_after_or_before_image_despite_bad_bytes():
    values = [
        b'{"op":"u","after":{"id":5,"s":"\xff"},"version":9}',
        b'{"op":"d","before":{"id":6},"after":null}',
        b'{"after":{"s":"no key"}}',  # names no key
        b"\xff not json",
        None,
    ]
    assert letters.letter_keys(values, ID, CURRENT) == {5: "5", 6: "6"}


def test_a_composite_key_is_read_as_the_engine_hashes_it():
    key = Key.of([Column("region", "varchar", "varchar(5)", None, None), Column("id", "int", "int", None, None)])
    found = letters.letter_keys([b'{"after":{"region":"EU","id":7}}'], key, CURRENT)
    assert found == {key.of_values(["EU", 7]): key.label(["EU", 7])}


def test_a_record_shaped_sinks_letters_are_read_at_its_key_paths():
    window = SinkSpec("postgres", "w", json_column="record_value", json_path=("row",))
    assert letters.letter_keys([b'{"row":{"id":"12","amount":"\xff"}}'], ID, window) == {12: "12"}


def test_only_differing_keys_of_letters_are_relabelled_and_the_report_stays_clean():
    report = engine.Report(
        differences=[engine.Difference(5, "changed", 1, 1), engine.Difference(8, "missing", 1, 0)],
    )
    assert letters.relabel(report, {5: "5", 6: "6"}) == ["5"]
    assert [(d.key, d.kind) for d in report.differences] == [(5, "dead_lettered"), (8, "missing")]
    assert report.mismatches == 1 and report.summary()["dead_lettered"] == 1
    letters.relabel(report, {8: "8"})
    assert report.clean
