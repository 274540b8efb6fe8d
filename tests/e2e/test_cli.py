"""The `diffq` client commands against a running API."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]


def diffq(api_server, key, *args, timeout=120, cwd=None, url=None) -> subprocess.CompletedProcess:
    env = {
        "DIFFQ_URL": url or api_server.url,
        "DIFFQ_API_KEY": key,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd or ROOT,
    )


def test_generate_shows_progress_and_saves_the_images(api_server, worker, tenant_key, tmp_path):
    out = tmp_path / "fox.png"
    result = diffq(
        api_server,
        tenant_key,
        "generate",
        "a red fox",
        "--steps",
        "30",
        "--width",
        "96",
        "--num-images",
        "2",
        "--seed",
        "5",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    saved = result.stdout.split()
    assert saved == [str(tmp_path / "fox-0.png"), str(tmp_path / "fox-1.png")]
    assert [Image.open(p).size for p in saved] == [(96, 64), (96, 64)]
    # stderr is a pipe here: plain lines per stage, no bar redrawn with escape codes.
    assert "running: denoising, 30 steps" in result.stderr, result.stderr
    assert "\033" not in result.stderr and "\r" not in result.stderr
    assert re.search(r"job \S+ succeeded in \d", result.stderr), result.stderr


def test_jobs_commands_speak_json_for_scripts(api_server, worker, tenant_key):
    submitted = diffq(
        api_server,
        tenant_key,
        "jobs",
        "submit",
        "a kite",
        "--steps",
        "2",
        "--quality",
        "fast",
        "--json",
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]

    watched = diffq(api_server, tenant_key, "jobs", "watch", job_id, "--json")
    assert json.loads(watched.stdout)["status"] == "succeeded"
    assert json.loads(watched.stdout)["result"]["manifest"]["quality"]["tier"] == "fast"
    got = json.loads(diffq(api_server, tenant_key, "jobs", "get", job_id, "--json").stdout)
    assert got["id"] == job_id and got["result"]["images"]
    listed = json.loads(diffq(api_server, tenant_key, "jobs", "list", "--json").stdout)
    assert job_id in [j["id"] for j in listed["data"]]

    refused = diffq(api_server, tenant_key, "jobs", "cancel", job_id)
    assert refused.returncode == 2 and "HTTP 409" in refused.stderr


def test_jobs_submit_wait_and_cancel(api_server, tenant_key):
    queued = diffq(
        api_server,
        tenant_key,
        "jobs",
        "submit",
        "later",
        "--model",
        "tiny-b",
        "--json",
        "--idempotency-key",
        "cli-key-1",
    )
    job_id = json.loads(queued.stdout)["id"]
    again = diffq(
        api_server,
        tenant_key,
        "jobs",
        "submit",
        "later",
        "--model",
        "tiny-b",
        "--json",
        "--idempotency-key",
        "cli-key-1",
    )
    assert json.loads(again.stdout)["id"] == job_id
    canceled = diffq(api_server, tenant_key, "jobs", "cancel", job_id)
    assert canceled.returncode == 0 and "canceled" in canceled.stdout


def test_bad_input_is_reported_plainly(api_server, tenant_key):
    result = diffq(api_server, tenant_key, "generate", "x", "--steps", "9999", "--width", "100")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "diffq: HTTP 422 Unprocessable Entity", result.stderr
    assert "  steps: Must be between 1 and 500 for model 'tiny'." in lines
    assert any(line.startswith("  width: Must be a multiple of 8") for line in lines), lines
    assert "{" not in result.stderr  # not the raw JSON
    no_key = subprocess.run(
        [sys.executable, "-m", "cli", "jobs", "list", "--url", api_server.url],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert no_key.returncode == 2 and "API key" in no_key.stderr


def test_an_api_that_is_down_is_one_clear_line_not_a_traceback(api_server, tenant_key, tmp_path):
    from testbed.ports import free_port

    down = f"http://127.0.0.1:{free_port()}"
    for args in (("jobs", "list"), ("generate", "x", "-o", str(tmp_path / "x.png"))):
        result = diffq(api_server, tenant_key, *args, url=down, timeout=60)
        assert result.returncode == 3, result.stderr
        assert "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines() == [
            f"diffq: cannot reach the API at {down} (connection refused). Is it running? "
            "Start it with scripts/up (or diffq api), or point --url / DIFFQ_URL at it."
        ]


def _jobs_of(api_server, key) -> list[str]:
    listed = diffq(api_server, key, "jobs", "list", "--json")
    return [job["id"] for job in json.loads(listed.stdout)["data"]]


def test_generate_never_writes_over_a_file_unless_asked(api_server, worker, tenant_key, tmp_path):
    # No -o: a name of the job's own in the current folder, so nothing is overwritten.
    first = diffq(api_server, tenant_key, "generate", "one", "--steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (name,) = first.stdout.split()
    assert re.fullmatch(r"diffq-[0-9a-f-]{36}\.png", name), name
    assert (tmp_path / name).is_file()

    taken = tmp_path / "taken.png"
    taken.write_bytes(b"keep me")
    before = _jobs_of(api_server, tenant_key)
    refused = diffq(api_server, tenant_key, "generate", "two", "-o", str(taken), cwd=tmp_path)
    assert refused.returncode == 2
    assert "taken.png exists" in refused.stderr and "--overwrite" in refused.stderr
    assert taken.read_bytes() == b"keep me"
    assert _jobs_of(api_server, tenant_key) == before  # refused before anything was sent

    again = diffq(
        api_server,
        tenant_key,
        "generate",
        "two",
        "--steps",
        "2",
        "-o",
        str(taken),
        "--overwrite",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    assert Image.open(taken).size == (64, 64)


def test_quiet_prints_only_the_saved_paths(api_server, worker, tenant_key, tmp_path):
    result = diffq(
        api_server,
        tenant_key,
        "generate",
        "quiet",
        "--steps",
        "3",
        "-q",
        "-o",
        "q.png",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout == "q.png\n"


def test_on_a_terminal_the_progress_bar_is_drawn_in_place(api_server, worker, tenant_key, tmp_path):
    leader, follower = pty.openpty()
    env = {
        "DIFFQ_URL": api_server.url,
        "DIFFQ_API_KEY": tenant_key,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "generate", "a tty", "--steps", "30", "-o", "t.png"],
        stdout=subprocess.PIPE,
        stderr=follower,
        cwd=tmp_path,
        env=env,
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(leader)
    text = seen.decode(errors="replace")
    assert process.returncode == 0, text
    assert "\r\x1b[K[#" in text and "denoising" in text and "/30" in text, text[-500:]


def test_jobs_get_shows_the_image_urls(api_server, worker, tenant_key):
    submitted = diffq(api_server, tenant_key, "jobs", "submit", "urls", "--steps", "2", "--wait")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]
    shown = diffq(api_server, tenant_key, "jobs", "get", job_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{job_id}  succeeded")
    assert re.fullmatch(r"  image 0: 64x64 seed \d+  http\S+", lines[1]), lines


@pytest.mark.parametrize("command", [["generate"], ["jobs", "submit"], ["jobs", "list"]])
def test_every_option_says_what_it_does(command):
    from cli import diffq as tree

    found = tree
    for name in command:
        found = found.commands[name]
    options = [p for p in found.params if p.param_type_name == "option"]
    assert options
    assert [o.name for o in options if not o.help] == []


def test_generate_from_an_image_and_a_mask(api_server, worker, tenant_key, tmp_path):
    """`--image` uploads the input (image to image); with `--mask`, inpainting; the
    output is the input's size, and every pixel outside the mask is the input's."""
    import numpy as np

    rng = np.random.default_rng(3)
    picture = Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8))
    picture.save(tmp_path / "in.png")
    mask = Image.new("L", (96, 64), 0)
    mask.paste(255, (30, 16, 60, 40))
    mask.save(tmp_path / "mask.png")
    base = ["--steps", "4", "--seed", "1", "-q"]
    img2img = diffq(
        api_server, tenant_key, "generate", "in autumn", "--image", str(tmp_path / "in.png"),
        "--strength", "0.5", "-o", str(tmp_path / "a.png"), *base,
    )  # fmt: skip
    assert img2img.returncode == 0, img2img.stderr
    assert Image.open(tmp_path / "a.png").size == (96, 64)
    inpaint = diffq(
        api_server, tenant_key, "generate", "a window", "--image", str(tmp_path / "in.png"),
        "--mask", str(tmp_path / "mask.png"), "-o", str(tmp_path / "b.png"), *base,
    )  # fmt: skip
    assert inpaint.returncode == 0, inpaint.stderr
    made = np.asarray(Image.open(tmp_path / "b.png").convert("RGB"))
    far = np.ones((64, 96), dtype=bool)
    far[4:52, 18:72] = False  # beyond the mask and its 4 px blur
    assert (made[far] == np.asarray(picture)[far]).all()
    jobs = json.loads(diffq(api_server, tenant_key, "jobs", "list", "--json").stdout)
    assert [job["input"]["kind"] for job in jobs["data"][:2]] == ["inpaint", "img2img"]
    assert jobs["data"][1]["input"]["strength"] == 0.5
    lone = diffq(api_server, tenant_key, "generate", "x", "--mask", str(tmp_path / "mask.png"))
    assert lone.returncode == 2 and "--mask and --strength go with --image" in lone.stderr


def test_generate_with_lora_adapters(api_server, worker, tenant_key, tmp_path):
    """`--lora ID[:SCALE]` names an uploaded adapter by id and a shared one by name; a bad
    scale is a 422 naming `loras`, reported plainly."""
    from diffq.client import Client
    from workers.tiny import build_tiny_lora

    with Client(api_server.url, tenant_key) as client:
        adapter = client.adapters.create(build_tiny_lora(41), model="tiny", name="cli")
        assert [a["id"] for a in client.adapters.list()] == [adapter["id"]]
    made = diffq(
        api_server, tenant_key, "generate", "a harbour", "--lora", f"{adapter['id']}:0.7",
        "--lora", "ink", "--steps", "2", "-q", "-o", str(tmp_path / "l.png"),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    [job] = json.loads(diffq(api_server, tenant_key, "jobs", "list", "--json").stdout)["data"][:1]
    assert [(lora["sha256"], lora["scale"]) for lora in job["input"]["loras"]] == [
        (adapter["sha256"], 0.7),
        (job["input"]["loras"][1]["sha256"], 1.0),
    ]
    assert job["input"]["loras"][1]["name"] == "ink"
    bad = diffq(api_server, tenant_key, "generate", "x", "--lora", "ink:9")
    assert bad.returncode == 2 and "loras" in bad.stderr


def test_generate_with_a_control_and_the_python_client_with_controls(
    api_server, worker, tenant_key, tmp_path, stack
):
    """`--control NAME=FILE,...` uploads the control image and names the ControlNet; the
    Python client passes `controls` as any field; a bad setting is one line, exit 2."""
    from diffq.client import Client
    from testbed.stack import build_tiny_controlnet

    build_tiny_controlnet(stack)
    layout = Image.new("RGB", (64, 64), (0, 0, 0))
    layout.paste((255, 255, 255), (20, 10, 44, 54))
    layout.save(tmp_path / "layout.png")
    made = diffq(
        api_server, tenant_key, "generate", "a tower", "--steps", "2", "-q",
        "--control", f"tiny-canny={tmp_path / 'layout.png'},scale=0.6,preprocess=canny,end=0.9",
        "-o", str(tmp_path / "c.png"),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    [job] = json.loads(diffq(api_server, tenant_key, "jobs", "list", "--json").stdout)["data"][:1]
    [control] = job["input"]["controls"]
    assert (control["controlnet"], control["scale"], control["end"], control["preprocess"]) == (
        "tiny-canny",
        0.6,
        0.9,
        "canny",
    )
    with Client(api_server.url, tenant_key) as client:
        upload = client.uploads.create(tmp_path / "layout.png")
        handle = client.jobs.create(
            "a tower", steps=2, controls=[{"controlnet": "tiny-canny", "image": upload["id"]}]
        )
        assert handle.wait()["result"]["manifest"]["controls"][0]["scale"] == 1.0
    bad = diffq(
        api_server, tenant_key, "generate", "x", "--control", "tiny-canny=layout.png,size=2"
    )
    assert bad.returncode == 2 and "size=2" in bad.stderr and "Traceback" not in bad.stderr
    foreign = diffq(
        api_server, tenant_key, "generate", "x",
        "--control", f"sdxl-canny={tmp_path / 'layout.png'}",
    )  # fmt: skip
    assert foreign.returncode == 2 and "controls" in foreign.stderr, foreign.stderr


def test_an_operators_command_on_a_database_it_cannot_use_is_one_clear_line(tmp_path, stack):
    """An empty database (never upgraded), a server that is away: one line naming the
    database (never its password) and what to check, exit 3, no traceback. A plain
    postgresql:// URL is read as psycopg2's (SQLAlchemy would reach for psycopg 3)."""
    from testbed.ports import free_port

    def run(env):
        return subprocess.run(
            [sys.executable, "-m", "cli", "queues"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
            cwd=tmp_path,
        )

    empty = run({"DIFFQ_HOME": str(tmp_path / "home")})
    assert empty.returncode == 3 and "Traceback" not in empty.stderr, empty.stderr
    [line] = empty.stderr.strip().splitlines()
    assert "no such table: jobs" in line and "diffq db upgrade" in line, line
    away = run({"DIFFQ_DATABASE_URL": f"postgresql://u:hunter2@127.0.0.1:{free_port()}/x"})
    assert away.returncode == 3 and "Traceback" not in away.stderr, away.stderr
    [line] = away.stderr.strip().splitlines()
    assert "Connection refused" in line and "hunter2" not in line, line
    # The suite's own database, written the way most people write it, answers.
    plain = stack.database_url.replace("postgresql+psycopg2://", "postgresql://", 1)
    served = run({"DIFFQ_DATABASE_URL": plain, "DIFFQ_HOME": str(tmp_path / "home")})
    assert served.returncode == 0 and "QUEUED" in served.stdout, served.stderr


def _said(result: subprocess.CompletedProcess) -> list[str]:
    """What a command said on stderr, line by line; never a traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()


def _jsonl(path: Path, *lines) -> Path:
    path.write_bytes(
        b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)
    )
    return path


def test_every_batch_command_on_an_api_that_is_down_is_one_line_and_exit_3(
    api_server, tenant_key, tmp_path
):
    from concurrent.futures import ThreadPoolExecutor

    from testbed.ports import free_port

    down = f"http://127.0.0.1:{free_port()}"
    prompts = _jsonl(tmp_path / "p.jsonl", {"custom_id": "a", "prompt": "x"})
    batch_id = "01a2b3c4-0000-7000-8000-000000000000"
    commands = [
        ("batch", "submit", str(prompts)),
        ("batch", "submit", str(prompts), "--wait"),
        ("batch", "get", batch_id),
        ("batch", "list"),
        ("batch", "cancel", batch_id),
        ("batch", "results", batch_id),
        ("batch", "results", batch_id, "-o", str(tmp_path / "r.jsonl")),
    ]
    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(
            pool.map(lambda a: diffq(api_server, tenant_key, *a, url=down, timeout=60), commands)
        )
    for args, result in zip(commands, results, strict=True):
        assert result.returncode == 3, (args, result.stderr)
        assert _said(result) == [
            f"diffq: cannot reach the API at {down} (connection refused). Is it running? "
            "Start it with scripts/up (or diffq api), or point --url / DIFFQ_URL at it."
        ], args


def test_a_batch_the_api_refuses_is_said_plainly_with_exit_2(api_server, tenant_key, tmp_path):
    """A 404, 409, 401 and a 422 naming a line's field: the API's words, exit 2."""
    unknown = "01a2b3c4-0000-7000-8000-000000000000"
    for command in ("get", "cancel", "results"):
        result = diffq(api_server, tenant_key, "batch", command, unknown)
        assert result.returncode == 2, result.stderr
        assert _said(result) == ["diffq: HTTP 404 Not Found: No such batch."], command
    bad_key = diffq(api_server, "dq_nope_nope", "batch", "list")
    assert bad_key.returncode == 2
    assert _said(bad_key) == ["diffq: HTTP 401 Unauthorized: Invalid or revoked API key."]

    bad = _jsonl(
        tmp_path / "bad.jsonl",
        {"custom_id": "a", "prompt": "fine", "model": "tiny-b"},
        {"custom_id": "b", "prompt": "too many steps", "steps": 9999},
    )
    refused = diffq(api_server, tenant_key, "batch", "submit", str(bad))
    assert refused.returncode == 2
    lines = _said(refused)
    assert lines[0] == "diffq: HTTP 422 Unprocessable Entity", lines
    assert "  line 2: steps: Must be between 1 and 500 for model 'tiny'." in lines, lines
    assert len(lines) <= 4 and "{" not in refused.stderr, lines

    waiting = _jsonl(tmp_path / "w.jsonl", {"custom_id": "w", "prompt": "w", "model": "tiny-b"})
    submitted = diffq(api_server, tenant_key, "batch", "submit", str(waiting), "--json")
    assert submitted.returncode == 0, submitted.stderr
    batch_id = json.loads(submitted.stdout)["id"]
    early = diffq(api_server, tenant_key, "batch", "results", batch_id)
    assert early.returncode == 2
    assert _said(early) == ["diffq: HTTP 409 Conflict: The batch has not ended yet (in_progress)."]
    assert diffq(api_server, tenant_key, "batch", "cancel", batch_id).returncode == 0
    again = diffq(api_server, tenant_key, "batch", "cancel", batch_id)
    assert again.returncode == 2
    assert _said(again) == ["diffq: HTTP 409 Conflict: The batch has already ended (cancelled)."]
    nowhere = tmp_path / "no" / "such" / "dir.jsonl"
    unwritable = diffq(api_server, tenant_key, "batch", "results", batch_id, "-o", str(nowhere))
    assert unwritable.returncode == 2
    assert _said(unwritable) == [f"diffq: cannot write {nowhere}: No such file or directory"]


def test_a_batch_file_that_cannot_be_sent_is_one_line_naming_it(api_server, tenant_key, tmp_path):
    """Missing, a folder, a line that is not JSON or not an object, bytes that are not
    UTF-8, no key: one line, exit 2, and nothing sent."""
    good = {"custom_id": "a", "prompt": "fine"}
    cases = {
        tmp_path / "missing.jsonl": "cannot read {path}: No such file or directory",
        tmp_path: "cannot read {path}: Is a directory",
        _jsonl(tmp_path / "a.jsonl", good, b"{not json"): "{path}, line 2: not JSON "
        "(Expecting property name enclosed in double quotes)",
        _jsonl(tmp_path / "b.jsonl", good, b"", [good]): "{path}, line 3: not a JSON object "
        "(one request a line)",
        _jsonl(tmp_path / "c.jsonl", b'{"prompt": "\xff"}'): "{path}, line 1: not JSON (not UTF-8)",
    }
    for path, said in cases.items():
        result = diffq(api_server, tenant_key, "batch", "submit", str(path))
        assert result.returncode == 2, result.stderr
        assert _said(result) == ["diffq: " + said.format(path=path)]
    no_key = subprocess.run(
        [sys.executable, "-m", "cli", "batch", "list", "--url", api_server.url],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert no_key.returncode == 2
    assert _said(no_key) == ["diffq: an API key is needed: --key or DIFFQ_API_KEY"]
    listed = diffq(api_server, tenant_key, "batch", "list", "--json")
    assert json.loads(listed.stdout)["data"] == []


@pytest.fixture(scope="module")
def storeless_api(stack):
    """The API as it runs, with its database away: every request is a 503."""
    from testbed.ports import free_port
    from testbed.processes import ApiServer

    env = {
        **stack.env,
        "DIFFQ_DATABASE_URL": f"postgresql+psycopg2://nobody:x@127.0.0.1:{free_port()}/none",
    }
    server = ApiServer(env, stack.logs, name="api-storeless-cli").start()
    yield server
    server.stop()


def test_a_batch_command_the_service_cannot_serve_is_one_line_and_exit_3(storeless_api, tmp_path):
    """A 5xx (the job store away): the API's message in one line, exit 3 as for an API
    that cannot be reached. (That the answer is not retried, tests/e2e/test_batches.py
    counts.)"""
    from concurrent.futures import ThreadPoolExecutor

    prompts = _jsonl(tmp_path / "p.jsonl", {"custom_id": "a", "prompt": "x"})
    unknown = "01a2b3c4-0000-7000-8000-000000000000"
    commands = [("submit", str(prompts)), ("get", unknown), ("list",), ("results", unknown)]
    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(
            pool.map(lambda a: diffq(storeless_api, "dq_any_key", "batch", *a), commands)
        )
    for args, result in zip(commands, results, strict=True):
        assert result.returncode == 3, (args, result.stderr)
        assert _said(result) == [
            "diffq: HTTP 503 Service Unavailable: The job store is unavailable; retry "
            "shortly. (retry after 5 s)"
        ], args
