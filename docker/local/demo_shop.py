"""The demo shop database: orders, payments and refunds in several currencies, the shop's customers, products
and shipments (three more key shapes: integer, text, composite), and a live writer.

Usage (the stack's connection env must be set, see ``stack.py env``)::

    python docker/local/demo_shop.py seed [--orders 20000]   # recreate the tables; history over 3 past days
    python docker/local/demo_shop.py writer                  # write until SIGTERM/SIGINT (orders, payments,
                                                             # refunds, status updates, cancellations, customers,
                                                             # prices, shipments; reviews once that table exists)
    python docker/local/demo_shop.py add-table               # create shop_reviews while the writer runs
    python docker/local/demo_shop.py report                  # print the latest reconciliation per pipeline
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from decimal import Decimal

import MySQLdb

CURRENCIES = ("EUR", "USD", "CNY", "JPY", "GBP")
STATUSES = ("new", "paid", "shipped", "delivered")
PRODUCTS = 500
# The shop's other tables: three more key shapes for the whole-database DAG (eo_shop_database, tables "shop_*").
SHOP_TABLES = {
    "shop_customers": "CREATE TABLE shop_customers (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL,"
    " country CHAR(2) NOT NULL)",
    "shop_products": "CREATE TABLE shop_products (sku VARCHAR(16) PRIMARY KEY, name VARCHAR(64) NOT NULL,"
    " price DECIMAL(10,2) NOT NULL)",
    "shop_shipments": "CREATE TABLE shop_shipments (order_id BIGINT NOT NULL, parcel_no SMALLINT NOT NULL,"
    " sku VARCHAR(16) NOT NULL, carrier VARCHAR(8) NOT NULL, PRIMARY KEY (order_id, parcel_no))",
}
REVIEWS = "shop_reviews"  # created while the writer runs (demo_shop.py add-table)


def _mysql():
    conn = json.loads(os.environ["AIRFLOW_CONN_MYSQL_DEFAULT"])
    return MySQLdb.connect(
        host=conn["host"],
        port=int(conn["port"]),
        user=conn["login"],
        password=conn["password"],
        database=conn["schema"],
        autocommit=False,
        init_command="SET time_zone = '+00:00'",
    )


def seed(orders: int) -> None:
    """Recreate the shop tables with ``orders`` orders (and their payments and refunds) over the past 3 days."""
    conn = _mysql()
    cur = conn.cursor()
    for table in ("refunds", "payments", "orders", *SHOP_TABLES, REVIEWS):
        cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(
        "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer_id INT NOT NULL,"
        " status VARCHAR(16) NOT NULL, amount DECIMAL(12,2) NOT NULL, currency CHAR(3) NOT NULL,"
        " note VARCHAR(64) CHARACTER SET utf8mb4 NULL, created_at TIMESTAMP(6) NOT NULL DEFAULT"
        " CURRENT_TIMESTAMP(6), updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
        " ON UPDATE CURRENT_TIMESTAMP(6), KEY (updated_at))"
    )
    for table, parent in (("payments", "order_id"), ("refunds", "payment_id")):
        cur.execute(
            f"CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, {parent} BIGINT NOT NULL,"
            " amount DECIMAL(12,2) NOT NULL, currency CHAR(3) NOT NULL, method VARCHAR(16) NOT NULL,"
            " updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),"
            " KEY (updated_at))"
        )
    for ddl in SHOP_TABLES.values():
        cur.execute(ddl)
    cur.executemany(
        "INSERT INTO shop_customers (id, name, country) VALUES (%s, %s, %s)",
        [(i, f"customer {i}", ("DE", "FR", "CN", "JP", "GB")[i % 5]) for i in range(1, 5000)],
    )
    cur.executemany(
        "INSERT INTO shop_products (sku, name, price) VALUES (%s, %s, %s)",
        [(f"SKU-{i:05d}", f"product {i}", Decimal(100 + i) / 100) for i in range(PRODUCTS)],
    )
    rng = random.Random(42)
    now = time.time()
    for start in range(0, orders, 1000):
        for i in range(start, min(orders, start + 1000)):
            cur.execute("SET TIMESTAMP = %s", (now - 3 * 86400 + i * (3 * 86400 - 3600) / orders,))
            _new_order(cur, rng, historic=True)
        conn.commit()
    cur.execute("SET TIMESTAMP = DEFAULT")
    conn.commit()
    conn.close()
    print(f"[shop] seeded {orders} orders with payments, refunds and shipments over the past 3 days")


def _new_order(cur, rng: random.Random, historic: bool = False) -> None:
    currency = rng.choice(CURRENCIES)
    amount = Decimal(rng.randrange(100, 500_000)) / 100
    cur.execute(
        "INSERT INTO orders (customer_id, status, amount, currency, note) VALUES (%s, %s, %s, %s, %s)",
        (
            rng.randrange(1, 5000),
            "paid" if historic else "new",
            amount,
            currency,
            None if rng.random() < 0.3 else rng.choice(["gift", "express", "café", "retour"]),
        ),
    )
    order_id = cur.lastrowid
    cur.execute(
        "INSERT INTO payments (order_id, amount, currency, method) VALUES (%s, %s, %s, %s)",
        (order_id, amount, currency, rng.choice(["card", "transfer", "wallet"])),
    )
    if rng.random() < 0.05:
        cur.execute(
            "INSERT INTO refunds (payment_id, amount, currency, method) VALUES (%s, %s, %s, 'card')",
            (cur.lastrowid, amount / 2, currency),
        )
    cur.execute(
        "INSERT INTO shop_shipments (order_id, parcel_no, sku, carrier) VALUES (%s, 1, %s, %s)",
        (order_id, f"SKU-{rng.randrange(PRODUCTS):05d}", rng.choice(["dhl", "ups", "sf"])),
    )


def _shop_change(cur, rng: random.Random, reviews: bool) -> str:
    """Change one of the shop's other tables; return what it did."""
    roll = rng.random()
    if roll < 0.4:
        cur.execute(
            "UPDATE shop_customers SET country = %s WHERE id = %s", (rng.choice(["DE", "CN"]), rng.randrange(1, 5000))
        )
        return "customers"
    if roll < 0.7:
        cur.execute(
            "UPDATE shop_products SET price = price + 0.10 WHERE sku = %s", (f"SKU-{rng.randrange(PRODUCTS):05d}",)
        )
        return "prices"
    if reviews:
        cur.execute("SELECT MAX(id) FROM orders")
        cur.execute(
            f"INSERT INTO {REVIEWS} (order_id, stars, text) VALUES (%s, %s, %s)",
            (cur.fetchone()[0], rng.randint(1, 5), rng.choice(["great", "ok", "très bien", "slow"])),
        )
        return "reviews"
    cur.execute(
        "UPDATE shop_shipments SET carrier = %s WHERE order_id = (SELECT MAX(order_id) FROM shop_shipments)",
        (rng.choice(["dhl", "ups", "sf"]),),
    )
    return "shipments"


