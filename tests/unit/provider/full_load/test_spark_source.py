"""The staged chunk file's Parquet encoding choices (full_load/spark_source.py); values are tested on the real server."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from exactly_once_provider.full_load.spark_source import _write_batches, dictionary_columns


def _batch(rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": list(range(rows)), "status": [f"s{n % 3}" for n in range(rows)], "half": [n // 2 for n in range(rows)]}
    )


def test_dictionaries_only_for_columns_whose_first_batch_repeats_values():
    assert dictionary_columns(_batch(2000)) == ["status", "half"]  # one distinct value per two rows still repeats
    assert dictionary_columns(pa.RecordBatch.from_pydict({"id": list(range(2000))})) is False
    assert dictionary_columns(_batch(999)) is True and dictionary_columns(None) is True  # too little to judge


def test_the_staged_file_encodes_a_key_plainly_and_a_repeating_column_with_its_dictionary():
    batch = _batch(5000)
    sink = io.BytesIO()
    assert _write_batches(sink, batch.schema, iter([batch, batch])) == 10_000
    file = pq.ParquetFile(io.BytesIO(sink.getvalue()))
    group = file.metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    assert not any("DICTIONARY" in e for e in encodings["id"]), encodings
    assert any("DICTIONARY" in e for e in encodings["status"]), encodings
    assert file.read().to_pydict() == pa.Table.from_batches([batch, batch]).to_pydict()
