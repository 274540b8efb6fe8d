"""GPU duty: how much of the wall time the "GPU" spends generating, diffq vs a naive worker.

    .venv/bin/python -m bench.duty [--jobs 100] [--seconds 0.5 2] [--size 1024]
        [--modes diffq naive] [--embedded]

A synthetic model whose denoise takes a fixed time (workers/synthetic.py) returns a real
photo-like image of --size²; each job goes through diffq's own worker path in this process
(workers.execute.execute_job: claim in PostgreSQL, progress writes, lease, PNG encode,
upload to S3 (SeaweedFS), outcome recorded), back to back as a pool process runs them.
"diffq" hands encode + upload + record to the post-processing thread (DIFFQ_POSTPROCESS_DEPTH,
default 2); "naive inline" does them before the next job starts, like a plain worker.
Duty = busy seconds / wall seconds from the first claim to the last outcome recorded;
idle/job = (wall - busy) / jobs: what the worker adds between two jobs' denoising.
`--embedded` runs the same path on the embedded stores (SQLite, local files: no server,
as on a GPU machine with nothing else, scripts/gpu-check).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from bench.report import print_table


class EmbeddedStack:
    """The embedded mode's stores under a folder: SQLite and local files, no server."""

    def __init__(self, root: Path) -> None:
        from app.config import load_settings
        from app.db.migrate import upgrade

        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DIFFQ_")},
            "DIFFQ_HOME": str(root / "home"),
            "DIFFQ_PROGRESS_INTERVAL": "0.25",
            "DIFFQ_WORKER_METRICS_PORT": "0",
        }
        (root / "home").mkdir(parents=True, exist_ok=True)
        upgrade(load_settings(self.env).database_url)

    def close(self) -> None:
        pass


def _runtime(stack, seconds: float, depth: int, size: int):
    from app.catalog import Catalog, ModelSpec
    from app.config import load_settings
    from app.db.session import Database
    from app.storage import open_storage
    from workers.pipelines import LoadedModel
    from workers.postprocess import PostProcessor
    from workers.runtime import WorkerRuntime
    from workers.synthetic import SyntheticPipeline

    settings = load_settings(stack.env)
    spec = ModelSpec(
        name="synthetic",
        path=Path("/synthetic"),
        queue="gpu.synthetic",
        dtype="float32",
        max_width=size,
        max_height=size,
        max_pixels=size * size,
        default_width=size,
        default_height=size,
    )
    pipeline = SyntheticPipeline(seconds)
    return WorkerRuntime(
        settings=replace(settings, postprocess_depth=depth),
        catalog=Catalog({"synthetic": spec}, "synthetic"),
        db=Database(settings.database_url, pool_size=4),
        storage=open_storage(settings),
        models={"synthetic": LoadedModel(spec, pipeline, "cpu", 0.0)},
        device="cpu",
        owner=f"bench:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        name="bench",
        postprocessor=PostProcessor(depth) if depth > 0 else None,
    )


def _payloads(rt, jobs: int, size: int) -> list[dict]:
    from app.broker.payload import build_payload
    from app.jobs.service import create_job
    from app.jobs.states import Priority
    from app.keys import get_or_create_tenant
    from app.kinds import request_from_stored

    payloads = []
    with rt.db.session() as session:
        tenant = get_or_create_tenant(session, f"duty-{uuid.uuid4().hex[:8]}")
        for i in range(jobs):
            params = {
                "prompt": f"duty {i}",
                "negative_prompt": None,
                "model": "synthetic",
                "width": size,
                "height": size,
                "steps": 20,
                "guidance_scale": 7.5,
                "seed": i,
                "num_images": 1,
                "scheduler": "default",
                "output_format": "png",
                "priority": "normal",
            }
            job = create_job(
                session,
                tenant.id,
                model="synthetic",
                queue="gpu.synthetic",
                priority=Priority.NORMAL,
                request=request_from_stored(params),
                metadata=None,
            )
            payloads.append(build_payload(job))
    return payloads


def _succeeded(rt, payloads) -> int:
    from sqlalchemy import func, select

    from app.db.models.jobs import Job
    from app.jobs.states import JobStatus

    ids = [uuid.UUID(p["job_id"]) for p in payloads]
    with rt.db.session() as session:
        return session.scalar(
            select(func.count()).where(Job.id.in_(ids), Job.status == JobStatus.SUCCEEDED)
        )


def run_mode(stack, seconds: float, depth: int, jobs: int, size: int) -> dict:
    from workers.execute import execute_job

    rt = _runtime(stack, seconds, depth, size)
    pipeline = rt.models["synthetic"].pipeline
    warm = _payloads(rt, 2, size)
    for payload in warm:  # first encode, connections, image cache
        execute_job(rt, payload, redelivered=False)
    if rt.postprocessor is not None:
        rt.postprocessor.drain()
    pipeline.busy_seconds = 0.0
    payloads = _payloads(rt, jobs, size)
    started = time.perf_counter()
    for payload in payloads:
        execute_job(rt, payload, redelivered=False)
    if rt.postprocessor is not None:
        rt.postprocessor.drain()
    wall = time.perf_counter() - started
    succeeded = _succeeded(rt, payloads)
    if rt.postprocessor is not None:
        rt.postprocessor.close()
    rt.db.dispose()
    return {
        "worker": "diffq (post-processing overlapped)" if depth else "naive inline",
        "denoise s": seconds,
        "jobs": jobs,
        "succeeded": succeeded,
        "wall s": wall,
        "busy s": pipeline.busy_seconds,
        "idle/job ms": (wall - pipeline.busy_seconds) / jobs * 1000,
        "duty %": 100 * pipeline.busy_seconds / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seconds", type=float, nargs="+", default=[0.5, 2.0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument(
        "--modes", nargs="+", choices=["diffq", "naive"], default=["diffq", "naive"]
    )
    parser.add_argument(
        "--embedded", action="store_true", help="SQLite and local files instead of the services"
    )
    args = parser.parse_args()
    rows = []
    depths = [{"diffq": 2, "naive": 0}[mode] for mode in args.modes]
    with tempfile.TemporaryDirectory() as tmp:
        if args.embedded:
            stack = EmbeddedStack(Path(tmp))
        else:
            from testbed.stack import start_stack

            stack = start_stack(Path(tmp), {"DIFFQ_PROGRESS_INTERVAL": "0.25"})
        os.environ.update(stack.env)
        try:
            for seconds in args.seconds:
                for depth in depths:
                    rows.append(run_mode(stack, seconds, depth, args.jobs, args.size))
                    print(rows[-1], flush=True)
        finally:
            stack.close()
    print_table(
        f"GPU duty over {args.jobs} jobs of one {args.size}² PNG each (synthetic model)",
        rows,
        ["worker", "denoise s", "jobs", "succeeded", "wall s", "busy s", "idle/job ms", "duty %"],
    )


if __name__ == "__main__":
    main()
