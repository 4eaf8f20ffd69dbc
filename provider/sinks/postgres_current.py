"""The current table in PostgreSQL: the full load's rows with every later change upserted, one typed row per key.

The same table and rule as the Delta current table (:mod:`exactly_once_provider.sinks.current_table`): the
source columns, typed as the full load loads them (:func:`pg_type` of their Arrow type), then ``_eo_version`` and ``_eo_deleted``;
a change replaces a row only if its version is newer; deletes stay as tombstones (readers select
``WHERE NOT _eo_deleted``). The full load itself is the Delta one of the history -> stream template: this table
builds on the Delta commit its handoff names.

Where the guarantees live, each in one transaction of the pipeline's advisory lock:

* :meth:`CurrentTable.build` (the job's ``prepare``): the full load's rows, read from that Delta commit with
  delta-rs batch by batch, COPYed into a new table, with the load id and the schema state in
  ``eo_current_tables``: the table of a load is there whole, or the old one is. A new full load (full reload)
  rebuilds it the same way; the stream's offsets are untouched (its older changes are left out by version).
* :meth:`CurrentTable.apply` (inside :meth:`~exactly_once_provider.sinks.postgres.PostgresSink._batch_transaction`,
  with the offsets): the columns a schema change added (``ALTER TABLE ... ADD COLUMN``, transactional in
  PostgreSQL), the columns a followed widening widened (``ALTER TABLE ... ALTER COLUMN ... TYPE``, one statement
  for all of them: INT -> BIGINT, a larger numeric, real -> double precision, the key's too), the value the server
  gave the rows older than the statement (``UPDATE ... WHERE _eo_version <``
  its version: an added column's default, NULL in a dropped one, a renamed column's old values), the batch's
  changes (``INSERT ... ON CONFLICT ... WHERE`` newer) and the new schema state: all committed with the batch's
  offsets, or none of it.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from typing import Any

import pyarrow as pa
from psycopg2 import sql

from exactly_once_provider import faults
from exactly_once_provider.sinks import version_rule
from exactly_once_provider.sinks.current_table import DELETED_COLUMN, META_COLUMNS, VERSION_COLUMN

log = logging.getLogger(__name__)
STATE_TABLE = "eo_current_tables"
_DDL_STATE = f"""
CREATE TABLE IF NOT EXISTS {STATE_TABLE} (
    pipeline text NOT NULL, table_name text NOT NULL, load_id text NOT NULL, schema_state text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pipeline, table_name))
