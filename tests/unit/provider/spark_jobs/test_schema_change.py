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
        # comments anywhere and hostile names (source/ddl.py reads the statement)
        ("ALTER TABLE t ADD COLUMN c INT /* why, here */ NOT NULL DEFAULT 7", ("c", "int"), [Fill("c", 77, "7")]),
        ("ALTER ONLINE TABLE `t` WAIT 5 /*!50100 ADD COLUMN c INT DEFAULT 2 */", ("c", "int"), [Fill("c", 77, "2")]),
        ("ALTER TABLE t ADD COLUMN `c``,x` INT DEFAULT 1 -- done", ("c`,x", "int"), [Fill("c`,x", 77, "1")]),
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
        ("ALTER TABLE t MODIFY v MEDIUMINT", "narrows column 'v' from int(11) to mediumint"),
        ("ALTER TABLE t MODIFY v INT UNSIGNED", "narrows column 'v' from int(11) to int unsigned"),
        ("ALTER TABLE t MODIFY s VARCHAR(5)", "narrows column 's' from varchar(10) to varchar(5)"),
        ("ALTER TABLE t MODIFY d DECIMAL(6,2)", "narrows column 'd' from decimal(8,2) to decimal(6,2)"),
        ("ALTER TABLE t MODIFY v VARCHAR(20)", "changes column 'v' from int(11) to varchar(20), a type change"),
        ("ALTER TABLE t ADD ts TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP", "DEFAULT CURRENT_TIMESTAMP"),
        ("ALTER TABLE t ADD k INT DEFAULT (v * 2)", "an expression"),
        ("ALTER TABLE t ADD k INT NOT NULL AUTO_INCREMENT", "AUTO_INCREMENT"),
        ("ALTER TABLE t ADD g INT AS (v + 1) STORED", "generated"),
        ("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)", "primary key"),
        ("ALTER TABLE t DROP COLUMN id", "key column 'id'"),
        ("ALTER TABLE t RENAME COLUMN id TO key_id", "renames key column 'id'"),
        ("ALTER TABLE t CHANGE v s INT", "column 's' is already in the current table"),
        ("ALTER TABLE t CHANGE v w VARCHAR(3)", "from int(11) to varchar(3)"),
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
    assert merge_condition(["id"], replace_equal=True)[1] == "s.`_eo_version` >= t.`_eo_version`"
    assert merge_condition(["id"])[1] == "s.`_eo_version` > t.`_eo_version`"


WIDE = [
    *COLUMNS,
    Column("f", "float", "float", 12, None),
    Column("u", "int", "int(10) unsigned", 10, 0),
    Column("t", "tinyint", "tinyint(3) unsigned", 3, 0),
]


@pytest.mark.parametrize(
    "query, column, column_type, loaded",
    [
        ("ALTER TABLE t MODIFY v BIGINT", "v", "bigint", "int64"),
        ("ALTER TABLE t MODIFY COLUMN v BIGINT NOT NULL DEFAULT 0", "v", "bigint", "int64"),
        ("ALTER TABLE t MODIFY id BIGINT", "id", "bigint", "int64"),  # the key: rows still meet by value
        ("ALTER TABLE t MODIFY u BIGINT UNSIGNED", "u", "bigint unsigned", "decimal128(20, 0)"),
        ("ALTER TABLE t MODIFY u BIGINT", "u", "bigint", "int64"),
        ("ALTER TABLE t MODIFY t SMALLINT", "t", "smallint", "int32"),  # unsigned to a signed type that fits
        ("ALTER TABLE t MODIFY d DECIMAL(18,2)", "d", "decimal(18,2)", "decimal128(18, 2)"),
        ("ALTER TABLE t MODIFY d DECIMAL(12,4)", "d", "decimal(12,4)", "decimal128(12, 4)"),
        ("ALTER TABLE t MODIFY v DECIMAL(12,2)", "v", "decimal(12,2)", "decimal128(12, 2)"),
        ("ALTER TABLE t MODIFY f DOUBLE", "f", "double", "double"),
        ("ALTER TABLE t CHANGE f f DOUBLE NULL", "f", "double", "double"),
    ],
)
def test_widenings_to_a_wider_loaded_type_are_followed(query, column, column_type, loaded):
    from exactly_once_provider.full_load.columns import arrow_type

    columns, fills = evolve(WIDE, ("id",), SchemaRecord(query, 77, "binlog.000003:4711"), "eo.t")
    changed = {c.name: c for c in columns}[column]
    assert changed.column_type == column_type and str(arrow_type(changed)) == loaded
    assert [c.name for c in columns] == [c.name for c in WIDE]
    # FLOAT -> DOUBLE: the older changes' FLOAT text is converted as the server converted the stored values
    assert fills == ([Fill("f", 77, None, "f")] if column == "f" else [])


def test_a_rename_to_a_wider_type_is_followed_as_a_new_column_of_that_type():
    columns, fills = _evolve("ALTER TABLE t CHANGE v w BIGINT")
    assert columns[-1].name == "w" and columns[-1].column_type == "bigint"
    assert fills == [Fill("w", 77, None, "v"), Fill("v", 77, None)]


@pytest.mark.parametrize(
    "query, says",
    [
        # narrowing: the old values do not all fit
        ("ALTER TABLE t MODIFY u INT", "it narrows column 'u' from int(10) unsigned to int: values in [0, 4294967295]"),
        ("ALTER TABLE t MODIFY v TINYINT UNSIGNED", "it narrows column 'v' from int(11) to tinyint unsigned"),
        (
            "ALTER TABLE t MODIFY d DECIMAL(8,1)",
            "it narrows column 'd' from decimal(8,2) to decimal(8,1): fewer decimals",
        ),
        ("ALTER TABLE t MODIFY d DECIMAL(9,4)", "fewer integer digits"),
        ("ALTER TABLE t MODIFY f FLOAT(7,2)", "changes column 'f' from float to float(7,2)"),
        ("ALTER TABLE t MODIFY v DECIMAL(9,0)", "a type change (int -> decimal(9, 0)) that is no widening"),
        # a widening of the source that the format cannot hold: past 38 digits DECIMAL is loaded as text
        ("ALTER TABLE t MODIFY d DECIMAL(40,2)", "a DECIMAL of more than 38 digits is loaded as text"),
        ("ALTER TABLE t MODIFY v DOUBLE", "a type change (int -> double) that is no widening"),
        # the key: only a widening is followed
        ("ALTER TABLE t MODIFY id SMALLINT", "it changes the type of key column 'id' and narrows column 'id'"),
        ("ALTER TABLE t MODIFY id VARCHAR(20)", "type of key column 'id' and changes column 'id' from int(11)"),
        ("ALTER TABLE t CHANGE f g DOUBLE", "run them as two statements (MODIFY, then RENAME COLUMN)"),
    ],
)
def test_refused_type_changes_say_what_they_are_and_what_to_do(query, says):
    with pytest.raises(RefusedSchemaChange) as err:
        evolve(WIDE, ("id",), SchemaRecord(query, 77, "binlog.000003:4711"), "eo.t")
    message = str(err.value)
    assert says in message, message
    assert "which narrows it or changes the type the sink stores it as" not in message
    assert "Run a full reload of the table (trigger the DAG with full_reload=true)" in message
