"""The least a durable submit can do, as a baseline for bench/submit_throughput.py.

`POST /submit`: look the API key up, INSERT the row and COMMIT, publish one persistent
message and wait for the broker's confirm, answer `202`. `POST /parse`: only parse the
JSON body and answer `202` (the HTTP stack alone). Served by gunicorn with diffq's own
flags; configured by BENCH_DATABASE_URL (a psycopg2 URL), BENCH_BROKER_URL and
BENCH_QUEUE.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import threading
import uuid

from flask import Flask, request
from kombu import Connection, Queue
from kombu.pools import producers
from psycopg2.pool import ThreadedConnectionPool

TABLE = "bench_minimal_submits"
_KEY_RE = re.compile(r"^dq_([a-z2-7]{12})_([A-Za-z0-9_-]{43})$")


def create_app() -> Flask:
    # The same pool sizes as diffq's API: 5 connections, 5 more on demand.
    pool = ThreadedConnectionPool(1, 10, os.environ["BENCH_DATABASE_URL"])
    free = threading.BoundedSemaphore(10)  # wait for a connection, as SQLAlchemy's pool does
    broker = Connection(os.environ["BENCH_BROKER_URL"], transport_options={"confirm_publish": True})
    queue = Queue(os.environ["BENCH_QUEUE"], durable=True)
    app = Flask("minimal")

    @app.post("/parse")
    def parse():
        body = request.get_json()
        return {"prompt": body.get("prompt")}, 202

    @app.post("/submit")
    def submit():
        body = request.get_json()
        presented = request.headers.get("Authorization", "").partition(" ")[2]
        match = _KEY_RE.match(presented)
        if match is None:
            return {"message": "bad key"}, 401
        job_id = uuid.uuid4()
        free.acquire()
        conn = pool.getconn()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT tenant_id, secret_hash FROM api_keys "
                    "WHERE key_id = %s AND revoked_at IS NULL",
                    (match.group(1),),
                )
                row = cur.fetchone()
                digest = hashlib.sha256(presented.encode()).hexdigest()
                if row is None or not hmac.compare_digest(row[1], digest):
                    conn.rollback()
                    return {"message": "bad key"}, 401
                cur.execute(
                    f"INSERT INTO {TABLE} (id, tenant_id, body) VALUES (%s, %s, %s)",
                    (str(job_id), row[0], json.dumps(body)),
                )
            conn.commit()
        finally:
            pool.putconn(conn)
            free.release()
        with producers[broker].acquire(block=True) as producer:
            producer.publish(
                {"id": str(job_id)},
                routing_key=queue.name,
                declare=[queue],
                delivery_mode=2,
                serializer="json",
            )
        return {"id": str(job_id), "status": "queued"}, 202

    return app


def create_table(cursor) -> None:
    cursor.execute(
        f"CREATE TABLE IF NOT EXISTS {TABLE} (id uuid PRIMARY KEY, tenant_id uuid NOT NULL, "
        "body jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
    )
