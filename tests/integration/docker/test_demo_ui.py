"""The Airflow UI command that ``make demo`` prints works as printed, and serves the status page.

The command comes from ``docker/local/ui.sh --instructions``, the text demo.sh ends with. It runs in a shell
whose PATH lacks the venv and whose environment has no Airflow or demo settings (what a user's new terminal
has), in its own AIRFLOW_HOME and on free ports, off the stack's and the default 8080. The test logs in as
the admin that ``airflow standalone`` creates, reads the status page and stops the whole process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from exactly_once_provider.plugins.links import URL_PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
UI = REPO / "docker" / "local" / "ui.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user_shell_env() -> dict[str, str]:
    """This process's environment without anything Airflow, the demo or the venv put there."""
    venv_bin = str(REPO / ".venv" / "bin")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIRFLOW", "EO_", "PYSPARK", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    env["PATH"] = ":".join(p for p in env.get("PATH", "/usr/bin:/bin").split(":") if p != venv_bin)
    return env


def _printed(run: str, data_dir: Path, home: Path, port: int) -> str:
    """What demo.sh prints at its end, for a demo run with these settings."""
    env = {
        **_user_shell_env(),
        "AIRFLOW_HOME": str(home),
        "EO_DEMO_RUN": run,
        "EO_DATA_DIR": str(data_dir),
        "AIRFLOW__API__PORT": str(port),
    }
    return subprocess.run([str(UI), "--instructions"], env=env, capture_output=True, text=True, check=True).stdout


def test_demo_prints_its_ui_command_through_ui_sh():
    demo = (REPO / "docker" / "local" / "demo.sh").read_text()
    assert "docker/local/ui.sh --instructions" in demo
    assert "airflow standalone" not in demo  # the command that failed from PATH is not printed any more


def _get(url: str, token: str | None = None, accept: str = "text/html") -> tuple[int, str]:
    headers = {"Accept": accept, **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_printed_ui_command_serves_the_status_page(stack, tmp_path):
    run, home, port = f"-ui{uuid.uuid4().hex[:6]}", tmp_path / "airflow", _free_port()
    text = _printed(run, tmp_path / "data", home, port)
    (command,) = [line.strip() for line in text.splitlines() if line.strip().endswith("ui.sh")]
    assert f"EO_DEMO_RUN={run}" in command and f"AIRFLOW__API__PORT={port}" in command
    page_url = f"http://localhost:{port}{URL_PREFIX}/"
    assert page_url in text
    password_file = home / "simple_auth_manager_passwords.json.generated"
    assert str(password_file) in text

    # The log servers of the scheduler and the triggerer would take 8793/8794, which another Airflow on this
    # machine may hold: free ports here (not in the printed command, a user's machine has one Airflow).
    env = {
        **_user_shell_env(),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
    }
    log_path = tmp_path / "ui.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            ["bash", "-c", command], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    def wait_for(what: str, check, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            assert process.poll() is None, f"the UI command exited ({process.returncode}) waiting for {what}:\n{tail()}"
            try:
                if result := check():
                    return result
            except OSError:
                pass
            assert time.monotonic() < deadline, f"no {what} after {timeout}s:\n{tail()}"
            time.sleep(1)

    try:
        wait_for(
            "API server",
            lambda: _get(f"http://127.0.0.1:{port}/api/v2/monitor/health", accept="application/json")[0] == 200,
            300,
        )
        password = wait_for(
            "admin password", lambda: password_file.exists() and json.loads(password_file.read_text()).get("admin"), 60
        )
        status, _ = _get(page_url, accept="application/json")
        assert status == 401  # the page is behind Airflow's login

        login = urllib.request.Request(
            f"http://localhost:{port}/auth/token",
            method="POST",
            data=json.dumps({"username": "admin", "password": password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(login, timeout=60) as response:
            token = json.load(response)["access_token"]

        # The DAG processor parses dags/ with this run's settings; the page then lists the demo's pipelines.
        pipeline = f"shop-orders{run}"

        def page_with_pipeline():
            status, body = _get(page_url, token)
            assert status == 200, body[:2000]
            return body if f'data-pipeline="{pipeline}"' in body else None

        body = wait_for(f"pipeline {pipeline} on the status page", page_with_pipeline, 240)
        assert "<title>Exactly-once pipelines</title>" in body
        assert f'data-pipeline="shop-settlement{run}"' in body
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen) -> None:
    """Stop everything the command started (its own process group), forcefully if it does not stop."""
    for sig, grace in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            process.poll()
            try:
                os.killpg(process.pid, 0)  # anyone left in the group?
            except ProcessLookupError:
                return
            time.sleep(0.5)
    raise AssertionError(f"processes of group {process.pid} survived SIGKILL")
