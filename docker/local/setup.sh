#!/usr/bin/env bash
# Set up a fresh Debian machine for the local stack: system packages, the project's virtualenv.
# Idempotent and quick when nothing changed. Each step prints its wall time.
# Needs: Debian 12 (root or sudo), Python 3.11, Java 17+, Maven, Go 1.24+. Kafka and Spark jars come from Maven
# Central when the stack first starts (docker/local/stack.py up).
set -euo pipefail
cd "$(dirname "$0")/../.."

step() { echo "[setup] $*"; }
timed() { local name=$1; shift; local t0=$SECONDS; "$@"; step "$name: $((SECONDS - t0))s"; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# chromium + chromium-driver: the UI plugin's browser test (headless).
APT_PACKAGES=(mariadb-server mariadb-client libmariadb-dev pkg-config postgresql postgresql-client chromium chromium-driver)

system_packages() {
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  for tool in java mvn; do
    command -v "$tool" >/dev/null || { echo "[setup] $tool is required (Java 17+, Maven) and missing" >&2; exit 1; }
  done
  # Go builds MinIO once (docker/local/stack.py minio_binary); Debian 12's golang package is too old for it.
  command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || {
    echo "[setup] go (1.24+) is required to build MinIO and is missing: install it under /usr/local/go" >&2; exit 1; }
  if [ ${#missing[@]} -gt 0 ]; then
    step "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    # Keep the packaged services from starting on their default ports: the stack runs its own.
    echo exit 101 | $SUDO tee /usr/sbin/policy-rc.d >/dev/null; $SUDO chmod +x /usr/sbin/policy-rc.d
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    $SUDO rm -f /usr/sbin/policy-rc.d
  fi
}

PYTHON_BIN=${PYTHON_BIN:-python3.11}
command -v "$PYTHON_BIN" >/dev/null || PYTHON_BIN=python3

virtualenv() {
  local stamp=.venv/.installed-$(cat setup.cfg constraints.txt | sha1sum | cut -c1-12)
  if [ -f "$stamp" ]; then return; fi
  [ -x .venv/bin/python ] || "$PYTHON_BIN" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip uv
  # uv resolves and installs Airflow + Spark in well under a minute; constraints pin the tested set.
  # From uv's cache alone when it holds the whole set (a second checkout on this machine): online, an index
  # that answers without caching headers makes uv fetch pyspark's 470 MB sdist and build it anew (1.4 GB).
  .venv/bin/uv pip install -q --offline -p .venv/bin/python -c constraints.txt -e '.[test]' 2>/dev/null ||
    .venv/bin/uv pip install -q -p .venv/bin/python -c constraints.txt -e '.[test]'
  rm -f .venv/.installed-*; touch "$stamp"
}

# uv installs without bytecode, and with PYTHONDONTWRITEBYTECODE=1 (set on this machine) Python never caches
# it either: every new process -- each Spark Python worker, each planner process of a Python data source --
# compiled pandas, pyarrow and pyspark from source again (`import pandas`: 8.5 s on the shared 2-core box).
bytecode() {
  local stamp=.venv/.bytecode-$(cd .venv && ls .installed-* | sha1sum | cut -c1-12)
  if [ -f "$stamp" ]; then return; fi
  # A few packages ship files for other Python versions that do not compile; the rest still gets its .pyc.
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null 2>&1 || true
  rm -f .venv/.bytecode-*; touch "$stamp"
}

timed "system packages" system_packages
timed "virtualenv (.venv)" virtualenv
timed "bytecode (.venv)" bytecode
