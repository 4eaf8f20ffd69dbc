"""ALTER TABLE -> the current table's columns: what is followed (and the value old rows take), what is refused
(with the statement, its position and the fix); the schema record's version sits between the changes around it."""

from __future__ import annotations

import json

import pytest

from exactly_once_provider.capture.change_record import schema_record, version_of
from exactly_once_provider.full_load.columns import Column
from exactly_once_provider.positions import BinlogPosition
from exactly_once_provider.sinks.current_table import merge_condition
from exactly_once_provider.source.binlog import SchemaChange
from exactly_once_provider.spark_jobs.schema_change import Fill, RefusedSchemaChange, SchemaRecord, evolve

pytestmark = pytest.mark.unit

COLUMNS = [
    Column("id", "int", "int(11)", 10, 0),
    Column("v", "int", "int(11)", 10, 0),
    Column("s", "varchar", "varchar(10)", None, None),
    Column("d", "decimal", "decimal(8,2)", 8, 2),
]


def _evolve(query: str):
    return evolve(COLUMNS, ("id",), SchemaRecord(query, 77, "binlog.000003:4711"), "eo.t")


@pytest.mark.parametrize(
    "query, added, fills",
    [
        ("ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 7 AFTER id", ("c", "int"), [Fill("c", 77, "7")]),
        ("ALTER TABLE `t` ADD n VARCHAR(20) NULL FIRST, ADD INDEX i (v)", ("n", "varchar"), []),
        ("ALTER TABLE t ADD COLUMN x DECIMAL(12,2) NOT NULL", ("x", "decimal"), [Fill("x", 77, "0")]),
        ("ALTER TABLE t ADD COLUMN e ENUM('a''b','c') NOT NULL", ("e", "enum"), [Fill("e", 77, "a'b")]),
        ("ALTER TABLE t ADD COLUMN q CHAR(4) DEFAULT 'ab  ' COMMENT 'why'", ("q", "char"), [Fill("q", 77, "ab")]),
        (
            "ALTER TABLE t ALGORITHM=INSTANT, LOCK=NONE, ADD z BOOLEAN DEFAULT TRUE",
            ("z", "tinyint"),
            [Fill("z", 77, "1")],
        ),
        (
            "ALTER TABLE t ADD dt DATETIME DEFAULT '2025-01-01 10:00:00'",
            ("dt", "datetime"),
            [Fill("dt", 77, "2025-01-01 10:00:00")],
        ),
    ],
)
def test_add_column_is_followed_with_the_value_old_rows_hold(query, added, fills):
    columns, found = _evolve(query)
    assert [c.name for c in columns] == ["id", "v", "s", "d", added[0]]  # by name: position is the source's
    assert columns[-1].data_type == added[1]
    assert found == fills


@pytest.mark.parametrize(
    "query",
    [
        "ALTER TABLE t MODIFY s VARCHAR(50) NOT NULL",
        "ALTER TABLE t MODIFY d DECIMAL(8,2) NOT NULL",
        "ALTER TABLE t CHANGE s s TEXT",
        "ALTER TABLE t ADD UNIQUE KEY u (s), COMMENT 'x'",
        "ALTER TABLE t ALTER COLUMN v SET DEFAULT 3",
        "ALTER TABLE t ENGINE=InnoDB",
    ],
)
def test_changes_that_widen_within_the_loaded_type_or_touch_no_row_are_followed(query):
    columns, fills = _evolve(query)
    assert [c.name for c in columns] == ["id", "v", "s", "d"] and fills == []


def test_drop_column_keeps_it_and_sets_it_null_in_every_row():
    columns, fills = _evolve("ALTER TABLE t DROP COLUMN v")
    assert [c.name for c in columns] == ["id", "v", "s", "d"] and fills == [Fill("v", 77, None)]


