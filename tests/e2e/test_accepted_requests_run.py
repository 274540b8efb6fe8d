"""Every request the API accepts is one the worker runs (a property, drawn by hypothesis):
for every kind of every model of the suite's catalog, requests drawn from the submit
schema's own fields and validators (app/web/resources/jobs/schemas.py, each kind's
`api_fields`), narrowed by the model's limits, with optional fields left out as often as
sent so that the defaults are what the worker meets. Each draw is answered `202` or a
`422` that names a field of the request (never a 5xx), and each `202` ends `succeeded`
on its first run (or the documented `content_filtered`). The example count is bounded
for the suite's time (`DIFFQ_PROPERTY_EXAMPLES` raises it) and the draws are derandomized,
so a run is repeatable; `steps` x the default strength was what this found first (an
img2img job at steps=1 was accepted and crashed the worker)."""

from __future__ import annotations

import base64
import io
import os

import marshmallow as ma
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import validate
from PIL import Image

from app.catalog import load_catalog
from app.config import load_settings
from app.web.resources.jobs.schemas import JobCreateSchema
from testbed.jobs import auth, wait_terminal

pytestmark = pytest.mark.services

EXAMPLES = int(os.environ.get("DIFFQ_PROPERTY_EXAMPLES", "6"))
# Fields drawn (the others, such as webhooks, adapters, metadata and deadlines, have tests
# of their own and need values a schema cannot give). Each is sent or left out.
DRAWN = (
    "prompt",
    "negative_prompt",
    "width",
    "height",
    "steps",
    "guidance_scale",
    "seed",
    "num_images",
    "scheduler",
    "output_format",
    "priority",
    "strength",
    "mask_blur",
    "masked_only",
    "masked_padding",
    "num_frames",
    "fps",
)


def _bounds(spec, name: str) -> tuple[float, float] | None:
    """The model's limits for a field, cut to what the suite can afford to run (sizes up
    to 96, a few steps, two images, short clips); None where the schema's own hold."""
    cheap = {
        "width": (spec.min_size, min(spec.max_width, 96)),
        "height": (spec.min_size, min(spec.max_height, 96)),
        "steps": (1, min(spec.max_steps, 4)),
        "guidance_scale": (0.0, spec.max_guidance),
        "num_images": (1, min(spec.max_num_images, 2)),
        "num_frames": (1, min(spec.max_frames, 9)),
        "fps": (1, min(spec.max_fps, 30)),
    }
    return cheap.get(name)


def field_strategy(spec, name: str, field: ma.fields.Field) -> st.SearchStrategy:
    """A value of `field` as its type and validators allow, within the model's limits."""
    validators = field.validators
    choices = next((v.choices for v in validators if isinstance(v, validate.OneOf)), None)
    if choices is not None:
        return st.sampled_from(sorted(choices))
    ranged = next((v for v in validators if isinstance(v, validate.Range)), None)
    low, high = _bounds(spec, name) or (
        (ranged.min, ranged.max) if ranged is not None else (None, None)
    )
    if name in ("width", "height"):
        step = spec.size_multiple
        return st.integers(-(-low // step), high // step).map(lambda n: n * step)
    if name == "scheduler":  # the family's, as GET /v1/models lists them
        from app.rules import schedulers_for

        return st.sampled_from(spec.schedulers or schedulers_for(spec.family))
    if isinstance(field, ma.fields.Boolean):
        return st.booleans()
    if isinstance(field, ma.fields.Integer):
        return st.integers(int(low or 0), int(high if high is not None else 1000))
    if isinstance(field, ma.fields.Float):
        return st.floats(low or 0.0, high if high is not None else 1.0, allow_nan=False)
    if isinstance(field, ma.fields.String):
        size = min(spec.max_prompt_chars, 40)
        letters = st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"])
        return st.text(letters, min_size=1, max_size=size)
    raise AssertionError(f"no strategy for field {name} ({type(field).__name__})")


def request_strategy(spec, kind: str, inputs: dict[str, str]) -> st.SearchStrategy:
    fields = JobCreateSchema().fields
    kind_fields = _kind_fields(kind)
    drawn = {
        name: st.one_of(st.none(), field_strategy(spec, name, fields[name]))
        for name in DRAWN
        if name in fields and (name in kind_fields or not _owned_by_a_kind(name))
    }
    drawn["prompt"] = field_strategy(spec, "prompt", fields["prompt"])  # required

    def body(values: dict) -> dict:
        sent = {k: v for k, v in values.items() if v is not None}
        return {"kind": kind, "model": spec.name, **sent, **inputs}

    return st.fixed_dictionaries(drawn).map(body)


def _kind_fields(kind: str) -> set[str]:
    from app.kinds import get_kind

    return set(get_kind(kind).api_fields())


def _owned_by_a_kind(name: str) -> bool:
    from app.kinds import KINDS, get_kind

    return any(name in get_kind(k).api_fields() for k in KINDS)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def inputs(api_server, tenant_key) -> dict[str, dict[str, str]]:
    """The image fields of each kind that takes them: an upload, and an inline mask."""
    answer = requests.post(
        f"{api_server.url}/v1/uploads",
        files={"file": ("in.png", _png(Image.new("RGB", (64, 64), (90, 140, 200))))},
        headers=auth(tenant_key),
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    image = answer.json()["id"]
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    inline = "data:image/png;base64," + base64.b64encode(_png(mask)).decode()
    return {
        "img2img": {"image": image},
        "inpaint": {"image": image, "mask": inline},
        "img2vid": {"image": image},
    }


CASES = [
    ("tiny", "txt2img"),
    ("tiny", "img2img"),
    ("tiny", "inpaint"),
    ("tiny-video", "txt2vid"),
    ("tiny-video", "img2vid"),
]


@pytest.mark.parametrize(("model", "kind"), CASES)
def test_every_request_the_api_accepts_runs(request, api_server, tenant_key, inputs, model, kind):
    request.getfixturevalue("video_worker" if model == "tiny-video" else "worker")
    spec = load_catalog(load_settings()).models[model]
    assert kind in spec.kinds, f"the suite's {model} no longer offers {kind}"
    accepted: dict[str, dict] = {}
    refused: list[tuple[dict, dict]] = []

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(request_strategy(spec, kind, inputs.get(kind, {})))
    def probe(body: dict) -> None:
        answer = requests.post(
            f"{api_server.url}/v1/jobs", json=body, headers=auth(tenant_key), timeout=30
        )
        assert answer.status_code in (202, 422), (answer.status_code, answer.text[:300], body)
        if answer.status_code == 422:
            named = set(answer.json()["errors"]["json"])
            assert named and named <= set(body), (named, body)  # a field it sent, named
            refused.append((body, named))
        else:
            accepted[answer.json()["id"]] = body

    probe()
    print(f"\n{model}/{kind}: {len(accepted)} accepted, {len(refused)} refused (422) of the draws")
    assert accepted, "no draw was accepted: the strategy no longer fits the model"
    unrun = {}
    for job_id, body in accepted.items():
        job = wait_terminal(api_server.url, tenant_key, job_id, timeout=180)
        filtered = (job.get("error") or {}).get("code") == "content_filtered"
        # One run (none: an equal earlier draw's result, from the cache).
        if not (job["status"] == "succeeded" and job["attempts"] <= 1) and not filtered:
            unrun[job_id] = (job["status"], job["attempts"], job.get("error"), body)
    assert unrun == {}
