"""Repro loops: a transaction marker the coordinator silently skips makes a killed epoch's records visible.

Not a pytest module (no ``test_`` prefix, kept out of every suite): run it by hand. It starts its OWN brokers,
never the shared stack's: the stack's Kafka 4.3.1 jars (``docker/local/stack.py`` ``kafka_libs()``), data under
``/var/tmp/kafka-anomaly/<run>``, PLAINTEXT on 127.0.0.1 from ``--port`` up (port, port+1, port+2), 512 MB heap.
DumpLogSegments evidence needs the kafka-tools jar in ``/var/tmp/kafka-anomaly/tools`` (see ``TOOLS``)::

    cd /work/wt-kafka && PY=/work/main/.venv/bin/python
    # the deterministic one: data partition offline while B's init_transactions aborts A's transaction
    $PY tests/faults/kafka_unclean_restart_repro.py --scenario offline --b-when down --iterations 10 --port 29392
    $PY tests/faults/kafka_unclean_restart_repro.py --scenario offline --b-when up   --iterations 10   # control
    $PY tests/faults/kafka_unclean_restart_repro.py --scenario offline --b-when commit --iterations 5 # lost commit
    # tests/faults/test_kafka_broker_kill.py on one node (SIGKILL + restart), optionally racing the timeout abort
    $PY tests/faults/kafka_unclean_restart_repro.py --old killed --iterations 30 --port 29092 \
        [--a-txn-timeout-ms 9000-17000 --abort-interval-ms 1000]
    # the product's PipelineWriter (needs exactly_once_provider installed, as in /work/main/.venv)
    $PY tests/faults/kafka_unclean_restart_repro.py --scenario product --iterations 5 --port 29592
    $PY tests/faults/kafka_unclean_restart_repro.py --scenario product-restart --iterations 6 --port 29092 \
        --a-txn-timeout-ms 9000-17000 --abort-interval-ms 1000

restart (default): one KRaft node. Per iteration, on a fresh topic and transactional.id: producer A commits
"committed-1", begins, produces "in-flight" (``--ack acked``: flushed; ``unacked``: not waited for); the broker is
SIGKILLed and restarted; producer B (same transactional.id) runs init_transactions and commits "committed-2"; the
topic is read read_committed and read_uncommitted. ``--old``: A ``alive`` in this process (as in
test_kafka_broker_kill.py), ``closed`` (destroyed before the kill), ``killed`` (separate process SIGKILLed before
the broker kill: the product's crash case), ``killed-late`` (separate process SIGKILLed after the restart).
``--a-txn-timeout-ms`` lets the coordinator's own timeout abort fire while the restarted broker still starts up.

offline: node 1 (controller+broker) coordinates the transactional.id, node 2 holds the only replica of the data
partition. A (separate process) commits "committed-1", produces "in-flight" in a new transaction and is
SIGKILLed; node 2 is SIGKILLed; once the partition has no leader, B runs init_transactions (``down``), node 2
restarts, B commits "committed-2". ``commit``: A's own commit_transaction runs while the partition has no leader,
then A aborts its next transaction on that partition and commits a third.

product: see product_iteration (two nodes, data partition offline while the restarted writer aborts: DUPLICATE);
product-restart: see product_restart_iteration (one node; both markers skipped: the writer's ledger read hangs).

ANOMALY: "in-flight" read read_committed (``commit``: "committed-while-offline" NOT read). The first anomaly's
data partition and __transaction_state are dumped (DumpLogSegments) into the run directory; one JSON line per
iteration goes to stdout and ``<run dir>/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

LIBS = Path("/var/tmp/exactly-once-stack/kafka/libs-4.3.1")
BASE = Path("/var/tmp/kafka-anomaly")
# DumpLogSegments is in kafka-tools, which the stack does not resolve: `mvn dependency:get
# -Dartifact=org.apache.kafka:kafka-tools:4.3.1 -Dtransitive=false` and copy the jar here.
TOOLS = BASE / "tools"
DUMP = ["java", "-cp", f"{LIBS}/*:{TOOLS}/*", "org.apache.kafka.tools.DumpLogSegments"]
HOST = "127.0.0.1"
QUIET = {"logger": logging.getLogger("repro.rdkafka")}
SETTINGS = {  # docker/local/stack.py KAFKA_SINGLE_NODE_SETTINGS
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
}

OLD_PRODUCER = r"""
import sys, time, logging
from confluent_kafka import Producer
bootstrap, tid, topic, ack = sys.argv[1:5]
timeout = {"transaction.timeout.ms": int(sys.argv[5])} if len(sys.argv) > 5 else {}
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "logger": logging.getLogger("x"), **timeout})
p.init_transactions(60)
p.begin_transaction(); p.produce(topic, b"committed-1"); p.flush(30); p.commit_transaction(60)
p.begin_transaction(); p.produce(topic, b"in-flight")
if ack == "acked":
    left = p.flush(30)