def add_table() -> None:
    """Create the shop_reviews table (it matches the whole-database DAG's pattern) with a few reviews."""
    conn = _mysql()
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {REVIEWS} (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL,"
        " stars TINYINT NOT NULL, text VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL)"
    )
    cur.executemany(
        f"INSERT INTO {REVIEWS} (order_id, stars, text) VALUES (%s, %s, %s)",
        [(i, 1 + i % 5, "seed") for i in range(1, 200)],
    )
    conn.commit()
    conn.close()
    print(f"[shop] created {REVIEWS} with 199 reviews")


def writer(rate: float) -> None:
    """Write about ``rate`` transactions per second until SIGTERM/SIGINT; print what was written."""
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    conn = _mysql()
    cur = conn.cursor()
    rng = random.Random(os.getpid())
    counts = {"orders": 0, "updates": 0, "deletes": 0, "rollbacks": 0}
    reviews, step = False, 0
    while not stop["now"]:
        step += 1
        if not reviews and step % 50 == 0:  # the table the demo creates while the writer runs
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                (REVIEWS,),
            )
            reviews = cur.fetchone()[0] == 1
        if rng.random() < 0.3:
            done = _shop_change(cur, rng, reviews)
            counts[done] = counts.get(done, 0) + 1
            conn.commit()
            time.sleep(1 / rate)
            continue
        roll = rng.random()
        cur.execute("SELECT MIN(id), MAX(id) FROM orders")
        low, high = cur.fetchone()
        if roll < 0.5 or high is None:
            _new_order(cur, rng)
            counts["orders"] += 1
        elif roll < 0.9:
            cur.execute(
                "UPDATE orders SET status = %s, amount = amount + 0.01 WHERE id = %s",
                (rng.choice(STATUSES), rng.randint(low, high)),
            )
            counts["updates"] += 1
        elif roll < 0.97:
            cur.execute("DELETE FROM orders WHERE id = %s AND status = 'new'", (rng.randint(low, high),))
            counts["deletes"] += 1
        else:
            _new_order(cur, rng)
            conn.rollback()  # never committed: must never appear anywhere
            counts["rollbacks"] += 1
            continue
        conn.commit()
        time.sleep(1 / rate)
    conn.close()
    print(f"[shop] writer stopped: {counts}")


def report() -> int:
    """Print the latest reconciliation of every pipeline; exit 1 unless all are clean."""
    import psycopg2

    conn = json.loads(os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    pg = psycopg2.connect(
        host=conn["host"], port=conn["port"], dbname=conn["schema"], user=conn["login"], password=conn["password"]
    )
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from exactly_once_provider.reconcile.results import latest_results

    run = os.environ.get("EO_DEMO_RUN", "")
    rows = [r for r in latest_results(pg) if run in r["name"]]  # a whole-database DAG's: <pipeline>.<table>
    pg.close()
    print(
        f"\n{'pipeline':<28} {'source rows':>11} {'sink rows':>10} {'checksums':>9} {'missing':>7} "
        f"{'extra':>5} {'changed':>7} {'duplicates':>10} {'in flight':>9}  status"
    )
    for r in rows:
        same = "equal" if r["source_checksum"] == r["sink_checksum"] else "DIFFER"
        print(
            f"{r['name']:<28} {r['source_rows']:>11} {r['sink_rows']:>10} {same:>9} {r['missing']:>7} "
            f"{r['extra']:>5} {r['changed']:>7} {r['duplicate']:>10} {r['in_flight']:>9}  {r['status']}"
        )
    return 0 if rows and all(r["status"] == "clean" for r in rows) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_seed = sub.add_parser("seed")
    p_seed.add_argument("--orders", type=int, default=20_000)
    p_writer = sub.add_parser("writer")
    p_writer.add_argument("--rate", type=float, default=20.0, help="transactions per second")
    sub.add_parser("add-table")
    sub.add_parser("report")
    args = parser.parse_args()
    if args.command == "seed":
        seed(args.orders)
    elif args.command == "writer":
        writer(args.rate)
    elif args.command == "add-table":
        add_table()
    else:
        return report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
