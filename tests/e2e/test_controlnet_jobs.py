"""ControlNet controls through the whole path: a job of every image kind carries a control
(its image a `data:` URI or an upload), a real worker loads the catalog's ControlNet and
runs it on the tiny model, the control is in the row, the manifest and the cache key,
and it changes the image; bad controls are a 422 naming the field, with nothing stored
or queued."""

from __future__ import annotations

import base64
import io

import pytest
import requests
from PIL import Image
from sqlalchemy import func, select

from testbed.jobs import auth, submit, wait_terminal
from testbed.stack import build_tiny_controlnet


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _square(box=(16, 16, 48, 48)) -> Image.Image:
    image = Image.new("RGB", (64, 64), (20, 20, 20))
    image.paste((230, 120, 40), box)
    return image


def _data_uri(image) -> str:
    return "data:image/png;base64," + base64.b64encode(_png(image)).decode()


def _pixels(url: str) -> bytes:
    response = requests.get(url, timeout=10)
    assert response.status_code == 200
    return Image.open(io.BytesIO(response.content)).tobytes()


def _counts(db) -> tuple[int, int]:
    from app.db.models.inputs import Upload
    from app.db.models.jobs import Job

    with db.session() as session:
        jobs = session.scalar(select(func.count()).select_from(Job))
        uploads = session.scalar(select(func.count()).select_from(Upload))
    return jobs, uploads


@pytest.fixture(scope="module")
def controlnet(stack):
    return build_tiny_controlnet(stack)