else:
    p.poll(0); left = len(p)
print("READY", left, flush=True)
time.sleep(3600)
"""


class Broker:
    def __init__(
        self,
        run: Path,
        port: int,
        controller_port: int,
        tv: int,
        heap: str = "512m",
        node_id: int = 1,
        voters_port: int | None = None,
        cluster_id: str | None = None,
        extra: dict | None = None,
    ) -> None:
        self.run, self.port, self.cport, self.tv, self.heap = run, port, controller_port, tv, heap
        self.node_id, self.cluster_id, self.extra = node_id, cluster_id, extra or {}
        self.voters_port = voters_port or controller_port  # node 1 is the only controller
        self.proc: subprocess.Popen | None = None
        self.bootstrap = f"{HOST}:{port}"

    @property
    def data(self) -> Path:
        return self.run / "data"

    def format(self) -> None:
        self.run.mkdir(parents=True, exist_ok=True)
        controller = self.node_id == 1
        props = {
            "process.roles": "broker,controller" if controller else "broker",
            "node.id": str(self.node_id),
            "controller.quorum.voters": f"1@{HOST}:{self.voters_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port}"
            + (f",CONTROLLER://{HOST}:{self.cport}" if controller else ""),
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data),
            **SETTINGS,
            **self.extra,
        }
        (self.run / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.run / "log4j2.properties").write_text(
            "status = warn\nappender.out.type = Console\nappender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\nappender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.out.ref = OUT\n"
        )
        if not (self.data / "meta.properties").exists():
            if self.cluster_id is None:
                self.cluster_id = subprocess.run(
                    ["java", "-cp", f"{LIBS}/*", "kafka.tools.StorageTool", "random-uuid"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
            cmd = [
                "java",
                "-cp",
                f"{LIBS}/*",
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.cluster_id,
                "-c",
                str(self.run / "server.properties"),
                "-g",
            ]
            if self.node_id == 1:
                cmd += ["--feature", f"transaction.version={self.tv}"]
            subprocess.run(cmd, check=True, capture_output=True)

    def start(self) -> None:
        with open(self.run / "broker.log", "ab") as out:
            self.proc = subprocess.Popen(
                [
                    "java",
                    f"-Xms{self.heap}",
                    f"-Xmx{self.heap}",
                    "-XX:+UseG1GC",
                    "-Djava.awt.headless=true",
                    f"-Dlog4j2.configurationFile={self.run / 'log4j2.properties'}",
                    "-cp",
                    f"{LIBS}/*",
                    "kafka.Kafka",
                    str(self.run / "server.properties"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited, see {self.run / 'broker.log'}")
            try:
                md = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 3000, **QUIET}).list_topics(
                    timeout=3
                )
                if self.node_id in md.brokers:
                    return
            except KafkaException:
                pass
            time.sleep(0.5)
        raise RuntimeError("broker not ready in 180 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def new_topic(bootstrap: str) -> str:
    name = f"a-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    time.sleep(0.5)
    return name


def producer(bootstrap: str, tid: str, txn_timeout_ms: int | None = None) -> Producer:
    extra = {"transaction.timeout.ms": txn_timeout_ms} if txn_timeout_ms else {}
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, **QUIET, **extra})
    p.init_transactions(120)
    return p


def read_all(bootstrap: str, topic: str, isolation: str, idle: float = 3.0) -> tuple[list[str], bool]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **QUIET,
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values, eof, last, deadline = [], False, time.monotonic(), time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                if eof and time.monotonic() - last > idle:
                    break
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof = True
                    continue
                raise RuntimeError(m.error())
            values.append(m.value().decode())
            last = time.monotonic()
        return values, eof
    finally:
        c.close()


def dump(broker: Broker, topic: str, out: Path) -> None:
    """Stop the broker cleanly and save DumpLogSegments output of the topic and __transaction_state."""
    broker.stop()
    with open(out, "w") as f:
        for d in sorted(broker.data.glob(f"{topic}-0")) + sorted(broker.data.glob("__transaction_state-*")):
            logs = sorted(str(p) for p in d.glob("*.log"))
            if not logs:
                continue
            cmd = [*DUMP, "--deep-iteration", "--print-data-log", "--files", ",".join(logs)]
            if d.name.startswith("__transaction_state"):
                cmd.append("--transaction-log-decoder")
            f.write(f"### {d.name}\n")
            f.write(subprocess.run(cmd, capture_output=True, text=True).stdout)
    broker.start()


def iteration(broker: Broker, old: str, ack: str, a_timeout: tuple[int, int] | None = None) -> dict:
    topic = new_topic(broker.bootstrap)
    tid = f"anomaly-{topic}"
    a = child = None
    left = None
    timeout_ms = random.randint(*a_timeout) if a_timeout else None
    if old in ("alive", "closed"):
        a = producer(broker.bootstrap, tid, timeout_ms)
        a.begin_transaction()
        a.produce(topic, b"committed-1")
        a.flush(30)
        a.commit_transaction(60)
        a.begin_transaction()
        a.produce(topic, b"in-flight")
        if ack == "acked":
            left = a.flush(30)
        else:
            a.poll(0)
            left = len(a)
        if old == "closed":
            a = None  # rd_kafka_destroy: the open transaction is neither committed nor aborted by the client
    else:
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                OLD_PRODUCER,
                broker.bootstrap,
                tid,
                topic,
                ack,
                *([str(timeout_ms)] if timeout_ms else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = child.stdout.readline().split()
        assert line and line[0] == "READY", line
        left = int(line[1])
        if old == "killed":
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    t0 = time.monotonic()
    broker.kill()
    broker.start()
    restart_s = round(time.monotonic() - t0, 1)
    if old == "killed-late":
        time.sleep(2)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    b = producer(broker.bootstrap, tid)
    b.begin_transaction()
    b.produce(topic, b"committed-2")
    b.flush(30)
    b.commit_transaction(60)
    committed, _ = read_all(broker.bootstrap, topic, "read_committed")
    uncommitted, _ = read_all(broker.bootstrap, topic, "read_uncommitted")
    del a, b
    if child is not None and child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    skipped = "Couldn't find leader endpoint for partitions Set(" + topic in (broker.run / "broker.log").read_text(
        errors="replace"
    )
    return {
        "topic": topic,
        "old": old,
        "ack": ack,
        "unacked_left": left,
        "restart_s": restart_s,
        "a_txn_timeout_ms": timeout_ms,
        "marker_skipped_in_log": skipped,
        "read_committed": committed,
        "read_uncommitted": uncommitted,
        "anomaly": "in-flight" in committed,
    }


# ------------------------------------------------------------------------------- scenario "offline"
# Two nodes: node 1 (controller+broker) leads the __transaction_state partition of the transactional.id, node 2
# (broker only) is the only replica of the data partition. Node 2 is SIGKILLed while A's transaction is open;
# once the controller has fenced it (the data partition has no leader, -1), B runs init_transactions: the
# coordinator aborts A's transaction, finds no leader endpoint for the data partition and drops it from the
# transaction ("likely deleted already and hence can be skipped") instead of waiting. Node 2 comes back, B commits.
# ``--b-when up`` is the control: B starts only after node 2 is back.


def java_hash(text: str) -> int:
    h = 0
    for unit in _utf16_units(text):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _utf16_units(text: str) -> list[int]:
    raw = text.encode("utf-16-be")
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def coordinator_partition(tid: str, partitions: int) -> int:
    h = java_hash(tid)
    return (0 if h == -(1 << 31) else abs(h)) % partitions  # Kafka Utils.abs(hashCode) % partitions


def leader_of(bootstrap: str, topic: str, partition: int = 0) -> int | None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    try:
        md = admin.list_topics(topic, timeout=5)
    except KafkaException:
        return None
    t = md.topics.get(topic)
    if t is None or t.error is not None or partition not in t.partitions:
        return None
    return t.partitions[partition].leader


def wait_for(what: str, check, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


def offline_iteration(n1: Broker, n2: Broker, b_when: str) -> dict:
    bootstrap = n1.bootstrap
    name = f"o-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[[2]])])[name].result(30)
    wait_for("data partition leader 2", lambda: leader_of(bootstrap, name) == 2)
    txn_md = admin.list_topics("__transaction_state", timeout=10).topics["__transaction_state"]
    count = len(txn_md.partitions)
    tid = next(
        t
        for t in (f"offline-{name}-{i}" for i in range(1000))
        if txn_md.partitions[coordinator_partition(t, count)].leader == 1
    )
    child = subprocess.Popen(
        [sys.executable, "-c", OLD_PRODUCER, bootstrap, tid, name, "acked"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = child.stdout.readline().split()
    assert line and line[0] == "READY", line
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()  # A crashes with its transaction open
    n2.kill()
    wait_for("data partition without leader", lambda: leader_of(bootstrap, name) == -1)
    init_s = None
    if b_when == "down":
        t0 = time.monotonic()
        b = producer(bootstrap, tid)  # the abort of A's transaction happens now, with the partition offline
        init_s = round(time.monotonic() - t0, 1)
        n2.start()
    else:
        n2.start()
        wait_for("data partition leader 2 again", lambda: leader_of(bootstrap, name) == 2)
        b = producer(bootstrap, tid)
    wait_for("data partition leader 2 again", lambda: leader_of(bootstrap, name) == 2)
    b.begin_transaction()
    b.produce(name, b"committed-2")
    b.flush(30)
    b.commit_transaction(60)
    committed, _ = read_all(bootstrap, name, "read_committed")
    uncommitted, _ = read_all(bootstrap, name, "read_uncommitted")
    del b
    return {
        "scenario": "offline",
        "b_when": b_when,
        "topic": name,
        "tid": tid,
        "b_init_s": init_s,
        "read_committed": committed,
        "read_uncommitted": uncommitted,
        "anomaly": "in-flight" in committed,
    }


def offline_commit_iteration(n1: Broker, n2: Broker) -> dict:
    """A commits while the data partition has no leader (its commit returns), then aborts its next transaction."""
    bootstrap = n1.bootstrap
    name = f"c-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[[2]])])[name].result(30)
    wait_for("data partition leader 2", lambda: leader_of(bootstrap, name) == 2)
    txn_md = admin.list_topics("__transaction_state", timeout=10).topics["__transaction_state"]
    count = len(txn_md.partitions)
    tid = next(
        t
        for t in (f"offline-{name}-{i}" for i in range(1000))
        if txn_md.partitions[coordinator_partition(t, count)].leader == 1
    )
    a = producer(bootstrap, tid)
    a.begin_transaction()
    a.produce(name, b"committed-1")
    a.flush(30)
    a.commit_transaction(60)
    a.begin_transaction()
    a.produce(name, b"committed-while-offline")
    a.flush(30)
    n2.kill()
    wait_for("data partition without leader", lambda: leader_of(bootstrap, name) == -1)
    t0 = time.monotonic()
    a.commit_transaction(60)  # returns once PrepareCommit is in the transaction log
    commit_s = round(time.monotonic() - t0, 1)
    n2.start()
    wait_for("data partition leader 2 again", lambda: leader_of(bootstrap, name) == 2)
    a.begin_transaction()
    a.produce(name, b"aborted-later")
    a.flush(30)
    a.abort_transaction(60)
    a.begin_transaction()
    a.produce(name, b"committed-3")
    a.flush(30)
    a.commit_transaction(60)
    committed, _ = read_all(bootstrap, name, "read_committed")
    uncommitted, _ = read_all(bootstrap, name, "read_uncommitted")
    del a
    return {
        "scenario": "offline-commit",
        "topic": name,
        "tid": tid,
        "commit_s": commit_s,
        "read_committed": committed,
        "read_uncommitted": uncommitted,
        "anomaly": "committed-while-offline" not in committed,
    }


# ------------------------------------------------------------------------------- scenario "product"
# The product's PipelineWriter (installed exactly_once_provider) on the two nodes of "offline": data topic on node 2
# only, ledger (1 partition) and coordinator on node 1. Writer process 1 commits batch 1 (source offsets 1-10) and
# dies by SIGKILL at fault point "produced" of batch 2 (records 11-20 acknowledged, not committed). Node 2 is
# SIGKILLed; once the data partition has no leader, writer process 2 starts: open() (init_transactions, ledger
# read), replays batch 2, writes batch 3 (21-30); node 2 is restarted while it waits. ANOMALY: a value read twice.
WRITER = r"""
import logging, sys
from confluent_kafka import Producer
from exactly_once_provider.kafka.writer import Message, PipelineWriter, transactional_id_for
bootstrap, topic, ledger = sys.argv[1:4]
timeout_ms = int(sys.argv[4]) if len(sys.argv) > 4 else 60000
logging.basicConfig(level=logging.INFO, format="[writer] %(message)s")
cfg = {"bootstrap.servers": bootstrap}
tid = transactional_id_for("anomaly", "p0")
writer = PipelineWriter(lambda: Producer({**cfg, "transactional.id": tid, "enable.idempotence": True, "acks": "all",
                                          "transaction.timeout.ms": timeout_ms}),
                        cfg, "anomaly", "p0", "exactly_once", tid, ledger, False, logging.getLogger("writer"),
                        transaction_timeout_s=timeout_ms / 1000)
