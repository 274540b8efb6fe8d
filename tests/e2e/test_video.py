"""Video jobs through the whole path, on both modes (`served_video`: PostgreSQL, RabbitMQ,
S3 and a worker serving the tiny LTX-Video model; then `diffq up`'s embedded stores, whose
default catalog serves `tiny-video`): the API, the broker, the worker's pipeline call, the
MP4 encoded frame by frame, both files in the store, the job's outcome; the OpenAI Videos
API with the real `openai` client; and each refusal a 422 naming its field, with nothing
queued."""

from __future__ import annotations

import base64
import io

import openai
import pytest
import requests
from PIL import Image

from testbed.jobs import auth, submit, wait_terminal
from testbed.waiting import wait_until
from tests.conftest import ServedVideo
from workers.video import probe

MODEL = "tiny-video"


def _get(url: str) -> bytes:
    response = requests.get(url, timeout=30)
    assert response.status_code == 200, response.text
    return response.content


def _data_uri(size: tuple[int, int], color=(200, 40, 40)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _job_count(served: ServedVideo) -> int:
    page = requests.get(
        f"{served.url}/v1/jobs", params={"limit": 100}, headers=auth(served.key), timeout=10
    )
    return len(page.json()["data"])


def test_a_clip_goes_through_the_queue_as_an_mp4_and_a_poster(served_video):
    job = submit(
        served_video.url,
        served_video.key,
        kind="txt2vid",
        model=MODEL,
        prompt="a paper boat in the rain",
        num_frames=17,
        fps=12,
        steps=3,
        width=96,
        height=64,
        seed=7,
    )
    assert job["input"]["num_frames"] == 17 and job["input"]["fps"] == 12
    done = wait_terminal(served_video.url, served_video.key, job["id"], timeout=120)
    assert done["status"] == "succeeded", done
    assert done["progress"]["total_steps"] == 3 and done["progress"]["step"] == 3
    (video,) = done["result"]["videos"]
    (poster,) = done["result"]["images"]
    assert video["frames"] == 17 and video["fps"] == 12 and video["content_type"] == "video/mp4"
    clip = probe(_get(video["url"]))
    print(f"\n{served_video.mode}: {clip}")
    assert clip["codec"] == "h264" and clip["pix_fmt"] == "yuv420p"
    assert (clip["width"], clip["height"], clip["frames"]) == (96, 64, 17)
    assert clip["faststart"] is True
    assert abs(clip["duration"] - 17 / 12) < 0.1
    assert poster["poster"] is True
    still = Image.open(io.BytesIO(_get(poster["url"])))
    assert still.size == (96, 64)
    manifest = done["result"]["manifest"]
    assert manifest["video"]["frames"] == 17 and manifest["video"]["codec"] == "h264"
    assert "libx264" in manifest["video"]["encoder"]


def test_a_first_frame_of_another_shape_is_cropped_and_the_clip_keeps_its_shape(served_video):
    job = submit(
        served_video.url,
        served_video.key,
        kind="img2vid",
        model=MODEL,
        prompt="the red square wakes up",
        image=_data_uri((200, 100)),
        num_frames=9,
        width=64,
        height=64,
        steps=2,
    )
    done = wait_terminal(served_video.url, served_video.key, job["id"], timeout=120)
    assert done["status"] == "succeeded", done
    clip = probe(_get(done["result"]["videos"][0]["url"]))
    assert (clip["width"], clip["height"], clip["frames"]) == (64, 64, 9)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "txt2vid", "model": MODEL, "num_frames": 10}, "num_frames"),
        ({"kind": "txt2vid", "model": MODEL, "num_frames": 9999}, "num_frames"),
        ({"kind": "txt2vid", "model": MODEL, "fps": 0}, "fps"),
        ({"kind": "txt2vid", "model": MODEL, "width": 48}, "width"),
        ({"kind": "txt2vid", "model": MODEL, "num_images": 2}, "num_images"),
        ({"kind": "txt2vid", "model": "tiny"}, "kind"),
        ({"kind": "txt2img", "model": MODEL}, "kind"),
        ({"kind": "img2vid", "model": MODEL}, "image"),
        ({"kind": "img2vid", "model": MODEL, "image": "data:image/png;base64,AAAA"}, "image"),
        ({"kind": "txt2img", "model": "tiny", "num_frames": 9}, "num_frames"),
    ],
)
def test_what_a_video_model_cannot_run_is_a_422_naming_the_field(served_video, body, field):
    before = _job_count(served_video)
    response = requests.post(
        f"{served_video.url}/v1/jobs",
        json={"prompt": "x", **body},
        headers=auth(served_video.key),
        timeout=10,
    )
    assert response.status_code == 422, response.text
    assert field in response.json()["errors"]["json"], response.text
    assert _job_count(served_video) == before


