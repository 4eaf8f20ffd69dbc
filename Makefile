# The README's two commands are `make demo` and `make test`; .ci/run calls `make test`.
# Everything else here is a building block of those two.
PY := .venv/bin/python
STACK := $(PY) docker/local/stack.py
PYTEST_ARGS ?=

.PHONY: test-profile lint format bench docs docs-tables setup stack-up stack-down stack-status stack-clean demo test test-all test-fast test-unit faults faults-matrix constraints test-airflow bench-producer bench-full-load bench-watermark bench-spark-sinks bench-capture bench-reconcile bench-history bench-freshness bench-freshness-operators bench-increment bench-commits test-templates

setup:  ## system packages + .venv (idempotent)
	bash docker/local/setup.sh

# CI (CI=true) starts the services from empty data (stack.py up --fresh): a stack home that earlier runs on the same
# machine filled with thousands of topics slows the broker and every test. Locally a running stack is reused.
FRESH_STACK ?= $(if $(filter true,$(CI)),--fresh)
stack-up: setup  ## start Kafka, MariaDB, PostgreSQL, MinIO (reuses running ones; builds MinIO once); resolves the Spark connector jars
	@t0=$$(date +%s); $(STACK) up $(FRESH_STACK); echo "[make] stack up: $$(( $$(date +%s) - t0 ))s"

stack-down:
	$(STACK) down

stack-status:
	$(STACK) status

stack-clean:
	$(STACK) clean

demo: stack-up  ## the end-to-end demo on the local stack (STORAGE=s3: its tables and checkpoints in MinIO)
	STORAGE=$(STORAGE) bash docker/local/demo.sh

# The whole proof in two parts: everything that shares the services peacefully on TEST_WORKERS pytest workers
# (most tests wait on Kafka, Spark or Airflow, so two workers use the 2 cores better than one; each test goes to the
# next free worker, longest first: tests/conftest.py), then the `exclusive` tests (they kill shared services or change server globals) alone.
# `make test` (CI) = unit + integration + every fault scenario and variant once (matrix) + the templates under a
# real Airflow driven by its REST API (e2e). It does not run the `airflow dags test` runs of the templates
# (dags_test: make test-templates). `make test-fast` leaves out the matrix and e2e. PYTEST_ARGS runs just those args.
TEST_WORKERS ?= 2
SUITE ?= not soak and not dags_test and not harness
# make demo STORAGE=s3: the demo's tables and checkpoints in the stack's MinIO
STORAGE ?= local
lint: setup  ## ruff: lint and format check of product, tests and benchmarks (the first step of make test)
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

format: setup  ## ruff: apply the safe lint fixes and the formatter
	.venv/bin/ruff check --fix . && .venv/bin/ruff format .

test: lint stack-up  ## what CI runs: lint, then unit + integration + every fault scenario and variant once + templates under a real Airflow
	@t0=$$(date +%s); \
	if [ -n "$(PYTEST_ARGS)" ]; then $(PY) -m pytest -m "$(SUITE)" $(PYTEST_ARGS); rc=$$?; else \
	  $(PY) -m pytest -m "$(SUITE) and not exclusive" -n $(TEST_WORKERS) --dist loadgroup --durations=25 --junitxml=.test-results/parallel.xml; rc=$$?; \
	  echo "[make] parallel part: $$(( $$(date +%s) - t0 ))s"; \
	  $(PY) -m pytest -m "$(SUITE) and exclusive" --durations=10 --junitxml=.test-results/exclusive.xml; rc2=$$?; [ $$rc -ne 0 ] || rc=$$rc2; fi; \
	  echo "[make] test suite: $$(( $$(date +%s) - t0 ))s"; exit $$rc

test-profile:  ## where the last make test's time went: by kind of cost, by test file, the slowest tests (reads .test-results/*.xml)
	$(PY) tests/profile_report.py $(PROFILE_ARGS)

test-all:  ## make test plus the `airflow dags test` runs of the templates
	$(MAKE) test SUITE="not soak and not harness"

test-fast:  ## make test without the fault variants (matrix) and the templates under a real Airflow
	$(MAKE) test SUITE="not soak and not matrix and not e2e"

docs-tables:  ## regenerate the results tables (and docs/images/bench-*.png) in docs/ from the newest JSON results
	$(PY) benchmarks/results_table.py

docs:  ## rewrite the examples in README.md, CONTRIBUTING.md and docs/ from the marked regions of the example DAGs
	python3 docs/include.py

test-unit: setup  ## no services needed
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

faults: stack-up  ## the kill -9 fault scenarios once each (the default suite's representatives)
	$(PY) -m pytest tests/faults -m "not soak and not matrix" --durations=0 $(PYTEST_ARGS)

RUNS ?= 3
faults-matrix: stack-up  ## every fault scenario and variant RUNS times (default 3); prints the matrix table
	$(PY) tests/faults/matrix.py --runs $(RUNS) --workers $(TEST_WORKERS) -- $(PYTEST_ARGS)

