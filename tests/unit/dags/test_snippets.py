"""A DAG file copied from the README (or a template's page) is found by Airflow's default DAG discovery and parses.

Airflow's safe mode parses only the files of the DAG folder that mention both "airflow" and "dag": a file that only
calls a template may mention neither, and Airflow then says the DAG "could not be found".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WHOLE_FILES = [
    ("README.md", "howto_template_settlement", "eo_settlement"),
    ("docs/templates/settlement.md", "howto_template_settlement", "eo_settlement"),
    ("docs/templates/history-stream.md", "howto_template_history_stream", "eo_history_stream"),
    ("docs/dead-letters.md", "howto_template_dead_letter_repair", "eo_dead_letter_repair"),
]


def _snippet(page: str, region: str) -> str:
    text = (REPO / page).read_text()
    match = re.search(rf"<!-- include: \S+ {region} -->\n```python\n(.*?)```\n<!-- end include -->", text, re.DOTALL)
    assert match, f"{page} does not include {region}"
    return match.group(1)


@pytest.mark.parametrize("page,region,dag_id", WHOLE_FILES)
def test_a_dag_file_copied_from_the_docs_is_found_with_the_default_discovery(tmp_path, page, region, dag_id):
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "my_pipeline.py").write_text(_snippet(page, region))
    bag = DagBag(dag_folder=str(tmp_path), safe_mode=True)
    assert bag.import_errors == {} and bag.dag_ids == [dag_id]


def test_a_file_without_the_discovery_line_is_skipped(tmp_path):
    # The check above could not fail if safe mode found every file: the same snippet without its first lines is not.
    snippet = _snippet(*WHOLE_FILES[0][:2])
    (tmp_path / "my_pipeline.py").write_text("\n".join(snippet.splitlines()[2:]))
    from airflow.dag_processing.dagbag import DagBag

    assert DagBag(dag_folder=str(tmp_path), safe_mode=True).dag_ids == []