def _openai(served: ServedVideo, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=key or served.key, max_retries=0)


def test_the_openai_client_creates_polls_lists_downloads_and_deletes_a_clip(served_video):
    client = _openai(served_video)
    video = client.videos.create_and_poll(
        prompt="a lighthouse at dusk",
        model="sora-2",
        seconds="1",
        size="64x64",
        poll_interval_ms=100,
    )
    assert video.status == "completed" and video.progress == 100, video
    assert video.model == MODEL and video.size == "64x64"
    # 1 s at the model's 24 fps is 24 frames: the nearest 8k + 1 is 25.
    job = requests.get(
        f"{served_video.url}/v1/jobs/{video.id}", headers=auth(served_video.key), timeout=10
    ).json()
    assert job["input"]["num_frames"] == 25 and job["input"]["kind"] == "txt2vid"
    assert float(video.seconds) == pytest.approx(25 / 24, abs=0.01)

    assert client.videos.retrieve(video.id).id == video.id
    assert video.id in [v.id for v in client.videos.list(limit=100)]
    mp4 = client.videos.download_content(video.id, variant="video").read()
    assert probe(mp4)["frames"] == 25
    thumbnail = client.videos.download_content(video.id, variant="thumbnail").read()
    assert Image.open(io.BytesIO(thumbnail)).size == (64, 64)

    other = _openai(served_video, served_video.other_key)
    with pytest.raises(openai.NotFoundError):
        other.videos.retrieve(video.id)
    with pytest.raises(openai.NotFoundError):
        other.videos.download_content(video.id)
    assert video.id not in [v.id for v in other.videos.list(limit=100)]

    deleted = client.videos.delete(video.id)
    assert deleted.deleted is True and deleted.id == video.id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_the_openai_client_starts_a_clip_from_an_input_reference(served_video):
    client = _openai(served_video)
    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), (10, 200, 10)).save(buffer, "PNG")
    video = client.videos.create_and_poll(
        prompt="green",
        input_reference=("first.png", buffer.getvalue(), "image/png"),
        seconds="0.4",
        poll_interval_ms=100,
    )
    assert video.status == "completed", video
    job = requests.get(
        f"{served_video.url}/v1/jobs/{video.id}", headers=auth(served_video.key), timeout=10
    ).json()
    assert job["input"]["kind"] == "img2vid" and job["input"]["num_frames"] == 9
    assert video.size == "96x64"  # the reference's shape, fitted to the model's multiples


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"seconds": "60"}, "seconds"),
        ({"size": "50x64"}, "size"),
        ({"size": "4096x4096"}, "size"),
        ({"model": "tiny"}, "model"),
    ],
)
def test_the_openai_client_gets_a_bad_request_naming_the_parameter(served_video, params, param):
    client = _openai(served_video)
    before = _job_count(served_video)
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.videos.create(prompt="x", **params)
    assert raised.value.body["param"] == param, raised.value.body
    assert _job_count(served_video) == before


def test_a_reference_that_is_not_an_image_is_refused(served_video):
    client = _openai(served_video)
    with pytest.raises(openai.APIStatusError) as raised:
        client.videos.create(prompt="x", input_reference=("a.png", b"not an image", "image/png"))
    assert raised.value.status_code in (413, 422)
    assert raised.value.body["param"] == "input_reference"


def test_a_clips_progress_streams_over_the_websocket(api_server, video_worker, tenant_key):
    from tests.e2e.test_websocket import _read_all, _ws_url

    job = submit(
        api_server.url,
        tenant_key,
        kind="txt2vid",
        model=MODEL,
        prompt="socket",
        steps=6,
        num_frames=9,
    )
    messages, close = _read_all(_ws_url(api_server, job["id"]), auth(tenant_key))
    # Which progress writes a client sees depends on when it reads (a tiny clip may end
    # between two): those it sees are in order and within the clip's steps.
    steps = [
        m["data"]["step"]
        for m in messages
        if m["event"] == "progress" and m["data"]["stage"] == "denoising"
    ]
    assert steps == sorted(steps) and all(0 < s <= 6 for s in steps), steps
    assert [m["id"] for m in messages] == sorted(m["id"] for m in messages)
    final = [m["data"] for m in messages if m["event"] == "status"][-1]
    assert final["progress"]["step"] == final["progress"]["total_steps"] == 6
    assert final["status"] == "succeeded" and final["result"]["videos"][0]["frames"] == 9
    assert close.code == 4000 and close.reason == "succeeded"