# Every benchmark in sequence at modest sizes (~45 min on 2 cores, estimated from the parts; each writes benchmarks/results/<kind>-*.json),
# then the tables and plots of docs/benchmarks.md. One that fails does not stop the others; the target fails at the end.
bench: stack-up  ## every benchmark, then the docs tables and docs/images/bench-*.png (JSON in benchmarks/results/)
	@t0=$$(date +%s); failed=""; \
	run() { name=$$1; shift; w=0; while [ $$w -lt 180 ] && awk '{exit !($$1 >= 1.5)}' /proc/loadavg; do sleep 10; w=$$((w + 10)); done; \
	  echo "[make] bench-$$name: $$* (waited $${w}s for a 1-min load average below 1.5)"; s=$$(date +%s); \
	  $(PY) "$$@" || failed="$$failed $$name"; echo "[make] bench-$$name: $$(( $$(date +%s) - s ))s"; }; \
	run producer benchmarks/bench_producer.py --repeats 3; \
	run capture benchmarks/bench_capture.py --sizes 25000,250000 --repeats 3; \
	run watermark benchmarks/bench_watermark.py --rows 500000 --repeats 3; \
	run full-load benchmarks/bench_full_load.py --sizes 100000,1000000,10000000 --repeats 3; \
	run reconcile benchmarks/bench_reconcile.py --rows 1000000 --repeats 3; \
	run spark-sinks benchmarks/bench_spark_sinks.py --records 200000 --batch 100000 --repeat 3 \
	  --sinks delta,postgres,files,delta-s3,files-s3; \
	run history benchmarks/bench_history.py --repeats 3 --ledger-sizes 1000,100000 --manifests 10,10000 \
	  --delta-commits 10,10000 --delta-s3-commits 10,1000 --postgres-rows 1000,100000; \
	run freshness benchmarks/bench_freshness_dag.py --seconds 300 --warmup 30; \
	run increment benchmarks/bench_increment.py --sizes 10000 --repeats 3; \
	run wholedb benchmarks/bench_wholedb.py --repeats 1; \
	$(PY) benchmarks/results_table.py >/dev/null || failed="$$failed docs-tables"; \
	echo "[make] bench: $$(( $$(date +%s) - t0 ))s$${failed:+, failed:$$failed}"; [ -z "$$failed" ]

bench-producer: stack-up  ## exactly_once vs a plain idempotent producer and ProduceToTopicOperator, same SASL_SSL connection (JSON)
	$(PY) benchmarks/bench_producer.py $(BENCH_ARGS)

bench-full-load: stack-up  ## full load rows/s vs mysqldump on the same table (BENCH_ROWS, default 1M; JSON)
	BENCH_ROWS=$${BENCH_ROWS:-1000000} $(PY) benchmarks/bench_full_load.py

bench-watermark: stack-up  ## one watermark window end to end vs a bare SELECT of the same rows (JSON)
	$(PY) benchmarks/bench_watermark.py $(BENCH_ARGS)

bench-spark-sinks: stack-up  ## Kafka -> Spark -> sink: exactly-once vs at-least-once job, rows/s and ratio per sink (JSON)
	$(PY) benchmarks/bench_spark_sinks.py $(BENCH_ARGS)

constraints: setup  ## re-pin constraints.txt from the current .venv
	(echo "# Exact versions tested together (uv pip freeze of .venv). Regenerate: make constraints"; \
	  .venv/bin/uv pip freeze -p $(PY) | grep -v -i "airflow-provider-exactly-once") > constraints.txt

bench-capture: stack-up  ## binlog capture into Kafka (exactly_once) vs the raw python-mysql-replication read of the same binlog
	$(PY) benchmarks/bench_capture.py $(BENCH_ARGS)

bench-history: stack-up  ## ledger reads, writer open, status page and files-sink committed() with 1k..1M records of history (JSON in benchmarks/results/)
	$(PY) benchmarks/bench_history.py $(BENCH_ARGS)

bench-freshness: stack-up  ## the continuous history -> stream template under a real Airflow: source commit -> visible in the current table, 1 and 4 tables at 500 changes/s and 4 at 1,000 for 5 min each (JSON in benchmarks/results/)
	$(PY) benchmarks/bench_freshness_dag.py $(BENCH_ARGS)

bench-freshness-operators: stack-up  ## the same pipeline's operators outside Airflow (--tables N: one shared query vs one query per table)
	$(PY) benchmarks/bench_freshness.py $(BENCH_ARGS)

bench-wholedb: stack-up  ## the history -> stream template's first run under a real Airflow: 100 tables of mixed keys and skewed sizes (by pattern) vs one table, 2M rows each side (JSON in benchmarks/results/)
	$(PY) benchmarks/bench_wholedb.py $(if $(BENCH_ROWS),--rows $(BENCH_ROWS))

bench-commits: stack-up  ## one benchmark from two commits side by side, interleaved (BASE=<rev> [HEAD=<rev>] BENCH="bench_x.py <its args>"; JSON)
	$(PY) benchmarks/compare_commits.py --base $(BASE) $(if $(HEAD),--head $(HEAD)) $(if $(REPEAT),--repeat $(REPEAT)) -- $(BENCH)

bench-increment: stack-up  ## one increment of 1,000 changes of the scheduled history -> stream template at 10k and 1M rows: changed-keys vs full reconciliation (JSON in benchmarks/results/)
	$(PY) benchmarks/bench_increment.py $(BENCH_ARGS)

bench-reconcile: stack-up  ## reconcile a 1M-row table (BENCH_ROWS): clean and planted differences vs COUNT(*) on both sides (JSON)
	BENCH_ROWS=$${BENCH_ROWS:-1000000} $(PY) benchmarks/bench_reconcile.py $(BENCH_ARGS)

test-templates: stack-up  ## the DAG templates end to end through airflow dags test, with their OpenLineage events (not in CI)
	$(PY) -m pytest -m dags_test --durations=15 tests/integration/dags $(PYTEST_ARGS)

test-airflow: stack-up  ## the templates under a real Airflow (api-server, scheduler, LocalExecutor), driven by its REST API
	$(PY) -m pytest -m e2e --durations=15 tests/integration/airflow $(PYTEST_ARGS)
