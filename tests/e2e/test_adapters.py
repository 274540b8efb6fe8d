"""LoRA adapters through the whole path: uploaded and checked (`/v1/adapters`), named by
jobs of every kind, run by a real worker on the tiny model, their digests and scales in
the manifest, the cache and the row; bad adapters and bad `loras` refused with a 422
naming the field, with nothing stored or queued."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import uuid

import pytest
import requests
from sqlalchemy import func, select

from testbed.jobs import auth, submit, wait_terminal
from workers.tiny import build_tiny_lora


def upload(api_server, key: str, data: bytes, *, filename="style.safetensors", **form):
    return requests.post(
        f"{api_server.url}/v1/adapters",
        files={"file": (filename, data)},
        data=form,
        headers=auth(key),
        timeout=30,
    )


def _counts(db) -> tuple[int, int]:
    from app.db.models.inputs import Adapter
    from app.db.models.jobs import Job

    with db.session() as session:
        jobs = session.scalar(select(func.count()).select_from(Job))
        adapters = session.scalar(select(func.count()).select_from(Adapter))
    return jobs, adapters


def _image(url: str) -> bytes:
    from PIL import Image

    response = requests.get(url, timeout=10)
    assert response.status_code == 200
    return Image.open(io.BytesIO(response.content)).tobytes()


def test_an_adapter_is_the_tenants_own_listed_and_deletable(api_server, tenant_key, other_key):
    data = build_tiny_lora(21)
    made = upload(api_server, tenant_key, data, name="ink", model="tiny")
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["family"], body["rank"], body["name"], body["bytes"]) == (
        "tiny",
        4,
        "ink",
        len(data),
    )
    again = upload(api_server, tenant_key, data)
    assert again.status_code == 201 and again.json()["id"] == body["id"]  # same file, same one
    listed = requests.get(f"{api_server.url}/v1/adapters", headers=auth(tenant_key), timeout=10)
    assert [a["id"] for a in listed.json()["data"]] == [body["id"]]
    theirs = requests.get(body["urls"]["self"], headers=auth(other_key), timeout=10)
    assert theirs.status_code == 404
    assert (
        requests.delete(body["urls"]["self"], headers=auth(other_key), timeout=10).status_code
        == 404
    )
    gone = requests.delete(body["urls"]["self"], headers=auth(tenant_key), timeout=10)
    assert gone.status_code == 204
    assert (
        requests.get(body["urls"]["self"], headers=auth(tenant_key), timeout=10).status_code == 404
    )


def test_an_adapter_job_runs_through_the_whole_path_and_leaves_nothing_behind(
    api_server, worker, tenant_key, db
):
    from app.db.models.jobs import Job

    adapter = upload(api_server, tenant_key, build_tiny_lora(22), model="tiny").json()
    shape = {"prompt": "a lighthouse", "seed": 5, "steps": 2, "cache": False}
    plain_before = submit(api_server.url, tenant_key, **shape)
    plain_before = wait_terminal(api_server.url, tenant_key, plain_before["id"])
    loras = [{"id": adapter["id"], "scale": 0.8}, {"name": "ink", "scale": -0.5}]
    job = submit(api_server.url, tenant_key, **{**shape, "cache": True}, loras=loras)
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    assert done["status"] == "succeeded", done
    manifest = done["result"]["manifest"]
    assert manifest["loras"][0] == {"sha256": adapter["sha256"], "scale": 0.8}
    assert manifest["loras"][1]["name"] == "ink" and manifest["loras"][1]["scale"] == -0.5
    assert done["input"]["loras"] == manifest["loras"]
    with db.session() as session:
        row = session.get(Job, uuid.UUID(done["id"]))
        assert len(row.adapter_set) == 64 and row.cache_key
    styled = _image(done["result"]["images"][0]["url"])
    assert styled != _image(plain_before["result"]["images"][0]["url"])
    # The same request is the cache's; another scale is another image.
    cached = submit(api_server.url, tenant_key, **{**shape, "cache": True}, loras=loras)
    assert wait_terminal(api_server.url, tenant_key, cached["id"])["cached"] is True
    rescaled = [{"id": adapter["id"], "scale": 0.4}, loras[1]]
    other = submit(api_server.url, tenant_key, **{**shape, "cache": True}, loras=rescaled)
    other = wait_terminal(api_server.url, tenant_key, other["id"])
    assert other["cached"] is False and other["status"] == "succeeded"
    # A job without adapters after them: the image it made before any, byte for byte.
    plain_after = wait_terminal(
        api_server.url, tenant_key, submit(api_server.url, tenant_key, **shape)["id"]
    )
    assert _image(plain_after["result"]["images"][0]["url"]) == _image(
        plain_before["result"]["images"][0]["url"]
    )
    # img2img with the adapter: every kind takes them.
    image = "data:image/png;base64," + _png_b64()
    edit = submit(
        api_server.url,
        tenant_key,
        kind="img2img",
        image=image,
        strength=0.5,
        loras=loras[:1],
        **shape,
    )
    edit = wait_terminal(api_server.url, tenant_key, edit["id"])
    assert (
        edit["status"] == "succeeded"
        and edit["result"]["manifest"]["loras"] == manifest["loras"][:1]
    )
    # A replay runs it again with the same adapters, byte for byte.
    replay = requests.post(
        f"{api_server.url}/v1/jobs/{done['id']}/replay", headers=auth(tenant_key), timeout=10
    ).json()
    replayed = wait_terminal(api_server.url, tenant_key, replay["id"])
    assert replayed["replay"]["bytes_match"] is True


def _png_b64() -> str:
    import base64

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 80, 40)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_bad_adapters_and_bad_loras_are_a_422_naming_the_field_and_nothing_is_queued(
    api_server, tenant_key, other_key, db
):
    good = build_tiny_lora(23)
    before = _counts(db)
    refused = {
        "a .bin checkpoint": upload(api_server, tenant_key, good, filename="style.bin"),
        "a pickle in disguise": upload(api_server, tenant_key, pickle.dumps({"w": list(range(9))})),
        "truncated": upload(api_server, tenant_key, good[:-100]),
        "another family (SDXL-wide)": upload(
            api_server, tenant_key, build_tiny_lora(1, cross_attention_dim=2048)
        ),
        "a rank mismatch": upload(api_server, tenant_key, _rank_mismatch()),
        "a model that takes none": upload(api_server, tenant_key, good, model="tiny-b"),
    }
    for name, answer in refused.items():
        print(f"{name}: {answer.status_code} {answer.text[:200]}")
        assert answer.status_code == 422, (name, answer.text)
        errors = answer.json()["errors"]
        assert "file" in errors.get("files", {}) or "model" in errors.get("form", {}), name
    assert "2048" in refused["another family (SDXL-wide)"].text
    assert _counts(db) == before  # nothing stored

    mine = upload(api_server, tenant_key, good).json()
    theirs = upload(api_server, other_key, build_tiny_lora(24)).json()
    deleted = upload(api_server, tenant_key, build_tiny_lora(25)).json()
    requests.delete(deleted["urls"]["self"], headers=auth(tenant_key), timeout=10)
    before = _counts(db)
    three = [{"id": mine["id"]}, {"name": "ink"}, {"id": deleted["id"]}]
    bodies = {
        "too many adapters": {"loras": three},
        "scale out of range": {"loras": [{"id": mine["id"], "scale": 5.0}]},
        "unknown id": {"loras": [{"id": str(uuid.uuid4())}]},
        "another tenant's id": {"loras": [{"id": theirs["id"]}]},
        "a deleted adapter": {"loras": [{"id": deleted["id"]}]},
        "neither id nor name": {"loras": [{"scale": 1.0}]},
        "an unknown shared name": {"loras": [{"name": "no-such"}]},
        "the same adapter twice": {"loras": [{"id": mine["id"]}, {"id": mine["id"]}]},
        "a model that takes none": {"model": "tiny-b", "loras": [{"id": mine["id"]}]},
    }
    for name, body in bodies.items():
        answer = requests.post(
            f"{api_server.url}/v1/jobs",
            json={"prompt": "p", **body},
            headers=auth(tenant_key),
            timeout=10,
        )
        print(f"{name}: {answer.status_code} {answer.json().get('errors')}")
        assert answer.status_code == 422, (name, answer.text)
        assert "loras" in answer.json()["errors"]["json"], (name, answer.text)
    assert _counts(db)[0] == before[0]  # no job stored, none queued


def _rank_mismatch() -> bytes:
    import json
    import struct

    prefix = "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"
    header = {
        f"{prefix}.lora_A.weight": {"dtype": "F32", "shape": [4, 64], "data_offsets": [0, 1024]},
        f"{prefix}.lora_B.weight": {"dtype": "F32", "shape": [64, 8], "data_offsets": [1024, 3072]},
    }
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(3072)


@pytest.mark.timeout(600)
def test_diffq_model_build_tiny_lora_writes_an_adapter_the_tiny_model_takes(tmp_path):
    """The README's LoRA example starts with this command: the file it writes is what an
    upload for a `lora_family = "tiny"` model accepts, its weights fixed by the seed."""
    from app.addons.lora.checks import FAMILIES, check

    path = tmp_path / "loras" / "style.safetensors"

    def build(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cli", "model", "build-tiny-lora", str(path), *options],
            capture_output=True,
            text=True,
            timeout=240,
        )

    made = build("--rank", "8", "--seed", "3")
    assert made.returncode == 0, made.stderr
    data = path.read_bytes()
    checked = check(data, FAMILIES["tiny"], field="file", max_bytes=len(data))
    assert (checked.rank, checked.pairs) == (8, 24)
    assert data == build_tiny_lora(3, rank=8)
    assert f"saved to {path} (family tiny, rank 8, 24 layers, {len(data)} bytes)" in made.stdout
    refused = build("--seed", "4")
    assert refused.returncode != 0 and "already exists" in refused.stderr, refused
    assert path.read_bytes() == data
    replaced = build("--seed", "4", "--overwrite", "--text-encoder")
    assert replaced.returncode == 0, replaced.stderr
    assert path.read_bytes() == build_tiny_lora(4, text_encoder=True)
    assert list(path.parent.iterdir()) == [path]  # nothing half-written left beside it