last = writer.open()
done = 0 if last is None else last.offset
print("RESUME", done, flush=True)
for first in range(done + 1, 31, 10):
    writer.write_batch(topic, [Message(str(n).encode(), key=f"k{n % 7}".encode()) for n in range(first, first + 10)],
                       first + 9)
writer.close()
print("DONE", flush=True)
"""


def product_iteration(n1: Broker, n2: Broker) -> dict:
    from exactly_once_provider.kafka.offsets import COMPACTION_CONFIG

    bootstrap = n1.bootstrap
    name = f"p-{uuid.uuid4().hex[:10]}"
    ledger = f"ledger-{name}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    for topic, node, config in ((name, 2, {}), (ledger, 1, dict(COMPACTION_CONFIG))):
        admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[node]], config=config)])[
            topic
        ].result(30)
        wait_for(f"{topic} leader {node}", lambda t=topic, n=node: leader_of(bootstrap, t) == n)
    env = {**os.environ, "EO_FAULT_AT": "produced:2", "EO_FAULT_ACTION": "kill"}
    first = subprocess.run(
        [sys.executable, "-c", WRITER, bootstrap, name, ledger], env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-2000:])
    n2.kill()
    wait_for("data partition without leader", lambda: leader_of(bootstrap, name) == -1)
    second = subprocess.Popen(
        [sys.executable, "-c", WRITER, bootstrap, name, ledger],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    while not (lines and lines[-1].startswith("RESUME")):  # after open(): init_transactions and ledger read done
        line = second.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
    resume = lines[-1] if lines else ""
    n2.start()
    out, _ = second.communicate(timeout=300)
    skipped = "Couldn't find leader endpoint for partitions Set(" + name in (n1.run / "broker.log").read_text(
        errors="replace"
    )
    values = [int(v) for v in read_all(bootstrap, name, "read_committed")[0]]
    duplicates = sorted(v for v in set(values) if values.count(v) > 1)
    return {
        "scenario": "product",
        "topic": name,
        "writer2": resume,
        "writer2_rc": second.returncode,
        "marker_skipped_in_log": skipped,
        "records": len(values),
        "distinct": len(set(values)),
        "duplicated_values": duplicates,
        "missing": sorted(set(range(1, 31)) - set(values)),
        "anomaly": bool(duplicates),
        "writer2_tail": out.strip().splitlines()[-3:],
    }


def product_restart_iteration(broker: Broker, a_timeout: tuple[int, int]) -> dict:
    """The product on ONE node: writer 1 dies at "produced" of batch 2, the broker is SIGKILLed and restarted while
    writer 1's transaction.timeout.ms (random in ``a_timeout``) runs out; then writer 2 resumes (timeout 15 s)."""
    from exactly_once_provider.kafka.offsets import COMPACTION_CONFIG

    bootstrap = broker.bootstrap
    name = f"p-{uuid.uuid4().hex[:10]}"
    ledger = f"ledger-{name}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    for topic, config in ((name, {}), (ledger, dict(COMPACTION_CONFIG))):
        admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)
        wait_for(f"{topic} leader", lambda t=topic: leader_of(bootstrap, t) == 1)
    timeout_ms = random.randint(*a_timeout)
    env = {**os.environ, "EO_FAULT_AT": "produced:2", "EO_FAULT_ACTION": "kill"}
    first = subprocess.run(
        [sys.executable, "-c", WRITER, bootstrap, name, ledger, str(timeout_ms)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-2000:])
    broker.kill()
    broker.start()
    second = subprocess.run(
        [sys.executable, "-c", WRITER, bootstrap, name, ledger, "15000"], capture_output=True, text=True, timeout=600
    )
    values = [int(v) for v in read_all(bootstrap, name, "read_uncommitted")[0]]  # never blocks on an open txn
    committed = [int(v) for v in read_all(bootstrap, name, "read_committed", idle=5)[0]]
    log = (broker.run / "broker.log").read_text(errors="replace")
    duplicates = sorted(v for v in set(committed) if committed.count(v) > 1)
    return {
        "scenario": "product-restart",
        "topic": name,
        "writer1_txn_timeout_ms": timeout_ms,
        "skipped_data": "Couldn't find leader endpoint for partitions Set(" + name in log,
        "skipped_ledger": "Couldn't find leader endpoint for partitions Set(" + ledger in log
        or f"Set({name}-0, {ledger}-0)" in log
        or f"Set({ledger}-0, {name}-0)" in log,
        "writer2_rc": second.returncode,
        "writer2_tail": (second.stdout + second.stderr).strip().splitlines()[-2:],
        "read_committed": len(committed),
        "read_uncommitted": len(values),
        "duplicated_values": duplicates,
        "anomaly": bool(duplicates) or second.returncode != 0,
    }


