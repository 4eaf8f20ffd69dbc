"""A real Airflow for end-to-end tests: api-server, scheduler, dag-processor and triggerer as subprocesses.

LocalExecutor (parallelism 2), a fresh PostgreSQL metadata database on the stack's PostgreSQL per session,
the simple auth manager with one known admin, a per-session DAG folder. Runs are triggered, cleared and
marked failed through the REST API (``/api/v2``), as the UI does. :class:`AirflowClient` is the small REST
client the tests use; :func:`write_template_dag` writes a DAG file built by a template into the DAG folder.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

from tests.profiling import timed

REPO = Path(__file__).resolve().parents[1]
ADMIN = "admin"
TERMINAL_RUN_STATES = {"success", "failed"}
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


def write_template_dag(folder: Path, dag_id: str, factory: str, kwargs: dict) -> Path:
    """Write ``<dag_id>.py`` calling ``factory(**kwargs)`` into the DAG folder (``start_date`` as ISO text, a
    duration as ``{"seconds": n}``)."""
    module, function = factory.rsplit(".", 1)
    path = folder / f"{dag_id}.py"
    # "airflow" and "dag" must appear in the file, or the DAG processor's safe mode skips it.
    path.write_text(
        textwrap.dedent(f"""\
        # An airflow DAG built by a template for a test.
        import datetime
        import json
        import pendulum
        from {module} import {function}

        kwargs = json.loads({json.dumps(json.dumps(kwargs))})
        kwargs["start_date"] = pendulum.parse(kwargs["start_date"])
        kwargs.update({{k: datetime.timedelta(**v) for k, v in kwargs.items() if isinstance(v, dict) and set(v) == {{"seconds"}}}})
        dag = {function}(**kwargs)
    """)
    )
    return path


class AirflowClient:
    """The REST calls the tests make, authenticated with a JWT from ``POST /auth/token``."""

    def __init__(self, base_url: str, username: str, password: str, logs: Path | None = None) -> None:
        self.base_url, self.username, self.password, self.logs = base_url, username, password, logs
        self._http = httpx.Client(base_url=base_url, timeout=60)

    def close(self) -> None:
        self._http.close()

    def token(self) -> str:
        answer = self._http.post("/auth/token", json={"username": self.username, "password": self.password})
        assert answer.status_code == 201, f"POST /auth/token: {answer.status_code} {answer.text}"
        return answer.json()["access_token"]

    def request(self, method: str, path: str, expect: tuple[int, ...] = (200,), **kwargs) -> dict:
        if "Authorization" not in self._http.headers:
            self._http.headers["Authorization"] = f"Bearer {self.token()}"
        answer = self._http.request(method, f"/api/v2{path}", **kwargs)
        if answer.status_code == 401:  # the token expired: one new login
            self._http.headers["Authorization"] = f"Bearer {self.token()}"
            answer = self._http.request(method, f"/api/v2{path}", **kwargs)
        assert answer.status_code in expect, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json() if answer.content else {}

    # ------------------------------------------------------------------------------------------ DAGs
    def dag(self, dag_id: str) -> dict | None:
        answer = self.request("GET", f"/dags/{dag_id}", expect=(200, 404))
        return answer if answer.get("dag_id") == dag_id else None

    @timed("airflow_wait")
    def wait_dag(self, dag_id: str, timeout: float = 180) -> dict:
        """Wait until the dag-processor has parsed ``dag_id`` into the metadata DB; fail with its errors."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := self.dag(dag_id):
                return found
            time.sleep(1)
        errors = self.request("GET", "/importErrors")
        raise AssertionError(f"DAG {dag_id} not parsed within {timeout}s; import errors: {errors}")

    def unpause(self, dag_id: str) -> dict:
        return self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    # ------------------------------------------------------------------------------------------ runs
    def trigger(self, dag_id: str, conf: dict | None = None, logical_date: str | None = None) -> str:
        """Trigger a run (with Params in ``conf``); return its run id."""
        body = {"logical_date": logical_date, "conf": conf or {}}
        return self.request("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"]

    def backfill(self, dag_id: str, from_date: str, to_date: str, max_active_runs: int = 1) -> dict:
        """Create a backfill of the intervals whose logical date is in [from_date, to_date] (the UI's "Backfill")."""
        body = {
            "dag_id": dag_id,
            "from_date": from_date,
            "to_date": to_date,
            "max_active_runs": max_active_runs,
            "run_backwards": False,
            "reprocess_behavior": "none",
            "dag_run_conf": {},
        }
        return self.request("POST", "/backfills", json=body)

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs, newest first (scheduled ones included)."""
        return self.request("GET", f"/dags/{dag_id}/dagRuns", params={"order_by": "-start_date"})["dag_runs"]

    def pause(self, dag_id: str) -> dict:
        return self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": True})

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    @timed("airflow_wait")
    def wait_run(self, dag_id: str, run_id: str, state: str = "success", timeout: float = 900) -> dict:
        """Wait for the run to reach ``state``; fail early (with the task states and logs) on another end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.run(dag_id, run_id)
            if found["state"] == state:
                return found
            if found["state"] in TERMINAL_RUN_STATES:
                raise AssertionError(
                    f"run {run_id} of {dag_id} ended {found['state']}, not {state}:\n" + self.describe(dag_id, run_id)
                )
            time.sleep(2)
        raise AssertionError(
            f"run {run_id} of {dag_id} not {state} within {timeout}s:\n" + self.describe(dag_id, run_id)
        )

    # ------------------------------------------------------------------------------------ task instances
    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    @timed("airflow_wait")
    def wait_task(self, dag_id: str, run_id: str, task_id: str, states: tuple[str, ...], timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.task_instance(dag_id, run_id, task_id)
            if found["state"] in states:
                return found
            if found["state"] in ("failed", "upstream_failed", "success", "skipped"):
                raise AssertionError(
                    f"{task_id} in {run_id} ended {found['state']}, waited for {states}:\n"
                    + self.describe(dag_id, run_id)
                )
            time.sleep(1)
        raise AssertionError(
            f"{task_id} in {run_id} not in {states} within {timeout}s:\n" + self.describe(dag_id, run_id)
        )

    def clear(self, dag_id: str, run_id: str, task_ids: list[str], include_downstream: bool = True) -> list[dict]:
        """Clear tasks of one run (the UI's "Clear" with downstream); the run goes back to queued."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": task_ids,
            "only_failed": False,
            "include_downstream": include_downstream,
            "reset_dag_runs": True,
        }
        return self.request("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)["task_instances"]

    def mark(self, dag_id: str, run_id: str, task_id: str, state: str = "failed") -> dict:
        """Set a task instance's state (the UI's "Mark as failed/success"); a running task is then killed."""
        return self.request(
            "PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}", json={"new_state": state}
        )

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The task's log files of every try (read from the log folder; the REST log endpoint pages them)."""
        if self.logs is None:
            return ""
        files = sorted(self.logs.glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task_id}/**/*.log"))
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')}" for f in files)

    def describe(self, dag_id: str, run_id: str) -> str:
        lines = []
        for ti in self.task_instances(dag_id, run_id):
            lines.append(f"  {ti['task_id']}: {ti['state']} (try {ti['try_number']})")
            if ti["state"] in ("failed", "up_for_retry"):
                lines.append(self.task_log(dag_id, run_id, ti["task_id"])[-4000:])
        return "\n".join(lines)


