"""The OpenLineage facets: schemas (nested for record envelopes), output statistics, the committed progress, and
the schema and commit sizes read from a Delta log."""

from __future__ import annotations

import json

import pytest
from openlineage.client.serde import Serde

from exactly_once_provider import lineage
from exactly_once_provider import lineage_facets as facets

pytestmark = pytest.mark.unit


def test_output_dataset_carries_schema_statistics_and_the_committed_position():
    columns = [("id", "bigint"), ("amount", "decimal(12,2)")]
    out = facets.output_dataset(
        lineage.kafka_topic("b:1", "p.eo.t"),
        facets.record_fields(facets.CHANGE_RECORD_FIELDS, "before,after", columns),
        rows=42,
        size=1000,
        files=2,
        commit=facets.CommitFacet(pipeline="p", position="binlog.000001:18146205", gtid="0-1-77"),
    )
    event = json.loads(Serde.to_json(out))
    fields = {f["name"]: f for f in event["facets"]["schema"]["fields"]}
    assert list(fields) == list(facets.CHANGE_RECORD_FIELDS)
    assert [(f["name"], f["type"]) for f in fields["after"]["fields"]] == columns
    assert "fields" not in fields["version"]
    stats = event["outputFacets"]["outputStatistics"]
    assert (stats["rowCount"], stats["size"], stats["fileCount"]) == (42, 1000, 2)
    commit = event["outputFacets"][facets.COMMIT_FACET]
    assert (commit["pipeline"], commit["position"], commit["gtid"]) == ("p", "binlog.000001:18146205", "0-1-77")


def test_an_output_without_a_run_has_no_statistics():
    event = json.loads(Serde.to_json(facets.output_dataset(lineage.storage_path("/t"))))
    assert event.get("outputFacets", {}) == {} and event.get("facets", {}) == {}


def test_delta_schema_and_commit_sizes_from_the_log(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    schema = {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": False, "metadata": {}},
            {"name": "s", "type": {"type": "struct", "fields": []}, "nullable": True, "metadata": {}},
        ],
    }
    actions = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": "x",
                "format": {"provider": "parquet"},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
            }
        },
        {"add": {"path": "a.parquet", "size": 100, "dataChange": True}},
    ]
    (log / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))
    (log / f"{1:020d}.json").write_text(
        "\n".join(
            json.dumps(a)
            for a in (
                {"add": {"path": "b.parquet", "size": 7, "dataChange": True}},
                {"add": {"path": "c.parquet", "size": 5, "dataChange": True}},
            )
        )
    )
    assert facets.delta_fields(str(tmp_path / "t")) == [("id", "long"), ("s", "struct")]
    assert facets.delta_commit_size(str(tmp_path / "t"), 0, 1) == (12, 2)
    assert facets.delta_commit_size(str(tmp_path / "t"), -1, 1) == (112, 3)
    assert facets.delta_fields(str(tmp_path / "missing")) == []
