"""Every option a job can carry goes through the whole path on PostgreSQL (the API, the
broker, the worker, the outcome recorded) and ends `succeeded` on its first run: a value
the API accepts is one the worker runs and the store keeps. (Every scheduler's manifest
holds its configuration as run; DPM-Solver++'s holds `lambda_min_clipped: -inf`, which
PostgreSQL's JSON refused, so every dpm++ job failed after three runs.)"""

from __future__ import annotations

import pytest

from app.rules import SCHEDULERS, schedulers_for
from testbed.jobs import submit, wait_terminal

pytestmark = pytest.mark.services

BASE = {"prompt": "a lighthouse", "width": 64, "height": 64, "steps": 2}
OPTIONS = {
    # The tiny model is of family sd (SD3's and FLUX's: tests/e2e/test_families.py).
    **{f"scheduler {name}": {"scheduler": name} for name in schedulers_for("sd")},
    "negative prompt": {"negative_prompt": "fog, blur"},
    "no guidance": {"guidance_scale": 0.0},
    "most guidance": {"guidance_scale": 30.0},
    "several images": {"num_images": 3},
    "another size": {"width": 128, "height": 64},
    "jpeg": {"output_format": "jpeg"},
    "webp": {"output_format": "webp"},
    "priority low": {"priority": "low"},
    "priority high": {"priority": "high"},
    "deadline": {"cancel_after": 600},
    "metadata": {"metadata": {"order": 7, "tags": ["a", "b"], "ratio": 0.5, "none": None}},
    "no cache": {"cache": False},
    "no seed": {"seed": None},
    "kind named": {"kind": "txt2img"},
    "model named": {"model": "tiny"},
    "quality balanced": {"quality": "balanced"},
    "quality fast": {"quality": "fast"},
}


def test_every_option_runs_through_the_whole_path(api_server, worker, tenant_key):
    submitted = {}
    for seed, (name, option) in enumerate(OPTIONS.items()):
        # A seed of its own: two equal requests would be one run and a cache hit.
        body = {k: v for k, v in {**BASE, "seed": seed, **option}.items() if v is not None}
        submitted[name] = submit(api_server.url, tenant_key, **body)["id"]
    finished = {
        name: wait_terminal(api_server.url, tenant_key, job_id, timeout=180)
        for name, job_id in submitted.items()
    }
    failed = {
        name: (job["status"], job["attempts"], job.get("error"))
        for name, job in finished.items()
        if job["status"] != "succeeded" or job["attempts"] != 1
    }
    print(f"{len(finished)} options through the whole path; not succeeded first time: {failed}")
    assert failed == {}
    for name, option in OPTIONS.items():
        job = finished[name]
        shown = {k: v for k, v in option.items() if k not in ("metadata", "cache", "cancel_after")}
        for key, value in shown.items():
            if value is not None:
                assert job["input"][key] == value, (name, key)
        assert len(job["result"]["images"]) == job["input"]["num_images"], name
    for name in schedulers_for("sd"):
        manifest = finished[f"scheduler {name}"]["result"]["manifest"]
        expected = SCHEDULERS[name].class_name
        assert expected is None or manifest["scheduler"]["class"] == expected, name
        assert manifest["scheduler"]["config"], name
    dpm = finished["scheduler dpm++"]["result"]["manifest"]["scheduler"]["config"]
    assert dpm["lambda_min_clipped"] == "-Infinity"  # JSON every store takes
    assert finished["metadata"]["metadata"] == OPTIONS["metadata"]["metadata"]