@pytest.mark.parametrize("query", ["ALTER TABLE t RENAME COLUMN v TO w", "ALTER TABLE t CHANGE COLUMN v w INT NULL"])
def test_rename_adds_the_new_name_with_the_old_values_and_empties_the_old_one(query):
    columns, fills = _evolve(query)
    assert [c.name for c in columns] == ["id", "v", "s", "d", "w"] and columns[-1].data_type == "int"
    assert fills == [Fill("w", 77, None, "v"), Fill("v", 77, None)]


@pytest.mark.parametrize(
    "query, reason",
    [
        ("ALTER TABLE t MODIFY v BIGINT", "from int(11) to bigint"),
        ("ALTER TABLE t MODIFY v MEDIUMINT", "from int(11) to mediumint"),
        ("ALTER TABLE t MODIFY v INT UNSIGNED", "from int(11) to int unsigned"),
        ("ALTER TABLE t MODIFY s VARCHAR(5)", "from varchar(10) to varchar(5)"),
        ("ALTER TABLE t MODIFY d DECIMAL(6,2)", "from decimal(8,2) to decimal(6,2)"),
        ("ALTER TABLE t MODIFY v VARCHAR(20)", "from int(11) to varchar(20)"),
        ("ALTER TABLE t ADD ts TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP", "DEFAULT CURRENT_TIMESTAMP"),
        ("ALTER TABLE t ADD k INT DEFAULT (v * 2)", "an expression"),
        ("ALTER TABLE t ADD k INT NOT NULL AUTO_INCREMENT", "AUTO_INCREMENT"),
        ("ALTER TABLE t ADD g INT AS (v + 1) STORED", "generated"),
        ("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)", "primary key"),
        ("ALTER TABLE t DROP COLUMN id", "key column 'id'"),
        ("ALTER TABLE t RENAME COLUMN id TO key_id", "renames key column 'id'"),
        ("ALTER TABLE t CHANGE v s INT", "column 's' is already in the current table"),
        ("ALTER TABLE t CHANGE v w BIGINT", "from int(11) to bigint"),
        ("ALTER TABLE t PARTITION BY HASH(id) PARTITIONS 4", "partition"),
        ("ALTER TABLE t TRUNCATE PARTITION p0", "partition"),
        ("ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4", "CONVERT TO CHARACTER SET"),
        ("ALTER TABLE t ADD ts TIMESTAMP NULL DEFAULT '2025-01-01 00:00:00'", "cannot type exactly"),
        ("ALTER TABLE t DISCARD TABLESPACE", "not one the sink follows"),
    ],
)
def test_refused_changes_name_the_statement_its_position_and_the_fix(query, reason):
    with pytest.raises(RefusedSchemaChange) as err:
        _evolve(query)
    message = str(err.value)
    assert message.startswith(repr(query) + " at binlog.000003:4711 on eo.t cannot be followed"), message
    assert reason in message and "full_reload=true" in message


def test_the_schema_record_sits_between_the_changes_before_and_after_the_statement():
    end = BinlogPosition("binlog.000003", 4711)
    change = SchemaChange((("eo", "t"),), "alter", "ALTER TABLE t ADD c INT", "0-1-9", end)
    (message,) = schema_record(change, {("eo", "t"): "p.eo.t"})
    assert message.topic == "p.eo.t" and message.key is None
    value = json.loads(message.value)
    assert value["op"] == "ddl" and value["ddl"] == "ALTER TABLE t ADD c INT"
    assert version_of("binlog.000003", 4600, 3) < value["version"] <= version_of("binlog.000003", 4711, 0)
    assert SchemaRecord.from_json(value) == SchemaRecord(
        "ALTER TABLE t ADD c INT", value["version"], "binlog.000003:4711"
    )
    from exactly_once_provider.spark_jobs.current_changes import DDL_PREFIX

    assert message.value.decode().startswith(DDL_PREFIX)


def test_the_batch_after_a_schema_change_replaces_rows_of_equal_version():
    assert merge_condition(["id"], replace_equal=True)[1] == "s._eo_version >= t._eo_version"
    assert merge_condition(["id"])[1] == "s._eo_version > t._eo_version"
