"""A spot reclaim, as the GPU pods are configured: SIGTERM to a worker in the middle of a
job, with the drain the rendered production overlay sets (DIFFQ_SHUTDOWN_GRACE and
terminationGracePeriodSeconds), measured against that grace period.

    .venv/bin/python -m bench.spot_drain [--rounds 3] [--steps 300]

Per round: a job long enough to outlast the grace runs on a CPU worker; the worker gets
SIGTERM; the table shows how long the worker took to exit (it must be under the pod's
grace period, or the kubelet kills it), the job's status and attempts right after (it
must be back in `queued`, its attempt not spent), and that a fresh worker then takes it
up on the same attempt (then it is canceled: finishing it on a CPU would
only measure the CPU).
"""

from __future__ import annotations

import argparse
import re
import signal
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

from bench.report import print_table
from bench.submit_latency import _make_key
from testbed.deployment import kustomize
from testbed.jobs import auth, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.stack import start_stack


def drain_settings() -> tuple[int, int]:
    for doc in kustomize("production"):
        if doc["kind"] == "Deployment" and doc["metadata"]["name"].startswith("diffq-worker"):
            pod = doc["spec"]["template"]["spec"]
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            return int(env["DIFFQ_SHUTDOWN_GRACE"]), pod["terminationGracePeriodSeconds"]
    raise SystemExit("no GPU worker in the production overlay")


def _job(url: str, key: str, job_id: str) -> dict:
    return requests.get(f"{url}/v1/jobs/{job_id}", headers=auth(key), timeout=10).json()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args()
    grace, pod_grace = drain_settings()
    print(
        f"production overlay: DIFFQ_SHUTDOWN_GRACE={grace}s, "
        f"terminationGracePeriodSeconds={pod_grace}s"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.keep:
            tmp = tempfile.mkdtemp(prefix="spot-drain-")
            print(f"logs kept in {tmp}/logs")
        stack = start_stack(Path(tmp), {"DIFFQ_SHUTDOWN_GRACE": str(grace)})
        api = None
        try:
            api = ApiServer(stack.env, stack.logs, name="bench-api").start()
            key = _make_key(stack.database_url)
            for round_ in range(args.rounds):
                worker = start_worker(stack.env, stack.logs, f"drain{round_}", models="tiny")
                body = {"prompt": "reclaimed", "steps": args.steps, "width": 64, "height": 64}
                job = requests.post(
                    f"{api.url}/v1/jobs", json=body, headers=auth(key), timeout=10
                ).json()
                while _job(api.url, key, job["id"])["progress"]["stage"] != "denoising":
                    time.sleep(0.1)
                time.sleep(1.0)
                sent, sent_wall = time.monotonic(), time.time()
                worker.process.send_signal(signal.SIGTERM)
                worker.process.wait(timeout=pod_grace + 60)
                exited = time.monotonic() - sent
                handed = re.search(
                    r"\[([\d-]+ [\d:,]+): WARNING/\S+\] job \S+ handed back", worker.log()
                )
                handed_at = (
                    datetime.strptime(handed.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    - sent_wall
                    if handed
                    else None
                )
                after = _job(api.url, key, job["id"])
                # Another worker takes it up: same attempt (a hand-back spends none). Then
                # cancel it: running it to the end on a CPU would only measure the CPU.
                rescuer = start_worker(stack.env, stack.logs, f"rescue{round_}", models="tiny")
                while (rescued := _job(api.url, key, job["id"]))["status"] != "running":
                    time.sleep(0.1)
                requests.post(
                    f"{api.url}/v1/jobs/{job['id']}/cancel", headers=auth(key), timeout=10
                )
                wait_terminal(api.url, key, job["id"], timeout=120)
                rescuer.stop()
                rows.append(
                    {
                        "round": round_ + 1,
                        "hand-back s": handed_at if handed_at is not None else "-",
                        "worker exit s": exited,
                        "within pod grace": exited < pod_grace,
                        "status after": after["status"],
                        "attempts after": after["attempts"],
                        "rerun attempt": rescued["attempts"],
                    }
                )
        finally:
            if api is not None:
                api.stop()
            stack.close()
    print_table(f"Spot reclaim drain ({args.steps}-step jobs)", rows, list(rows[0]))


if __name__ == "__main__":
    main()