def _upload(api_server, key: str, image) -> str:
    answer = requests.post(
        f"{api_server.url}/v1/uploads",
        files={"file": ("in.png", _png(image))},
        headers=auth(key),
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def test_a_canny_control_steers_a_text_to_image_job_through_the_whole_path(
    api_server, worker, tenant_key, controlnet
):
    listed = requests.get(f"{api_server.url}/v1/models", headers=auth(tenant_key), timeout=10)
    models = {model["name"]: model for model in listed.json()["data"]}
    assert (models["tiny"]["controlnets"], models["tiny"]["max_controls"]) == (["tiny-canny"], 2)
    assert (models["tiny-b"]["controlnets"], models["tiny-b"]["max_controls"]) == ([], 0)
    body = {"prompt": "a lantern", "seed": 5, "steps": 3, "cache": False}
    control = {"controlnet": "tiny-canny", "image": _data_uri(_square()), "preprocess": "canny"}
    plain = submit(api_server.url, tenant_key, **body)
    steered = submit(api_server.url, tenant_key, **body, controls=[{**control, "scale": 0.9}])
    plain, steered = (wait_terminal(api_server.url, tenant_key, j["id"]) for j in (plain, steered))
    assert steered["status"] == "succeeded", steered
    stored = steered["input"]["controls"]
    assert len(stored) == 1 and len(stored[0]["image"]) == 64  # the image's digest
    assert {k: stored[0][k] for k in ("controlnet", "scale", "start", "end", "preprocess")} == {
        "controlnet": "tiny-canny",
        "scale": 0.9,
        "start": 0.0,
        "end": 1.0,
        "preprocess": "canny",
    }
    manifest = steered["result"]["manifest"]
    assert manifest["controls"] == stored
    assert manifest["inputs"] == {"controls.0.image": stored[0]["image"]}
    assert "controls" not in plain["input"] and "controls" not in plain["result"]["manifest"]
    assert _pixels(steered["result"]["images"][0]["url"]) != _pixels(
        plain["result"]["images"][0]["url"]
    )


def test_image_to_image_and_inpainting_take_a_control_by_upload(
    api_server, worker, tenant_key, controlnet
):
    picture = _upload(api_server, tenant_key, Image.new("RGB", (64, 64), (90, 140, 200)))
    edges = _upload(api_server, tenant_key, _square(box=(8, 8, 40, 56)))
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    controls = [{"controlnet": "tiny-canny", "image": edges, "end": 0.8}]
    jobs = [
        submit(
            api_server.url,
            tenant_key,
            kind="img2img",
            prompt="a boat",
            image=picture,
            strength=0.9,
            steps=4,
            controls=controls,
        ),
        submit(
            api_server.url,
            tenant_key,
            kind="inpaint",
            prompt="a boat",
            image=picture,
            mask=_data_uri(mask),
            steps=3,
            controls=controls,
        ),
    ]
    for job in jobs:
        done = wait_terminal(api_server.url, tenant_key, job["id"])
        assert done["status"] == "succeeded", done
        assert done["result"]["manifest"]["controls"][0]["end"] == 0.8


def test_the_same_control_is_a_cache_hit_and_another_image_is_not(
    api_server, worker, tenant_key, controlnet
):
    body = {"prompt": "a kite", "seed": 8, "steps": 2}
    first = {"controlnet": "tiny-canny", "image": _data_uri(_square())}
    moved = {"controlnet": "tiny-canny", "image": _data_uri(_square(box=(0, 0, 30, 30)))}
    a = wait_terminal(
        api_server.url,
        tenant_key,
        submit(api_server.url, tenant_key, **body, controls=[first])["id"],
    )
    b = wait_terminal(
        api_server.url,
        tenant_key,
        submit(api_server.url, tenant_key, **body, controls=[first])["id"],
    )
    c = wait_terminal(
        api_server.url,
        tenant_key,
        submit(api_server.url, tenant_key, **body, controls=[moved])["id"],
    )
    assert a["status"] == b["status"] == c["status"] == "succeeded"
    assert b["cached_from"] == a["id"], b
    assert c["cached_from"] is None


def test_an_upload_previews_as_the_edges_its_controlnet_reads(api_server, tenant_key, other_key):
    import numpy as np

    upload = _upload(api_server, tenant_key, _square())

    def preview(key=tenant_key, **query):
        return requests.get(
            f"{api_server.url}/v1/uploads/{upload}/control",
            params=query,
            headers=auth(key),
            timeout=10,
        )

    canny = preview()
    assert canny.status_code == 200 and canny.headers["Content-Type"] == "image/png"
    edges = np.asarray(Image.open(io.BytesIO(canny.content)))
    assert edges.shape == (64, 64, 3) and set(np.unique(edges)) == {0, 255}
    assert edges[32, 32].tolist() == [0, 0, 0] and edges[16, 16:48].any()  # the outline
    same = np.asarray(Image.open(io.BytesIO(preview(preprocess="none").content)))
    assert same[32, 32].tolist() == [230, 120, 40]  # as uploaded
    assert preview(preprocess="depth").status_code == 422
    assert preview(key=other_key).status_code == 404


def _refused(api_server, key, db, body) -> dict:
    before = _counts(db)
    answer = requests.post(f"{api_server.url}/v1/jobs", json=body, headers=auth(key), timeout=10)
    assert answer.status_code == 422, answer.text
    assert _counts(db) == before  # nothing stored, nothing queued
    return answer.json()["errors"]["json"]


def test_bad_controls_are_refused_naming_the_field_with_nothing_stored(api_server, tenant_key, db):
    image = _data_uri(_square())
    good = {"controlnet": "tiny-canny", "image": image}

    def body(*controls, **fields):
        return {"prompt": "x", **fields, "controls": list(controls)}

    errors = _refused(api_server, tenant_key, db, body({**good, "controlnet": "depth"}))
    assert "No such ControlNet" in errors["controls"]["0"]["controlnet"][0]
    assert "tiny-canny" in errors["controls"]["0"]["controlnet"][0]  # what fits instead
    errors = _refused(api_server, tenant_key, db, body(good, {**good, "controlnet": "sdxl-canny"}))
    assert "for sdxl models" in errors["controls"]["1"]["controlnet"][0]
    errors = _refused(api_server, tenant_key, db, body(good, good, good))
    assert errors["controls"] == ["At most 2 controls for model 'tiny' (txt2img)."]
    errors = _refused(api_server, tenant_key, db, body({**good, "scale": 2.5}))
    assert list(errors["controls"]["0"]) == ["scale"]
    errors = _refused(api_server, tenant_key, db, body({**good, "start": 0.6, "end": 0.4}))
    assert errors["controls"]["0"]["end"] == ["Must be greater than start."]
    errors = _refused(api_server, tenant_key, db, body({**good, "end": 1.5}))
    assert list(errors["controls"]["0"]) == ["end"]
    errors = _refused(api_server, tenant_key, db, body({**good, "preprocess": "depth"}))
    assert list(errors["controls"]["0"]) == ["preprocess"]
    not_an_image = "data:image/png;base64," + base64.b64encode(b"not a picture").decode()
    errors = _refused(api_server, tenant_key, db, body({**good, "image": not_an_image}))
    assert list(errors["controls"]["0"]) == ["image"]
    errors = _refused(api_server, tenant_key, db, body({"controlnet": "tiny-canny"}))
    assert list(errors["controls"]["0"]) == ["image"]
    errors = _refused(api_server, tenant_key, db, body(good, model="tiny-b"))
    assert errors["controls"] == ["At most 0 controls for model 'tiny-b' (txt2img)."]
    errors = _refused(api_server, tenant_key, db, body(good, model="tiny-video", kind="txt2vid"))
    assert errors["controls"] == ["At most 0 controls for model 'tiny-video' (txt2vid)."]
