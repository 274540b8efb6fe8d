"""The fleet simulator's two kinds of child process (bench/fleet.py starts them).

`run_workers`: simulated GPU workers, each a thread that consumes its queues on its own
AMQP connection (prefetch 1, acks late) and runs every delivery through the worker's own
code, `workers.execute.execute_job`: the message parsed, the job claimed with a lease
(fair share), a `ProgressReporter` writing progress every DIFFQ_PROGRESS_INTERVAL, a
`LeaseKeeper` renewing the lease, the PNG encoded, stored and the outcome recorded (with
its NOTIFY and change listeners), then the message acked. The pipeline is a stand-in that
sleeps each step (`PacedPipeline`), so a job spends no CPU on denoising. Each worker also
publishes what a Celery worker with task events on publishes: task-received, -started and
-succeeded events per task and a worker-heartbeat every 2 s, to the `celeryev` exchange.

`run_streams`: Server-Sent Event clients (asyncio), N streams per job handed to it; each
reads its job's events until the job ends and measures the lag from the job's
`finished_at` (the database's clock, on this machine) to the terminal event's arrival.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

STEP_SECONDS = 0.1  # a simulated denoising step: a job of s seconds asks for s / 0.1 steps
HEARTBEAT_SECONDS = 2.0  # Celery's worker-heartbeat interval
# A variant's setting of workers/claim.py `PASS_AT_MOST` (0: a claim waits on a job row
# another claim holds, as claims did before they passed it over).
FLEET_CLAIM_PASS = "FLEET_CLAIM_PASS"


def _paced_pipeline():
    from workers.synthetic import SyntheticPipeline

    class PacedPipeline(SyntheticPipeline):
        """The synthetic stand-in at a fixed time per step: a job's length is its steps."""

        def __call__(self, *, num_inference_steps: int, num_images_per_prompt: int = 1, **kw):
            self.seconds_per_image = STEP_SECONDS * num_inference_steps / num_images_per_prompt
            return super().__call__(
                num_inference_steps=num_inference_steps,
                num_images_per_prompt=num_images_per_prompt,
                **kw,
            )

    return PacedPipeline(0.0)


def _runtime(parent, index: int):
    from workers.pipelines import LoadedModel
    from workers.postprocess import PostProcessor
    from workers.runtime import WorkerRuntime

    settings = parent.settings
    models = {
        name: LoadedModel(spec, _paced_pipeline(), "cpu", 0.0)
        for name, spec in parent.catalog.models.items()
    }
    return WorkerRuntime(
        settings,
        catalog=parent.catalog,
        db=parent.db,
        storage=parent.storage,
        models=models,
        device="cpu",
        owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        name=f"sim{index}@{socket.gethostname()}",
        postprocessor=PostProcessor(settings.postprocess_depth),
    )


def _event(kind: str, hostname: str, **fields) -> dict:
    return {"type": kind, "hostname": hostname, "timestamp": time.time(), **fields}


def _worker(parent, index: int, stop: threading.Event, counts: Counter, lock) -> None:
    """One simulated worker: consume until `stop`, reconnecting as Celery's consumer does
    when the broker drops its connection."""
    rt = _runtime(parent, index)
    while not stop.is_set():
        try:
            _consume(parent, rt, stop, counts, lock)
        except (OSError, ConnectionError) as exc:
            with lock:
                counts["reconnects"] += 1
            if not stop.is_set():
                print(f"sim{index}: {type(exc).__name__}: {exc}; reconnecting", flush=True)
                stop.wait(1.0)
    if rt.postprocessor is not None:
        rt.postprocessor.close()


