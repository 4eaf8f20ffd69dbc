#!/usr/bin/env bash
# The demo on the local stack (`make demo` starts the stack first), all through `airflow dags test`:
#   1. a demo shop database (orders, payments, refunds; five currencies) and a live writer;
#   2. the history -> stream template on `orders`: the full load while the writer runs, then increments;
#   3. the settlement template on `payments`: one nightly window, then a UI-style rerun with {"reextract": true};
#   4. the whole shop database by pattern (orders, payments, refunds, shop_*): one run loads its six tables, a
#      table created while the writer runs (shop_reviews) joins at the next run, the others streaming on;
#   5. the writer stops, a last increment, and the reconciliation table (source vs sink, missing, duplicates).
# STORAGE=s3 (make demo STORAGE=s3) keeps the Delta tables and Spark checkpoints in the stack's MinIO (bucket
# eo-demo, the aws_default connection); the full load still stages its chunks under the run's data directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=$PWD/.venv/bin/python
AIRFLOW=$PWD/.venv/bin/airflow
STACK_HOME=${EO_STACK_HOME:-/var/tmp/exactly-once-stack}

export AIRFLOW__CORE__DAGS_FOLDER=$PWD/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export PYSPARK_PYTHON=$PY
eval "$($PY docker/local/stack.py env)"
# Each demo run gets its own pipelines, topics and data directory, so a second demo starts clean.
export EO_DEMO_RUN=-$(date -u +%m%d%H%M%S)
export EO_DATA_DIR=$STACK_HOME/demo-data/run$EO_DEMO_RUN
# Its own Airflow home too: the DAGs' assets name this run's tables, and Airflow keeps an asset of the same name
# with an older URI active, failing the new run's tasks (AirflowInactiveAssetInInletOrOutletException).
export AIRFLOW_HOME=${AIRFLOW_HOME:-$EO_DATA_DIR/airflow}
export EO_SPARK_JARS=$($PY -c "import sys; sys.path.insert(0, 'docker/local'); import stack; print(stack.spark_conf()['spark.jars'])")
case ${STORAGE:-local} in
  local) export EO_LAKE=$EO_DATA_DIR ;;
  s3) export EO_LAKE=s3://eo-demo/run$EO_DEMO_RUN
      EO_SPARK_CLASSPATH=$($PY -c "import sys; sys.path.insert(0, 'docker/local'); import stack; print(stack.spark_conf(s3=True)['spark.driver.extraClassPath'])")
      export EO_SPARK_CLASSPATH ;;
  *) echo "[demo] STORAGE=${STORAGE}: use local or s3" >&2; exit 2 ;;
esac
mkdir -p "$EO_DATA_DIR"
LOGS=$EO_DATA_DIR/logs
mkdir -p "$LOGS"

step() { echo; echo "[demo] $*"; }
run_dag() {  # run_dag NAME LOG_TAG [dags test args...]: fail with the log's tail, else print its summary lines
  local dag=$1 tag=$2; shift 2
  local log=$LOGS/$tag.log t0=$SECONDS
  if ! "$AIRFLOW" dags test "$dag" "$@" >"$log" 2>&1 || ! grep -q "state=success" "$log"; then
    tail -60 "$log"; echo "[demo] $dag ($tag) FAILED - full log: $log"; exit 1
  fi
  grep -hE "published .* rows as Delta|committed position|rows produced|rows dropped|committed batch|Window .* (committed|already)|reconciliation .*: (CLEAN|MISMATCH)|settlement report of" "$log" \
    | sed -E 's/^[^]]*\] //; s/ \[airflow.*$//' | cut -c1-160 | sed 's/^/    /' || true
  echo "    $dag ($tag): success in $((SECONDS - t0))s (log: $log)"
}

echo "[demo] Airflow home: $AIRFLOW_HOME; data: $EO_DATA_DIR; tables and checkpoints: $EO_LAKE"
"$AIRFLOW" db migrate >/dev/null
"$AIRFLOW" providers get airflow-provider-exactly-once

step "1/5 demo shop database and a live writer"
$PY docker/local/demo_shop.py seed --orders ${EO_DEMO_ORDERS:-20000}
$PY docker/local/demo_shop.py writer --rate 20 >"$LOGS/writer.log" 2>&1 &
WRITER=$!
trap 'kill $WRITER 2>/dev/null || true' EXIT
sleep 2

step "2/5 history -> stream on orders: full load while the writer runs, then increments"
run_dag eo_history_stream first-run-full-load
for i in 1 2; do
  sleep 5
  run_dag eo_history_stream increment-$i
done

step "3/5 settlement of payments: the window that ended at the last 02:00 Asia/Shanghai, then a UI-style rerun"
END=$($PY -c "import pendulum; n = pendulum.now('Asia/Shanghai'); e = n.start_of('day').add(hours=2); e = e if e <= n else e.subtract(days=1); print(e.in_tz('UTC').isoformat())")
run_dag eo_settlement window "$END"
run_dag eo_settlement rerun-reextract "$END" --conf '{"reextract": true}'

step "4/5 the whole shop database by pattern: six tables in one run, then shop_reviews is created and joins"
run_dag eo_shop_database whole-database-first-run
$PY docker/local/demo_shop.py add-table
sleep 5
run_dag eo_shop_database a-table-joins

step "5/5 the writer stops; a last increment reconciles the whole table (the full_reconcile Param; increments check the changed keys)"
# A writer that stopped early (e.g. the shared MariaDB restarted under it) is reported with its log; the last
# increment and the reconciliation still run over whatever it wrote.
kill $WRITER 2>/dev/null || echo "[demo] the writer had already stopped (its log below)"
wait $WRITER || true
cat "$LOGS/writer.log"
run_dag eo_history_stream final-increment --conf '{"full_reconcile": true}'
run_dag eo_shop_database whole-database-final --conf '{"full_reconcile": true}'

step "reconciliation (latest per pipeline; CDC compared at the common position)"
$PY docker/local/demo_shop.py report

echo
# How to open the Airflow UI over this run (AIRFLOW_HOME, EO_DEMO_RUN and EO_DATA_DIR are exported above);
# tests/integration/docker/test_demo_ui.py runs the command this prints.
docker/local/ui.sh --instructions
