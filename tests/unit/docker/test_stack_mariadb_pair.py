"""The MariaDB replication pair of the local stack without starting it: its settings and that `up` leaves it out."""

from __future__ import annotations

import inspect

from tests.conftest import STACK


def test_a_pair_server_runs_the_captures_settings_plus_gtid_failover_on_a_small_budget(tmp_path):
    server = STACK.MariadbServer("x-replica", tmp_path / "replica", 40001, 102)
    settings = dict(line.split("=", 1) for line in server.cnf().read_text().splitlines()[1:] if "=" in line)
    for key, value in {**STACK.MARIADB_SETTINGS, "server_id": "102"}.items():
        if key not in STACK.MARIADB_PAIR_MEMORY:
            assert settings[key] == value, key  # binlog_row_metadata=FULL, ROW, FULL image like the shared server
    assert settings["gtid_strict_mode"] == "ON" and settings["log_slave_updates"] == "ON"
    assert settings["innodb_buffer_pool_size"] == "48M" and settings["performance_schema"] == "OFF"
    assert settings["port"] == "40001" and settings["datadir"] == str(tmp_path / "replica" / "data")


def test_stack_up_never_starts_a_pair():
    assert "mariadb_pair" not in inspect.getsource(STACK.up)
    assert "pair" not in STACK.SERVICES
