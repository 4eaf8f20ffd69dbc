"""The in-task Delta side: Python canonical texts, the pairs side's answers, a delta-rs read of a real table."""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from decimal import Decimal

import pyarrow as pa
import pytest

from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.reconcile.canonical import NULL_TEXT, python_row_hash, python_text
from exactly_once_provider.reconcile.deltars_side import PairsSide, delta_rs_side, ranges_predicate
from exactly_once_provider.reconcile.keys import Key

pytestmark = pytest.mark.unit


def col(name: str, data_type: str, scale: int | None = None, column_type: str | None = None) -> Column:
    return Column(name, data_type, column_type or data_type, None, scale)


@pytest.mark.parametrize(
    "value, column, text",
    [
        (-12, col("a", "int"), "-12"),
        (True, col("a", "tinyint"), "1"),
        (Decimal("18446744073709551615"), col("a", "bigint", column_type="bigint unsigned"), "18446744073709551615"),
        (Decimal("12.5"), col("a", "decimal", 2), "12.50"),
        (Decimal("-0.07"), col("a", "decimal", 3), "-0.070"),
        (Decimal("3"), col("a", "decimal", 0), "3"),
        (dt.datetime(33, 1, 2, 3, 4, 5, 6), col("a", "datetime"), "0033-01-02 03:04:05.000006"),
        (
            dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            col("a", "timestamp"),
            "2026-03-28 23:30:00.000000",
        ),
        (dt.date(999, 12, 31), col("a", "date"), "0999-12-31"),
        (b"\x00\xffA", col("a", "blob"), "00ff41"),
        ("n1-é", col("a", "varchar"), "n1-é"),
        (None, col("a", "varchar"), NULL_TEXT),
    ],
)
def test_python_text_matches_the_canonical_table(value, column, text):
    assert python_text(value, column) == text


def test_python_row_hash_is_md5_of_the_joined_texts_cut_to_60_bits():
    columns = [col("id", "bigint"), col("note", "varchar")]
    digest = hashlib.md5(b"7\x1f\\N").hexdigest()[:15]
    assert python_row_hash((7, None), columns) == int(digest, 16) < 2**60


def test_python_text_refuses_what_cannot_be_compared():
    with pytest.raises(ValueError, match="FLOAT/DOUBLE/JSON/TIME"):
        python_text(1.5, col("f", "double"))


def test_pairs_side_answers_like_a_brute_force_scan():
    rng = random.Random(7)
    pairs = [(rng.randrange(-500, 5000), rng.randrange(2**60)) for _ in range(3000)]
    side = PairsSide(pairs)
    assert side.key_bounds() == (min(k for k, _ in pairs), max(k for k, _ in pairs))
    ranges = [(-100, 3), (40, 41), (1000, 2500)]

    def brute(base: int, width: int, within) -> dict:
        found: dict = {}
        for k, h in pairs:
            if within is None or any(lo <= k < hi for lo, hi in within):
                n, total = found.get((k - base) // width, (0, 0))
                found[(k - base) // width] = (n + 1, total + h)
        return found

    assert side.segments(-500, 64, None) == brute(-500, 64, None)
    assert side.segments(-500, 16, ranges) == brute(-500, 16, ranges)
    assert sorted(side.rows(ranges)) == sorted(p for p in pairs if any(lo <= p[0] < hi for lo, hi in ranges))
    assert PairsSide([]).key_bounds() == (None, None)


def test_ranges_predicate_quotes_the_key_and_is_false_for_no_range():
    assert ranges_predicate('we"ird', []) == "FALSE"
    assert ranges_predicate('we"ird', [(1, 5)]) == '(("we""ird" >= 1 AND "we""ird" < 5))'


def test_delta_rs_side_reads_the_scope_at_the_pinned_version_without_tombstones(tmp_path):
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    key, amount = col("id", "bigint"), col("amount", "decimal", 2)
    first = pa.table(
        {
            "id": pa.array(range(1, 101), pa.int64()),
            "amount": pa.array([Decimal(i) / 4 for i in range(1, 101)], pa.decimal128(12, 2)),
            "_eo_deleted": pa.array([i % 10 == 0 for i in range(1, 101)]),
        }
    )
    write_deltalake(path, first)  # version 0
    write_deltalake(
        path,
        pa.table(
            {
                "id": pa.array([500], pa.int64()),
                "amount": pa.array([Decimal(1)], pa.decimal128(12, 2)),
                "_eo_deleted": pa.array([False]),
            }
        ),
        mode="append",
    )  # version 1

    side = delta_rs_side(path, 0, Key.of(key), [key, amount], deleted_column="_eo_deleted", scope=[(5, 25), (450, 600)])
    expected = [(i, python_row_hash((i, Decimal(i) / 4), [key, amount])) for i in range(5, 25) if i % 10]
    assert side.rows([(0, 10_000)]) == expected  # version 0: key 500 is not there yet; 10 and 20 are tombstones
    newest = delta_rs_side(path, 1, Key.of(key), [amount], deleted_column="_eo_deleted", scope=[(450, 600)])
    assert newest.key_bounds() == (500, 500)
    with pytest.raises(ValueError, match=r"no column\(s\) \['missing'\]"):
        delta_rs_side(path, 1, Key.of(key), [col("missing", "int")])


def test_a_composite_key_is_bisected_by_its_hash_and_named_by_its_text(tmp_path):
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    region, number, note = col("region", "varchar"), col("n", "int"), col("note", "varchar")
    rows = [(r, n, f"{r}{n}") for r in ("EU", "US") for n in range(50)]
    write_deltalake(
        path,
        pa.table(
            {
                "region": [r[0] for r in rows],
                "n": pa.array([r[1] for r in rows], pa.int32()),
                "note": [r[2] for r in rows],
            }
        ),
    )
    key = Key.of([region, number])
    assert key.hashed and key.of_values(("EU", 7)) == python_row_hash(("EU", 7), [region, number])
    wanted = sorted(key.of_values(r[:2]) for r in rows[:10])
    scope = [(h, h + 1) for h in wanted]
    side = delta_rs_side(path, 0, key, [note], scope=scope)
    assert [k for k, _ in side.rows([(0, 2**60)])] == wanted  # only the scope's keys, though the scan read all
    assert side.labels[key.of_values(("EU", 3))] == "EU, 3"
    assert dict(side.rows([(0, 2**60)]))[key.of_values(("EU", 3))] == python_row_hash(
        ("EU", 3, "EU3"), [region, number, note]
    )


def test_single_keys_are_one_in_list_and_many_spans_push_only_their_bounds():
    from exactly_once_provider.reconcile.deltars_side import MAX_PUSHED_SPANS

    assert ranges_predicate("k", [(3, 4), (7, 8), (10, 20)]) == '("k" IN (3, 7) OR ("k" >= 10 AND "k" < 20))'
    spans = [(i * 10, i * 10 + 2) for i in range(MAX_PUSHED_SPANS + 1)]
    assert ranges_predicate("k", spans) == f'("k" >= 0 AND "k" < {spans[-1][1]})'