class AirflowServer:
    """api-server, scheduler, dag-processor and triggerer of one test session, each in its own process group."""

    def __init__(self, stack, home: Path) -> None:
        self.stack, self.home = stack, home
        self.dags = home / "dags"
        self.logs = home / "logs"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.password = secrets.token_urlsafe(12)
        self.database = f"eo_airflow_{secrets.token_hex(4)}"
        self.processes: dict[str, subprocess.Popen] = {}
        self.client: AirflowClient | None = None
        self.env = self._env()

    def _env(self) -> dict[str, str]:
        s = self.stack
        db = f"postgresql+psycopg2://{s.DB_USER}:{s.DB_PASSWORD}@{s.HOST}:{s.POSTGRES_PORT}/{self.database}"
        passwords = self.home / "passwords.json"
        return {
            **os.environ,
            **s.connection_env(),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # Every component signs or checks the same JWTs: one secret for the session.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            # New DAG files are found within seconds, not the default five minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            # A test writes its DAG file once and never changes it: a new file is parsed when the refresh finds
            # it; the default re-parse of every file every 30 s (1-3 s of CPU each on a loaded 2-core machine,
            # one file per test, all kept for the package) only takes CPU from the tasks' Spark drivers.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs),
            # The templates' DAG files import from the repository's dags/ like a deployment's DAG folder.
            "PYTHONPATH": os.pathsep.join(p for p in [str(REPO / "dags"), os.environ.get("PYTHONPATH", "")] if p),
        }

    # ------------------------------------------------------------------------------------------ lifecycle
    @timed("airflow_start")
    def start(self, timeout: float = 240) -> AirflowClient:
        self.dags.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({ADMIN: self.password}))
        self._create_database()
        migrate = subprocess.run(
            [airflow_bin(), "db", "migrate"], env=self.env, capture_output=True, text=True, timeout=600
        )
        assert migrate.returncode == 0, (
            f"airflow db migrate failed:\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}"
        )
        for name in COMPONENTS:
            args = [airflow_bin(), name] + (
                ["--port", str(self.port), "--host", "127.0.0.1"] if name == "api-server" else []
            )
            out = open(self.home / f"{name}.log", "ab")
            # Own process group: teardown stops each component with every child it forked (task runners too).
            self.processes[name] = subprocess.Popen(
                args, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.home
            )
            out.close()
        self.client = AirflowClient(self.base_url, ADMIN, self.password, self.logs)
        self._wait_healthy(timeout)
        return self.client

    def _wait_healthy(self, timeout: float) -> None:
        """Poll ``/api/v2/monitor/health`` until the DB, scheduler, triggerer and dag-processor are healthy."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                assert proc.poll() is None, f"airflow {name} exited {proc.returncode}:\n{self.log_tail(name)}"
            try:
                last = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                last = None
            if last and all(
                (last.get(part) or {}).get("status") == "healthy"
                for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
            ):
                return
            time.sleep(1)
        raise AssertionError(
            f"Airflow not healthy within {timeout}s: {last}\n" + "\n".join(self.log_tail(n) for n in self.processes)
        )

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.home / f"{name}.log"
        return f"--- {name}.log\n" + (path.read_text(errors="replace")[-chars:] if path.exists() else "(none)")

    @timed("airflow_stop")
    def stop(self, timeout: float = 30) -> None:
        """SIGTERM every component's process group, SIGKILL what is left after ``timeout``, drop the DB."""
        if self.client:
            self.client.close()
        for proc in self.processes.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # children (task runners, Spark drivers) may outlive the leader
            proc.wait()
        self._drop_database()

    # ------------------------------------------------------------------------------------------ database
    def _admin_connection(self):
        import psycopg2

        s = self.stack
        conn = psycopg2.connect(
            host=s.HOST, port=s.POSTGRES_PORT, dbname=s.DB_NAME, user=s.DB_USER, password=s.DB_PASSWORD
        )
        conn.autocommit = True  # CREATE/DROP DATABASE cannot run in a transaction
        return conn

    def _create_database(self) -> None:
        conn = self._admin_connection()
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{self.database}"')
        conn.close()

    def _drop_database(self) -> None:
        conn = self._admin_connection()
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        conn.close()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def processes_matching(needle: str) -> list[str]:
    """``pid args`` of live processes whose command line contains ``needle``, read from /proc (``ps`` cuts
    lines at $COLUMNS, which pytest sets)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        if needle in args:
            found.append(f"{entry.name} {args}")
    return found
