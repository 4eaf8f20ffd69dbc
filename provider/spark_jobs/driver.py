"""What every packaged job's driver does first and last: die with its JVM, read its spec, answer in a file."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from exactly_once_provider.connections import read_secret_file
from exactly_once_provider.spark_jobs.session import register_storage
from exactly_once_provider.spark_jobs.spec import JobSpec, report_error, report_result


def exit_with_the_jvm() -> None:
    """Stop this Python driver as soon as the driver JVM that started it is gone.

    spark-submit's PythonRunner starts the Python driver as its child (and sets ``PYSPARK_GATEWAY_PORT``). A
    driver JVM killed from outside does not take that child with it: in standalone cluster mode the master
    kills the driver JVM by id and the Python process stayed behind on the worker, orphaned and sometimes hung
    in interpreter shutdown (where no Python thread runs any more). So the kernel does it: on Linux the parent
    death signal SIGKILLs this process when the JVM thread that started it ends; elsewhere a thread polls the
    parent. Without its JVM the driver cannot start another batch; going at once is the same as a SIGKILL at
    that instant, which every sink survives (an unfinished commit is rolled back or never published).
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        if ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL) == 0:
            if os.getppid() != parent:  # the JVM ended before the signal was armed
                os._exit(3)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(3)

    threading.Thread(target=watch, name="eo-exit-with-the-jvm", daemon=True).start()


def run_job(job: str, body: Callable[[JobSpec, dict[str, Any]], Any], argv: list[str]) -> int:
    """Run ``body(spec, secrets)`` as the driver of ``job``; write its result, or the error that stopped it.

    The secrets file holds the settings of the connections the job needs, resolved by the operator (the driver
    reads no Airflow connection): ``body`` takes them from ``secrets``; spark-submit never had them.

    :param job: the job's name (the spec must be for it).
    :param body: the job.
    :param argv: the driver's arguments: ``--spec <file>``.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    exit_with_the_jvm()
    parser = argparse.ArgumentParser(prog=job)
    parser.add_argument("--spec", required=True, help="the job spec written by the operator (JSON)")
    spec = JobSpec.read(parser.parse_args(argv).spec, job)
    try:
        secrets = read_secret_file(spec.secrets_file)
        register_storage(secrets)
        result = body(spec, secrets)
    except BaseException as err:
        report_error(spec, err)
        raise
    report_result(spec, result)
    return 0