def dump_files(directories: list[Path], out: Path) -> None:
    with open(out, "w") as f:
        for d in directories:
            logs = sorted(str(p) for p in d.glob("*.log"))
            if not logs:
                continue
            cmd = [*DUMP, "--deep-iteration", "--print-data-log", "--files", ",".join(logs)]
            if d.name.startswith("__transaction_state"):
                cmd.append("--transaction-log-decoder")
            f.write(f"### {d}\n")
            f.write(subprocess.run(cmd, capture_output=True, text=True).stdout)


def run_offline(args) -> None:
    run = BASE / (
        args.run or (f"product-tv{args.tv}" if args.scenario == "product" else f"offline-tv{args.tv}-{args.b_when}")
    )
    extra = {"offsets.topic.num.partitions": "2", "transaction.state.log.num.partitions": "4"}
    n1 = Broker(run / "n1", args.port, args.port + 1, args.tv, extra=extra)
    n1.format()
    n2 = Broker(
        run / "n2",
        args.port + 2,
        args.port + 1,
        args.tv,
        node_id=2,
        cluster_id=n1.cluster_id,
        voters_port=args.port + 1,
        extra=extra,
    )
    n2.format()
    n1.start()
    n2.start()
    producer(n1.bootstrap, "warm-up")  # creates __transaction_state
    dumped = False
    try:
        for i in range(args.iterations):
            if args.scenario == "product":
                outcome = product_iteration(n1, n2)
            elif args.b_when == "commit":
                outcome = offline_commit_iteration(n1, n2)
            else:
                outcome = offline_iteration(n1, n2, args.b_when)
            result = {"i": i, "tv": args.tv, **outcome}
            print(json.dumps(result), flush=True)
            with open(run / "results.jsonl", "a") as f:
                f.write(json.dumps(result) + "\n")
            if result["anomaly"] and not dumped:
                dump_files(
                    [n2.data / f"{result['topic']}-0"]
                    + sorted(n1.data.glob("__transaction_state-*"))
                    + sorted(n2.data.glob("__transaction_state-*")),
                    run / f"dump-{result['topic']}.txt",
                )
                dumped = True
    finally:
        n2.stop()
        n1.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", choices=["alive", "closed", "killed", "killed-late"], default="alive")
    ap.add_argument("--ack", choices=["acked", "unacked"], default="acked")
    ap.add_argument("--tv", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--run", default=None, help="run directory name under /var/tmp/kafka-anomaly")
    ap.add_argument("--port", type=int, default=29092)
    ap.add_argument("--scenario", choices=["restart", "offline", "product", "product-restart"], default="restart")
    ap.add_argument(
        "--b-when",
        choices=["down", "up", "commit"],
        default="down",
        help="offline scenario: B starts while the data partition is offline (down) or after (up); "
        "commit: A itself commits while it is offline, then aborts its next transaction",
    )
    ap.add_argument(
        "--a-txn-timeout-ms",
        default=None,
        help="restart scenario: A's transaction.timeout.ms, 'LO-HI' picks one at random per iteration "
        "(to let the coordinator's own timeout abort race the broker's start-up)",
    )
    ap.add_argument(
        "--abort-interval-ms",
        type=int,
        default=None,
        help="broker transaction.abort.timed.out.transaction.cleanup.interval.ms (default 10000)",
    )
    ap.add_argument(
        "--filler-partitions",
        type=int,
        default=0,
        help="restart scenario: create this many extra partitions first (a slower start-up, like CI)",
    )
    args = ap.parse_args()
    if args.scenario in ("offline", "product"):
        return run_offline(args)
    run = BASE / (args.run or f"tv{args.tv}")
    extra = (
        {"transaction.abort.timed.out.transaction.cleanup.interval.ms": str(args.abort_interval_ms)}
        if args.abort_interval_ms
        else {}
    )
    broker = Broker(run, args.port, args.port + 1, args.tv, extra=extra)
    broker.format()
    broker.start()
    a_timeout = None
    if args.a_txn_timeout_ms:
        lo, _, hi = args.a_txn_timeout_ms.partition("-")
        a_timeout = (int(lo), int(hi or lo))
    if args.filler_partitions:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
        existing = sum(
            len(t.partitions) for n, t in admin.list_topics(timeout=30).topics.items() if n.startswith("filler-")
        )
        todo = [
            NewTopic(f"filler-{uuid.uuid4().hex[:8]}", 50, 1)
            for _ in range(max(0, args.filler_partitions - existing) // 50)
        ]
        for start in range(0, len(todo), 10):
            for future in admin.create_topics(todo[start : start + 10]).values():
                future.result(120)
    dumped = False
    try:
        for i in range(args.iterations):
            if args.scenario == "product-restart":
                result = {"i": i, "tv": args.tv, **product_restart_iteration(broker, a_timeout or (9000, 17000))}
            else:
                result = {"i": i, "tv": args.tv, **iteration(broker, args.old, args.ack, a_timeout)}
            print(json.dumps(result), flush=True)
            with open(run / "results.jsonl", "a") as f:
                f.write(json.dumps(result) + "\n")
            if result["anomaly"] and not dumped and args.scenario == "restart":
                dump(broker, result["topic"], run / f"dump-{result['topic']}.txt")
                dumped = True
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