def test_the_python_client_and_the_cli_make_clips(served_video, tmp_path):
    """`Client.videos.run` (its events over SSE), `AsyncClient.videos.create`, and `diffq
    video` with its progress and exit statuses."""
    import asyncio
    import concurrent.futures
    import os
    import subprocess
    import sys

    from diffq.client import AsyncClient, Client

    with Client(served_video.url, served_video.key) as client:
        seen: list[str] = []
        handle = client.videos.create("client clip", model=MODEL, num_frames=9, steps=3)
        job = handle.wait(on_event=lambda event: seen.append(event.name))
        assert job["status"] == "succeeded" and "progress" in seen and seen[-1] == "status"
        (mp4,) = handle.videos()
        assert probe(mp4)["frames"] == 9
        ran = client.videos.run("from a frame", image=_data_uri((64, 64)), model=MODEL, steps=2)
        assert ran["input"]["kind"] == "img2vid"

    async def in_asyncio() -> dict:
        async with AsyncClient(served_video.url, served_video.key) as client:
            handle = await client.videos.create("async clip", model=MODEL, steps=2)
            await handle.wait()
            return {"job": handle.job, "clips": await handle.videos()}

    # In a thread of its own: a session's browser (Playwright) may run a loop in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(asyncio.run, in_asyncio()).result(timeout=120)
    assert done["job"]["status"] == "succeeded" and probe(done["clips"][0])["frames"] == 9

    env = {**os.environ, "DIFFQ_URL": served_video.url, "DIFFQ_API_KEY": served_video.key}
    out = tmp_path / "clip.mp4"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "video",
            "a cli clip",
            "--model",
            MODEL,
            "--frames",
            "17",
            "--steps",
            "2",
            "-o",
            str(out),
            "--poster",
            str(tmp_path / "poster.png"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(out)
    assert probe(out.read_bytes())["frames"] == 17
    assert Image.open(tmp_path / "poster.png").size == (64, 64)
    refused = subprocess.run(
        [sys.executable, "-m", "cli", "video", "x", "--model", MODEL, "--frames", "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "num_frames" in refused.stderr


def test_one_tenants_clips_do_not_starve_anothers_images(embedded):
    """`diffq up`'s one worker serves the image and the video queues: a tenant's row of
    long clips, submitted first, does not hold another tenant's image until they are all
    done (the worker's consumer takes the queues in turn)."""
    clips_key, images_key = embedded.new_key("clips"), embedded.new_key("images")
    clips = [
        submit(
            embedded.url,
            clips_key,
            kind="txt2vid",
            model=MODEL,
            prompt=f"long {i}",
            num_frames=49,
            width=128,
            height=128,
            steps=50,
        )
        for i in range(4)
    ]
    # Once the first clip runs, the other three wait on the video queue behind it.
    wait_until(
        lambda: (
            requests.get(
                f"{embedded.url}/v1/jobs/{clips[0]['id']}", headers=auth(clips_key), timeout=10
            ).json()["status"]
            != "queued"
        ),
        timeout=120,
    )
    image = submit(embedded.url, images_key, prompt="a quick image", steps=2)
    done_image = wait_terminal(embedded.url, images_key, image["id"], timeout=300)
    done_clips = [wait_terminal(embedded.url, clips_key, c["id"], timeout=300) for c in clips]
    assert done_image["status"] == "succeeded"
    assert all(c["status"] == "succeeded" for c in done_clips)
    starts = sorted(c["started_at"] for c in done_clips)
    print(f"\nimage started {done_image['started_at']}; clips started {starts}")
    assert done_image["started_at"] < starts[-1], "the image waited for every clip"
    # A clip weighs what it costs: steps x frames, against the image's steps.
    assert done_clips[0]["input"]["num_frames"] * 50 > 100 * done_image["input"]["steps"]


def test_a_json_body_with_an_image_url_reference_makes_an_image_to_video_job(served_video):
    response = requests.post(
        f"{served_video.url}/v1/videos",
        json={
            "prompt": "from a frame",
            "seconds": 0.4,
            "input_reference": {"image_url": _data_uri((64, 64), (0, 0, 250))},
        },
        headers=auth(served_video.key),
        timeout=10,
    )
    assert response.status_code == 200, response.text
    video = response.json()
    assert video["object"] == "video" and video["status"] in ("queued", "in_progress")
    done = wait_terminal(served_video.url, served_video.key, video["id"], timeout=120)
    assert done["input"]["kind"] == "img2vid" and done["status"] == "succeeded", done


def test_a_reference_over_the_pixel_limit_is_refused_before_anything_is_queued(served_video):
    buffer = io.BytesIO()
    Image.new("RGB", (5000, 4000), (1, 2, 3)).save(buffer, "PNG")  # 20 Mpx, a few KB
    before = _job_count(served_video)
    response = requests.post(
        f"{served_video.url}/v1/videos",
        data={"prompt": "huge"},
        files={"input_reference": ("huge.png", buffer.getvalue(), "image/png")},
        headers=auth(served_video.key),
        timeout=30,
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "input_reference"
    assert "pixels" in response.json()["error"]["message"]
    assert _job_count(served_video) == before