"""
BUILD_BATCH_ROWS = 50_000


_FIXED_TYPES = {
    pa.int32(): "integer",
    pa.int64(): "bigint",
    pa.float32(): "real",
    pa.float64(): "double precision",
    pa.date32(): "date",
    pa.binary(): "bytea",
    pa.large_binary(): "bytea",
    pa.string(): "text",
    pa.large_string(): "text",
    pa.bool_(): "boolean",
}


def pg_type(data_type: pa.DataType) -> str:
    """Return the PostgreSQL type holding every value of the Arrow type a column is loaded as."""
    if data_type in _FIXED_TYPES:
        return _FIXED_TYPES[data_type]
    if pa.types.is_decimal(data_type):
        return f"numeric({data_type.precision},{data_type.scale})"
    if pa.types.is_timestamp(data_type):
        return "timestamptz" if data_type.tz else "timestamp"
    raise ValueError(f"No PostgreSQL type for the loaded type {data_type}.")


_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
_WIDER = {"integer": ("bigint", "double precision"), "real": ("double precision",)}


def widens(held: str, wanted: str) -> bool:
    """Return whether a column of PostgreSQL type ``held`` (as ``format_type`` prints it) is altered to ``wanted``
    (:func:`pg_type` of the batch's type): a widening the schema change rules followed
    (:func:`exactly_once_provider.spark_jobs.schema_change.type_change`), which ``ALTER COLUMN ... TYPE`` applies
    exactly. Other differences are spellings of one type (``timestamptz``) and are left alone.

    :param held: the column's type in the table.
    :param wanted: the type the batch carries.
    """
    if held == wanted:
        return False
    if wanted in _WIDER.get(held, ()):
        return True
    wide = _NUMERIC.match(wanted)
    if not wide:
        return False
    if held in ("integer", "bigint"):
        return True
    narrow = _NUMERIC.match(held)
    return (
        bool(narrow)
        and int(wide.group(2)) >= int(narrow.group(2))
        and (int(wide.group(1)) - int(wide.group(2)) >= int(narrow.group(1)) - int(narrow.group(2)))
    )


def refuse_nul(table: pa.Table, key: tuple[str, ...], where: str) -> None:
    """Raise ValueError naming the column and keys of text holding NUL, which PostgreSQL text cannot store.

    :param where: the rows' origin, for the message (the full load, a batch).
    """
    import pyarrow.compute as pc

    for field in table.schema:
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            continue
        bad = table.filter(pc.fill_null(pc.match_substring(table[field.name], "\x00"), False))
        if bad.num_rows:
            keys = [tuple(row[k] for k in key) for row in bad.select(list(key)).slice(0, 5).to_pylist()]
            raise ValueError(
                f"Column {field.name!r} of {bad.num_rows} row(s) of {where} holds the NUL character, which "
                f"PostgreSQL text cannot store (keys {keys}{' ...' if bad.num_rows > 5 else ''}). Nothing of it was "
                "committed. Remove the NUL characters at the source (the next change of each row carries the new "
                "value), or keep this table in the Delta current table only."
            )


def csv_rows(table: pa.Table) -> io.BytesIO:
    """Return ``table`` as CSV that ``COPY ... (FORMAT csv)`` reads back value for value.

    Arrow writes NULL as an empty field and every string quoted (an empty string is ``""``); binary has no CSV
    form, so it goes as bytea's hex text.
    """
    import pyarrow.csv as pacsv

    for i, field in enumerate(table.schema):
        if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            hexed = pa.array([None if v is None else "\\x" + v.hex() for v in table.column(i).to_pylist()], pa.string())
            table = table.set_column(i, field.name, hexed)
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer, pacsv.WriteOptions(include_header=False))
    buffer.seek(0)
    return buffer


class CurrentTable:
    """One pipeline's current table in PostgreSQL (see the module).

    :param table: the table's identifier.
    :param pipeline: the pipeline's stable name.
    """

    def __init__(self, table: sql.Identifier, pipeline: str) -> None:
        self.table = table
        self.pipeline = pipeline

    @staticmethod
    def ensure_state_table(cur) -> None:
        cur.execute(_DDL_STATE)

    def schema_state(self, cur) -> dict | None:
        """Return the schema state this table's last build or batch recorded (None: this pipeline never built it)."""
        cur.execute("SELECT to_regclass(%s)", (STATE_TABLE,))
        if cur.fetchone()[0] is None:
            return None
        cur.execute(
            f"SELECT schema_state FROM {STATE_TABLE} WHERE pipeline = %s AND table_name = %s",
            (self.pipeline, self.table.as_string(cur)),
        )
        row = cur.fetchone()
        return json.loads(row[0]) if row else None

    def _write_state(self, cur, state: dict) -> None:
        cur.execute(
            f"INSERT INTO {STATE_TABLE} (pipeline, table_name, load_id, schema_state) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (pipeline, table_name) DO UPDATE SET"
            " load_id = EXCLUDED.load_id, schema_state = EXCLUDED.schema_state, updated_at = now()",
            (self.pipeline, self.table.as_string(cur), state["load_id"], json.dumps(state)),
        )

    def _exists(self, cur) -> bool:
        cur.execute("SELECT to_regclass(%s)", (self.table.as_string(cur),))
        return cur.fetchone()[0] is not None

    def _refuse_foreign_table(self, cur) -> None:
        """Refuse to replace a table this pipeline did not build (a user's table, another pipeline's)."""
        name = self.table.as_string(cur)
        cur.execute(f"SELECT pipeline FROM {STATE_TABLE} WHERE table_name = %s", (name,))
        owners = [r[0] for r in cur.fetchall()]
        if self.pipeline not in owners:
            built_by = f"the current table of pipeline {owners[0]!r}" if owners else "not built by this provider"
            raise ValueError(
                f"PostgreSQL table {name} exists and is {built_by}; the current table of pipeline "
                f"{self.pipeline!r} replaces its table at every full load. Name another table "
                "(postgres_table / sink_table), or drop this one if it may go."
            )

    def _held_columns(self, cur) -> set[str]:
        cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(self.table))
        return {d[0] for d in cur.description}

    def _held_types(self, cur) -> dict[str, str]:
        """Return ``{column: type}`` of the table as PostgreSQL prints types (``format_type``)."""
        cur.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (self.table.as_string(cur),),
        )
        return dict(cur.fetchall())

    def _refuse_stale_build(self, cur, handoff: Any) -> None:
        """Refuse to build from a full load this pipeline built from before once its stream has committed: the
        changes applied since are in no full load (a dropped table, a renamed ``sink_table``)."""
        cur.execute(
            f"SELECT table_name FROM {STATE_TABLE} WHERE pipeline = %s AND load_id = %s",
            (self.pipeline, handoff.load_id),
        )
        built = sorted(r[0] for r in cur.fetchall())
        if built:
            name = self.table.as_string(cur)
            what = "is gone" if built == [name] else f"is new to it (it built {', '.join(built)})"
            raise ValueError(
                f"PostgreSQL table {name} {what}, and pipeline {self.pipeline!r} has committed changes since it "
                f"built from full load {handoff.load_id} of {handoff.schema}.{handoff.table}: built again from that "
                "load it would miss them. Nothing was written. Run a full reload (full_reload=true): the table is "
                "built from the new load and the stream goes on from its offsets."
            )

    def build(
        self, cur, handoff: Any, delta_location: Any, storage_options: dict | None = None, streamed: bool = False
    ) -> bool:
        """Create the table from the full load ``handoff`` names, unless it holds that load; return whether built.

        :param cur: a cursor of a transaction holding the pipeline's advisory lock (committed by the caller).
        :param handoff: the full load's :class:`~exactly_once_provider.full_load.handoff.Handoff`.
        :param delta_location: the Delta table the full load published (a URI delta-rs opens).
        :param storage_options: delta-rs storage options (object storage).
        :param streamed: the stream has committed offsets (its changes since some full load are in this table
            only): a load this pipeline built from before is refused, a new one (a full reload) is fine.
        """
        from deltalake import DeltaTable

        state = self.schema_state(cur)
        if state is not None and state.get("load_id") == handoff.load_id and self._exists(cur):
            return False
        if streamed:
            self._refuse_stale_build(cur, handoff)
        started = time.monotonic()
        columns = list(handoff.columns)
        names = [c.name for c in columns] + list(META_COLUMNS)
        try:
            dataset = DeltaTable(
                delta_location, version=handoff.table_version, storage_options=storage_options
            ).to_pyarrow_dataset()
        except Exception as err:
            raise RuntimeError(
                f"The full load {handoff.load_id} of {handoff.schema}.{handoff.table} (version {handoff.table_version} "
                f"of {delta_location}) cannot be read any more ({type(err).__name__}: {err}); run a full reload "
                "(full_reload=true) to build the PostgreSQL current table again."
            ) from err
        if self._exists(cur):
            self._refuse_foreign_table(cur)
            cur.execute(sql.SQL("DROP TABLE {}").format(self.table))
        types = dataset.schema  # the full load's Arrow types: arrow_type of each source column
        definitions = [
            sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(pg_type(types.field(c.name).type))) for c in columns
        ]
        definitions += [
            sql.SQL(f"{VERSION_COLUMN} bigint NOT NULL"),
            sql.SQL(f"{DELETED_COLUMN} boolean NOT NULL"),
            sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, handoff.key))),
        ]
        cur.execute(sql.SQL("CREATE TABLE {} ({})").format(self.table, sql.SQL(", ").join(definitions)))
        rows = 0
        for batch in dataset.to_batches(columns=names, batch_size=BUILD_BATCH_ROWS):
            rows_read = pa.Table.from_batches([batch])
            refuse_nul(rows_read, tuple(handoff.key), f"the full load {handoff.load_id}")
            rows += self._copy(cur, self.table, rows_read, names)
            log.info(
                "PostgreSQL current table %s: %d full-load rows copied (%.0f rows/s)",
                self.table.as_string(cur),
                rows,
                rows / max(time.monotonic() - started, 1e-3),
            )
        self._write_state(
            cur,
            {
                "load_id": handoff.load_id,
                "columns": [c.to_json() for c in columns],
                "fills": [],
                "applied": handoff.min_version,
            },
        )
        log.info(
            "PostgreSQL current table %s built from full load %s: %d rows in %.1fs",
            self.table.as_string(cur),
            handoff.load_id,
            rows,
            time.monotonic() - started,
        )
        faults.fault_point("postgres_current_built")  # EO_FAULT_AT=postgres_current_built: built, not committed
        return True

    @staticmethod
    def _copy(cur, target: sql.Composable, table: pa.Table, names: list[str]) -> int:
        if table.num_rows:
            columns = sql.SQL(", ").join(map(sql.Identifier, names))
            cur.copy_expert(
                sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(target, columns).as_string(cur),
                csv_rows(table.select(names)),
            )
        return table.num_rows

    def apply(
        self, cur, changes: pa.Table, state: dict, fills: list, schema_changed: bool, key: tuple[str, ...]
    ) -> int:
        """Apply one batch inside its transaction (see the module); return the changes written.

        :param changes: the batch's newest change per key, typed (Arrow, the state's columns then the meta ones).
        :param state: the schema state this batch commits (:class:`~exactly_once_provider.spark_jobs.current_changes.CurrentChanges`).
        :param fills: the fills of schema changes first followed by this batch (values of the older rows).
        :param schema_changed: the batch follows a schema change.
        :param key: the source table's key columns.
        """
        names = [c["name"] for c in state["columns"]] + list(META_COLUMNS)
        refuse_nul(changes, key, "a batch of changes")  # before any statement: the transaction writes nothing
        types = {field.name: pg_type(field.type) for field in changes.schema}  # typed by the full load's rules
        held = self._held_columns(cur)
        for name in (n for n in names if n not in held):
            cur.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    self.table, sql.Identifier(name), sql.SQL(types[name])
                )
            )
        widen = [
            sql.SQL("ALTER COLUMN {0} TYPE {1} USING {0}::{1}").format(sql.Identifier(name), sql.SQL(types[name]))
            for name, held_type in self._held_types(cur).items()
            if name in types and widens(held_type, types[name])
        ]
        if widen:  # one statement: PostgreSQL rewrites the table (and its key index) once for all of them
            cur.execute(sql.SQL("ALTER TABLE {} {}").format(self.table, sql.SQL(", ").join(widen)))
        for fill in sorted(fills, key=lambda f: f.version):  # in statement order: a rename reads earlier fills
            if fill.source == fill.column:  # FLOAT -> DOUBLE: real -> double precision above is the server's
                continue  # conversion of the stored values (the batch's older changes: current_table.as_converted)
            if fill.source is not None:
                value = sql.Identifier(fill.source)
            elif fill.value is None:  # a dropped column (it stays, NULL in every row)
                value = sql.SQL("NULL")
            else:
                value = sql.SQL("CAST({} AS {})").format(sql.Literal(fill.value), sql.SQL(types[fill.column]))
            cur.execute(
                sql.SQL("UPDATE {} SET {} = {} WHERE {} < %s").format(
                    self.table, sql.Identifier(fill.column), value, sql.Identifier(VERSION_COLUMN)
                ),
                (fill.version,),
            )
        if schema_changed:  # the table's new columns and filled rows exist in this transaction only
            faults.fault_point("current_schema_changed")  # EO_FAULT_AT=current_schema_changed[:n]
        written = 0
        if changes.num_rows:
            staged = sql.Identifier("eo_current_changes")
            cur.execute(
                sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} LIMIT 0").format(
                    staged, sql.SQL(", ").join(map(sql.Identifier, names)), self.table
                )
            )
            written = self._copy(cur, staged, changes, names)
            listed = sql.SQL(", ").join(map(sql.Identifier, names))
            updates = sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in names if n not in key
            )
            cur.execute(
                sql.SQL(
                    "INSERT INTO {t} ({c}) SELECT {c} FROM {s} ON CONFLICT ({k}) DO UPDATE SET {u} WHERE {newer}"
                ).format(
                    t=self.table,
                    c=listed,
                    s=staged,
                    k=sql.SQL(", ").join(map(sql.Identifier, key)),
                    u=updates,
                    newer=version_rule.postgres_condition(self.table, VERSION_COLUMN),
                )
            )
        self._write_state(cur, state)
        return written
