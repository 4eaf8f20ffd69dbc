#!/usr/bin/env bash
# The Airflow UI over the demo: `airflow standalone` (API server, scheduler, DAG processor, triggerer) in the
# demo's AIRFLOW_HOME, with the example DAGs of dags/, the local stack's connections (AIRFLOW_CONN_* from
# stack.py env) and the Spark connector jars. Ctrl-C stops it.
#
#   docker/local/ui.sh                 run it (make demo prints this with the run's EO_DEMO_RUN and EO_DATA_DIR)
#   docker/local/ui.sh --instructions  print how to run it and what to open (the end of make demo)
#
# standalone starts each component as `airflow ...` from PATH, so the venv's bin/ goes first on PATH here: run
# as `.venv/bin/airflow standalone` without it, the components fail with FileNotFoundError: 'airflow'.
# Settings: AIRFLOW_HOME (default: the newest demo run's), AIRFLOW__API__PORT (default 8080), AIRFLOW__API__WORKERS
# (default 1: a small machine), EO_DEMO_RUN / EO_DATA_DIR / EO_LAKE (which demo run the example DAGs name).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
STACK_HOME=${EO_STACK_HOME:-/var/tmp/exactly-once-stack}
# default: the newest demo run's own Airflow home (make demo prints the exact command)
NEWEST=$(ls -1dt "$STACK_HOME"/demo-data/run-*/airflow 2>/dev/null | head -1 || true)
HOME_DIR=${AIRFLOW_HOME:-${NEWEST:-$STACK_HOME/airflow-demo}}
PORT=${AIRFLOW__API__PORT:-8080}

if [ "${1:-}" = "--instructions" ]; then
  # The command line is printed with every setting it needs, so it works pasted into any shell.
  cmd="AIRFLOW_HOME=$(printf %q "$HOME_DIR")"
  [ -z "${EO_DEMO_RUN:-}" ] || cmd+=" EO_DEMO_RUN=$(printf %q "$EO_DEMO_RUN")"
  [ -z "${EO_DATA_DIR:-}" ] || cmd+=" EO_DATA_DIR=$(printf %q "$EO_DATA_DIR")"
  [ -z "${EO_LAKE:-}" ] || cmd+=" EO_LAKE=$(printf %q "$EO_LAKE")"
  [ -z "${EO_SPARK_CLASSPATH:-}" ] || cmd+=" EO_SPARK_CLASSPATH=$(printf %q "$EO_SPARK_CLASSPATH")"
  [ "$PORT" = 8080 ] || cmd+=" AIRFLOW__API__PORT=$(printf %q "$PORT")"
  cmd+=" $(printf %q "$REPO/docker/local/ui.sh")"
  cat <<MSG
[demo] To browse it in the Airflow UI (Ctrl-C stops it):
    $cmd
  then open http://localhost:$PORT/ and log in as admin with the password in
  $HOME_DIR/simple_auth_manager_passwords.json.generated (the first start also prints it);
  the pipelines' status page: http://localhost:$PORT/exactly-once/ (Browse > Exactly-once pipelines).
MSG
  exit 0
fi
[ $# -eq 0 ] || { echo "usage: $0 [--instructions]" >&2; exit 2; }

cd "$REPO"
export PATH=$REPO/.venv/bin:$PATH
export AIRFLOW_HOME=$HOME_DIR
export AIRFLOW__CORE__DAGS_FOLDER=$REPO/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__API__PORT=$PORT
export AIRFLOW__API__WORKERS=${AIRFLOW__API__WORKERS:-1}
export PYSPARK_PYTHON=$REPO/.venv/bin/python
eval "$(python docker/local/stack.py env)"
EO_SPARK_JARS=$(python -c "import sys; sys.path.insert(0, 'docker/local'); import stack; print(stack.spark_conf()['spark.jars'])")
export EO_SPARK_JARS
[ -z "${EO_DEMO_RUN:-}" ] || export EO_DEMO_RUN
[ -z "${EO_DATA_DIR:-}" ] || export EO_DATA_DIR
[ -z "${EO_LAKE:-}" ] || export EO_LAKE  # make demo STORAGE=s3: the tables and checkpoints in MinIO
[ -z "${EO_SPARK_CLASSPATH:-}" ] || export EO_SPARK_CLASSPATH
mkdir -p "$AIRFLOW_HOME"
echo "[ui] AIRFLOW_HOME=$AIRFLOW_HOME; UI at http://localhost:$PORT/ (admin; password in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
exec airflow standalone
