"""The in-task Iceberg side: a pyiceberg read of a real table (a SQLite catalog on local disk) at a pinned
snapshot, without tombstones, pruned to the scope, hashed as the delta-rs side hashes a Delta table."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from exactly_once_provider.reconcile.canonical import python_row_hash
from exactly_once_provider.reconcile.iceberg_side import iceberg_side, ranges_filter
from exactly_once_provider.reconcile.keys import Key
from tests.unit.provider.reconcile.test_deltars_side import col

pytestmark = pytest.mark.unit


def _rows(ids: list[int], deleted=lambda i: False) -> pa.Table:
    # the columns in another order than the compared one: the side puts them in the compared order
    return pa.table(
        {
            "amount": pa.array([Decimal(i) / 4 for i in ids], pa.decimal128(12, 2)),
            "_eo_deleted": pa.array([deleted(i) for i in ids], pa.bool_()),
            "id": pa.array(ids, pa.int64()),
        }
    )


@pytest.fixture
def table(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("eo", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("lake")
    return catalog.create_table("lake.orders", schema=_rows([]).schema)


def test_the_side_reads_the_scope_at_the_pinned_snapshot_without_tombstones(table):
    key, amount = col("id", "bigint"), col("amount", "decimal", 2)
    assert iceberg_side(table, None, Key.of(key), [key, amount]).key_bounds() == (None, None)  # no snapshot yet
    table.append(_rows(list(range(1, 101)), deleted=lambda i: i % 10 == 0))
    first = table.current_snapshot().snapshot_id
    table.append(_rows([500]))

    side = iceberg_side(
        table, first, Key.of(key), [key, amount], deleted_column="_eo_deleted", scope=[(5, 25), (450, 600)]
    )
    expected = [(i, python_row_hash((i, Decimal(i) / 4), [key, amount])) for i in range(5, 25) if i % 10]
    assert (
        side.rows([(0, 10_000)]) == expected
    )  # the first snapshot: key 500 is not there yet; 10 and 20 are tombstones
    newest = table.current_snapshot().snapshot_id
    everything = iceberg_side(table, newest, Key.of(key), [amount], deleted_column="_eo_deleted")
    assert len(everything.rows([(0, 10_000)])) == 91 and everything.key_bounds() == (1, 500)
    renamed = iceberg_side(
        table, newest, Key.of(col("order_id", "bigint")), [amount], sink_key="id", scope=[(500, 501)]
    )
    assert renamed.rows([(0, 10_000)]) == [
        (500, python_row_hash((500, Decimal(125)), [col("order_id", "bigint"), amount]))
    ]
    with pytest.raises(ValueError, match=r"no column\(s\) \['missing'\]"):
        iceberg_side(table, newest, Key.of(key), [col("missing", "int")])


def test_many_spans_push_only_their_outer_bounds():
    from pyiceberg.expressions import AlwaysFalse, And, In

    assert ranges_filter("id", []) == AlwaysFalse()
    assert isinstance(ranges_filter("id", [(1, 2), (5, 6)]), In)  # singles: one IN set
    assert isinstance(ranges_filter("id", [(i * 10, i * 10 + 5) for i in range(100)]), And)


def test_an_iceberg_sink_is_reconciled_as_a_plain_table():
    from exactly_once_provider.reconcile.sides import SinkSpec

    SinkSpec("iceberg", "lake.orders", deleted_column="_eo_deleted").validate()
    with pytest.raises(ValueError, match="plain table"):
        SinkSpec("iceberg", "lake.orders", json_column="record_value").validate()
