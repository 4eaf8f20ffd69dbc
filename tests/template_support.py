"""Helpers for end-to-end template tests: a DAG folder holding one DAG built by a template, run by ``dags test``."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class TemplateDag:
    """One DAG file written from a template call, in its own DAG folder, run with ``airflow dags test``."""

    def __init__(self, airflow_home: dict, folder: Path, dag_id: str, factory: str, kwargs: dict) -> None:
        self.dag_id = dag_id
        folder.mkdir(parents=True, exist_ok=True)
        module, function = factory.rsplit(".", 1)
        # "airflow" and "dag" must appear in the file, or the DAG processor's safe mode skips it.
        (folder / f"{dag_id}.py").write_text(
            textwrap.dedent(f"""\
            # An airflow DAG built by a template for a test.
            import json
            import pendulum
            from {module} import {function}

            kwargs = json.loads({json.dumps(json.dumps(kwargs))})
            kwargs["start_date"] = pendulum.parse(kwargs["start_date"])
            dag = {function}(**kwargs)
        """)
        )
        # The templates live in the repository's dags/ (the DAG folder of a real deployment is on sys.path).
        self.env = {
            **airflow_home,
            "AIRFLOW__CORE__DAGS_FOLDER": str(folder),
            "PYTHONPATH": os.pathsep.join([str(REPO / "dags"), airflow_home.get("PYTHONPATH", "")]),
        }

    def test(self, logical_date: str | None = None, conf: dict | None = None, timeout: float = 900) -> str:
        """Run ``airflow dags test``; return the output; fail with its tail unless the run succeeded."""
        args = [
            str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "airflow"),
            "dags",
            "test",
            self.dag_id,
        ]
        if logical_date:
            args.append(logical_date)
        if conf:
            args += ["--conf", json.dumps(conf)]
        result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "state=success" in output, output[-6000:]
        return output


def create_payments(cur, table: str) -> None:
    """Create a settlement source: payments whose cursor column ``updated_at`` the database sets."""
    cur.execute(
        f"CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, "
        "currency CHAR(3) NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) "
        "ON UPDATE CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )


def create_orders(cur, table: str, rows: int) -> None:
    """Create a history -> stream source: ``rows`` orders with ids 1..rows (amount, currency, a nullable note)."""
    from decimal import Decimal

    cur.execute(
        f"CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL,"
        " currency CHAR(3) NOT NULL, note VARCHAR(20) NULL)"
    )
    cur.executemany(
        f"INSERT INTO {table} (amount, currency, note) VALUES (%s, %s, %s)",
        [(Decimal(i) / 4, ("EUR", "USD")[i % 2], f"n{i}") for i in range(rows)],
    )