def _consume(parent, rt, stop: threading.Event, counts: Counter, lock) -> None:
    from kombu import Connection, Consumer, Exchange, Producer, Queue

    from workers.execute import Verdict, execute_job

    queues = sorted({spec.queue for spec in parent.catalog.models.values()})
    events = Exchange("celeryev", type="topic", durable=True)
    with Connection(parent.settings.broker_url, heartbeat=30) as conn:
        channel = conn.channel()
        channel.basic_qos(0, 1, False)
        producer = Producer(conn.channel(), exchange=events, serializer="json")
        producer.declare()

        def publish(kind: str, **fields) -> None:
            producer.publish(_event(kind, rt.name, **fields), routing_key=kind.replace("-", ".", 1))
            with lock:
                counts["events"] += 1

        def on_message(body, message) -> None:
            task_id = message.headers.get("id", "")
            payload = body[0][0]
            publish("task-received", uuid=task_id)
            publish("task-started", uuid=task_id)
            with lock:
                counts["deliveries"] += 1
            try:
                outcome = execute_job(
                    rt, payload, redelivered=bool(message.delivery_info.get("redelivered"))
                )
            except Exception:  # noqa: BLE001 - as the Celery task: back to the queue
                message.requeue()
                with lock:
                    counts["errors"] += 1
                return
            if outcome.verdict == Verdict.DEAD_LETTER:
                message.reject(requeue=False)
            elif outcome.verdict == Verdict.REQUEUE:
                message.requeue()
            else:
                message.ack()
            publish("task-succeeded", uuid=task_id)
            with lock:
                counts[outcome.verdict.value] += 1

        consumer = Consumer(
            channel,
            queues=[Queue(name, no_declare=True) for name in queues],
            callbacks=[on_message],
            accept=["json"],
        )
        with lock:  # (a delivery may run inside consume(), before it returns)
            counts["consuming"] += 1
        consumer.consume()
        beat = 0.0
        while not stop.is_set():
            if time.monotonic() - beat >= HEARTBEAT_SECONDS:
                beat = time.monotonic()
                publish("worker-heartbeat", active=0, processed=0)
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                conn.heartbeat_check()
        # Closing the connection hands an unacked delivery back, as a stopped worker's does.


def run_workers(env: dict, first: int, count: int, stop_file: str, results) -> None:
    """`count` simulated workers until `stop_file` exists; their counts go to `results`."""
    os.environ.update(env)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand
    from diffusers import DDIMScheduler  # noqa: F401 - imported once, before the threads race to

    from app.services import Services
    from workers import claim

    if os.environ.get(FLEET_CLAIM_PASS):
        claim.PASS_AT_MOST = int(os.environ[FLEET_CLAIM_PASS])
    parent = Services(_settings(), db_pool_size=max(8, count))
    # A delivery that arrives while a stopping worker closes goes back to the queue; amqp
    # would say so for each (set after the settings, whose logging setup comes first).
    for name in ("kombu", "amqp"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    stop = threading.Event()
    counts: Counter = Counter()
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_worker, args=(parent, first + i, stop, counts, lock), daemon=True)
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
        time.sleep(0.02)  # connections opened in turn, as a fleet's workers start
    counts_file = Path(os.environ["FLEET_COUNTS_FILE"])
    while not Path(stop_file).exists():
        time.sleep(0.5)
        with lock:
            snapshot = json.dumps(dict(counts))
        counts_file.with_suffix(".tmp").write_text(snapshot)
        counts_file.with_suffix(".tmp").replace(counts_file)
    stop.set()
    deadline = time.monotonic() + 10  # a job running now is handed back by the close
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    results.put(("workers", dict(counts)))


def _settings():
    from app.config import load_settings

    return load_settings()


async def _stream(url: str, job_id: str, key: str, lags: list, counts: Counter) -> None:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    try:
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout=120)
            if not line:
                return
            if not line.startswith(b"data: {"):
                continue
            counts["events"] += 1
            data = json.loads(line[6:])
            finished = data.get("finished_at")
            if finished and data.get("status") in ("succeeded", "failed", "canceled"):
                seen = time.time()
                lags.append((seen, seen - datetime.fromisoformat(finished).timestamp()))
                return
    except (TimeoutError, ConnectionError):
        counts["broken"] += 1
    finally:
        writer.close()


def run_streams(url: str, jobs, results) -> None:
    """Open streams for each (job id, key, n) put on `jobs` until a None arrives."""

    async def main() -> None:
        lags: list[tuple[float, float]] = []  # (seen at, lag)
        counts: Counter = Counter()
        tasks = set()
        loop = asyncio.get_running_loop()
        while True:
            item = await loop.run_in_executor(None, _take, jobs)
            if item is None:
                break
            job_id, key, n = item
            for _ in range(n):
                task = asyncio.create_task(_stream(url, job_id, key, lags, counts))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        for task in list(tasks):
            task.cancel()
        results.put(("streams", {"lags": lags, **counts}))

    asyncio.run(main())


def _take(jobs):
    while True:
        try:
            return jobs.get(timeout=0.5)
        except queue.Empty:
            continue
