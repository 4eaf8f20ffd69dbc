"""The current table's widened columns: which columns a batch widens, and when Delta's MERGE widens them in place
(the table's owner enabled type widening) instead of the provider rewriting the table."""

from __future__ import annotations

import pytest
from pyspark.sql.types import DecimalType, DoubleType, IntegerType, LongType, StringType, StructField, StructType

from exactly_once_provider.sinks.delta_log import TableState
from exactly_once_provider.sinks.delta_merge import widened_columns, widens_in_place

pytestmark = pytest.mark.unit

TABLE = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "integer", "nullable": True, "metadata": {}},
        {"name": "d", "type": "decimal(12,2)", "nullable": True, "metadata": {}},
        {"name": "f", "type": "float", "nullable": True, "metadata": {}},
        {"name": "u", "type": "long", "nullable": True, "metadata": {}},
        {"name": "s", "type": "string", "nullable": True, "metadata": {}},
    ],
}


def _batch(**types) -> StructType:
    held = {"id": IntegerType(), "d": DecimalType(12, 2), "f": DoubleType(), "u": LongType(), "s": StringType()}
    held.update(types)
    return StructType([StructField(n, t) for n, t in held.items()])


def test_the_columns_a_batch_holds_in_another_type_are_the_widened_ones():
    batch = _batch(id=LongType(), d=DecimalType(18, 2), u=DecimalType(20, 0))
    assert widened_columns(TABLE, batch) == {
        "id": ("integer", "long"),
        "d": ("decimal(12,2)", "decimal(18,2)"),
        "f": ("float", "double"),
        "u": ("long", "decimal(20,0)"),
    }
    same = StructType([StructField("id", IntegerType()), StructField("s", StringType()), StructField("n", LongType())])
    assert widened_columns(TABLE, same) == {}  # a new column is no widening


def _state(configuration: dict) -> TableState:
    return TableState("/t", 3, {}, {"schemaString": "{}", "configuration": configuration}, None)


@pytest.mark.parametrize(
    "configuration, widened, in_place",
    [
        ({}, {"id": ("integer", "long")}, False),  # the default: rewritten, readable by every reader
        ({"delta.enableTypeWidening": "false"}, {"id": ("integer", "long")}, False),
        ({"delta.enableTypeWidening": "true"}, {"id": ("integer", "long")}, True),
        (
            {"delta.enableTypeWidening": "true"},
            {"f": ("float", "double"), "d": ("decimal(12,2)", "decimal(18,4)")},
            True,
        ),
        # integer -> DECIMAL: a widening Delta's MERGE does not apply by itself (it would cast to the old type)
        ({"delta.enableTypeWidening": "true"}, {"u": ("long", "decimal(20,0)")}, False),
        ({"delta.enableTypeWidening": "true"}, {"id": ("integer", "long"), "u": ("long", "decimal(20,0)")}, False),
    ],
)
def test_delta_widens_in_place_only_on_a_table_with_type_widening_and_within_a_family(configuration, widened, in_place):
    assert widens_in_place(_state(configuration), widened) is in_place
