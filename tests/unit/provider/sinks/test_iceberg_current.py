"""Where the Iceberg current table lives and which full load it holds (its build is in integration)."""

from __future__ import annotations

from exactly_once_provider.sinks.iceberg_current import built_load, current_location


def test_the_current_table_lives_beside_its_full_load():
    assert current_location("s3://lake/current/orders/") == "s3://lake/current/orders_iceberg"
    assert current_location("/data/orders") == "/data/orders_iceberg"


def test_the_built_load_is_the_newest_schema_state_in_the_ancestry():
    summaries = [
        {"operation": "replace"},  # another writer's snapshot
        {"eo.schema": '{"load_id": "L2", "columns": []}'},
        {"eo.schema": '{"load_id": "L1", "columns": []}'},
    ]
    assert built_load(iter(summaries)) == "L2"
    assert built_load(iter([{"operation": "append"}])) is None
