"""A producing process for the kill tests: runs the operator over a numbered source, then exits.

Usage: python producer_process.py TOPIC LEDGER PIPELINE RECORDS [MAX_RECORDS_PER_TRANSACTION]
Kafka comes from AIRFLOW_CONN_KAFKA_DEFAULT; EO_FAULT_AT / EO_FAULT_ACTION choose where it dies or pauses;
EO_TEST_TRANSACTION_TIMEOUT_MS sets the producer's ``transaction.timeout.ms``.
Source record n (1-based) has key ``k<n % 7>`` and value ``"<n>"``, so the topic can be checked exactly.
"""

from __future__ import annotations

import json
import os
import sys

from exactly_once_provider.operators.kafka_produce import SourceRecord, TransactionalProduceOperator


def numbered(resume_after, records):
    for n in range((resume_after or 0) + 1, records + 1):
        yield SourceRecord(offset=n, key=f"k{n % 7}", value=str(n))


def main(topic: str, ledger: str, pipeline: str, records: str, per_transaction: str = "1000") -> None:
    result = TransactionalProduceOperator(
        task_id="produce",
        topic=topic,
        offsets_topic=ledger,
        pipeline=pipeline,
        delivery_mode="exactly_once",
        producer_function=numbered,
        producer_function_args=(int(records),),
        max_records_per_transaction=int(per_transaction),
        commit_interval_ms=60_000,
        producer_config={"transaction.timeout.ms": int(os.environ["EO_TEST_TRANSACTION_TIMEOUT_MS"])}
        if os.environ.get("EO_TEST_TRANSACTION_TIMEOUT_MS")
        else None,
    ).execute({})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
