"""The result cache, the reproducibility manifest and replays, through gunicorn with a real
worker running the tiny model."""

from __future__ import annotations

import time

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal

pytestmark = pytest.mark.services

BODY = {"prompt": "a cached lighthouse", "steps": 3, "seed": 1234, "num_images": 2}


def _hits(api_server) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(api_server.metrics_url, timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "diffq_result_cache_hits_total"
    )


def _digests(job) -> list[str]:
    return [image["sha256"] for image in job["result"]["images"]]


def _run(api_server, key, **body) -> dict:
    job = submit(api_server.url, key, **body)
    return wait_terminal(api_server.url, key, job["id"])


def test_a_result_carries_its_manifest(api_server, worker, tenant_key):
    job = _run(api_server, tenant_key, **BODY)
    assert job["status"] == "succeeded" and not job["cached"]
    manifest = job["result"]["manifest"]
    assert len(manifest["weights_sha256"]) == 64
    assert manifest["seed"] == BODY["seed"] and manifest["model"] == "tiny"
    assert manifest["dtype"] == "float32" and manifest["device"].startswith("cpu")
    assert manifest["scheduler"]["class"].endswith("Scheduler")
    assert manifest["scheduler"]["config"]["num_train_timesteps"] > 0
    assert all(manifest["versions"][name] for name in ("diffq", "diffusers", "torch"))
    assert len(set(_digests(job))) == 2  # seed + i: two different images


def test_a_repeated_seeded_request_is_served_from_the_cache(
    api_server, worker, tenant_key, other_key
):
    first = _run(api_server, tenant_key, **BODY)
    hits_before = _hits(api_server)
    claimed_before = worker.count(r"claimed \(attempt")

    again = submit(api_server.url, tenant_key, **BODY)
    assert again["status"] == "succeeded" and again["cached"] is True
    assert again["cached_from"] == first["id"] and again["id"] != first["id"]
    assert _digests(again) == _digests(first)
    assert again["result"]["manifest"] == first["result"]["manifest"]
    assert _hits(api_server) == hits_before + 1
    image = requests.get(again["result"]["images"][0]["url"], timeout=10)
    assert image.status_code == 200 and image.content

    # Opted out, another tenant, another seed, no seed: each runs on the worker.
    opted_out = _run(api_server, tenant_key, **BODY, cache=False)
    theirs = _run(api_server, other_key, **BODY)
    reseeded = _run(api_server, tenant_key, **{**BODY, "seed": 99})
    unseeded = _run(api_server, tenant_key, **{k: v for k, v in BODY.items() if k != "seed"})
    for job in (opted_out, theirs, reseeded, unseeded):
        assert job["status"] == "succeeded" and job["cached"] is False
    assert worker.count(r"claimed \(attempt") - claimed_before == 4
    assert _hits(api_server) == hits_before + 1
    # Same weights, inputs and seed on the same device: the same bytes.
    assert _digests(opted_out) == _digests(first) == _digests(theirs)
    assert _digests(reseeded) != _digests(first)


def test_a_result_removed_by_retention_is_not_served(api_server, worker, tenant_key, db):
    from app.config import load_settings
    from app.housekeeping.retention import remove_expired_results
    from app.storage import open_storage

    body = {**BODY, "seed": 777}
    first = _run(api_server, tenant_key, **body)
    copy = submit(api_server.url, tenant_key, **body)
    assert copy["cached"] is True
    time.sleep(1.1)
    storage = open_storage(load_settings())
    while remove_expired_results(db, storage, retention_seconds=1.0):
        pass
    shown = wait_terminal(api_server.url, tenant_key, copy["id"])
    assert shown["data_removed"] is True and shown["result"] is None
    fresh = _run(api_server, tenant_key, **body)
    assert fresh["cached"] is False and fresh["id"] != first["id"]
    assert _digests(fresh) == _digests(first)


def test_a_replay_runs_again_and_reports_matching_bytes(api_server, worker, tenant_key):
    first = _run(api_server, tenant_key, **{**BODY, "seed": 4242})
    response = requests.post(
        f"{api_server.url}/v1/jobs/{first['id']}/replay",
        headers={**auth(tenant_key), "Prefer": "wait=60"},
        timeout=90,
    )
    assert response.status_code == 200, response.text
    replay = response.json()
    assert replay["id"] != first["id"] and replay["cached"] is False
    assert replay["replay"] == {"of": first["id"], "bytes_match": True}
    assert replay["input"] == first["input"]
    assert replay["result"]["manifest"] == first["result"]["manifest"]

    missing = requests.post(
        f"{api_server.url}/v1/jobs/{replay['input']['model']}/replay",
        headers=auth(tenant_key),
        timeout=10,
    )
    assert missing.status_code == 404


def test_the_files_digest_covers_every_file_that_loading_reads(tmp_path):
    from workers.manifest import files_digest

    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "model.safetensors").write_bytes(b"a" * 100)
    (tmp_path / "model_index.json").write_text("{}")
    first = files_digest(tmp_path)
    (tmp_path / "README.md").write_text("notes")  # documentation: not read by loading
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x").write_text("y")
    assert files_digest(tmp_path) == first
    (tmp_path / "model_index.json").write_text('{"x": 1}')  # a configuration
    second = files_digest(tmp_path)
    assert second != first
    (tmp_path / "unet" / "model.safetensors").write_bytes(b"a" * 99 + b"b")  # a weight
    assert files_digest(tmp_path) not in (first, second)
