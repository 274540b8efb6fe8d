"""The examples of README.md and docs/clients.md are code: each is read from its file as
it stands and run against a real API and worker, or checked against what it shows.

What a reader fills in is filled in the same way: `dq_…` is a real API key, `01a2…` the
id of the job the example made last, `whsec_…` the tenant's signing secret; the default
address `127.0.0.1:8000` becomes the test server's. Nothing else of the code is changed.
Every fenced block of the two files is either run here or listed in NOT_RUN with the
reason (and, where it is checked elsewhere, where). The examples a reader runs against the
API run twice (the `served` fixture): against production's stores and against `diffq
up`'s embedded defaults, which a newcomer meets first.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from testbed.jobs import auth, wait_terminal

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/clients.md")
ADDRESS = "127.0.0.1:8000"
KEY_HOLE, JOB_HOLE, SECRET_HOLE, BATCH_HOLE = "dq_…", "01a2…", "whsec_…", "01a3…"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@dataclass(frozen=True)
class Block:
    path: str
    line: int
    lang: str
    text: str

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = (ROOT / path).read_text()
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            line = text[: match.start()].count("\n") + 1
            found.append(Block(path, line, match.group(1), match.group(2)))
    return found


def block(path: str, first_line_starts: str) -> Block:
    (found,) = [b for b in blocks() if b.path == path and b.first.startswith(first_line_starts)]
    return found


# Every block is run by the test named here, or not run for the reason given.
RUN = {
    ("README.md", "KEY=dq_…"): "test_quick_start_submit_poll_download",
    ("README.md", "default_model = "): "test_the_models_file_example_loads",
    ("README.md", "$ curl -N "): "test_the_event_stream_transcript",
    ("README.md", "from standardwebhooks"): "test_webhook_verification",
    ("README.md", "curl -s -X POST http://127.0.0.1:8000/v1/jobs -H"): "test_prefer_wait_curl",
    ("README.md", "from openai import OpenAI"): "test_the_openai_client",
    ("README.md", "from websockets.exceptions"): "test_the_websocket_client",
    ("README.md", "$ source .venv/bin/activate"): "test_the_cli_transcript",
    ("README.md", "diffq keys create --tenant research"): "test_fair_share_tenant_commands",
    ("README.md", '{"time": '): "test_the_json_log_line",
    ("docs/clients.md", "import requests"): "test_clients_prefer_wait_from_python",
    ("README.md", "IMG=$(curl -s -X POST"): "test_image_to_image_and_inpainting_curl",
    ("README.md", "cat > prompts.jsonl <<'JSONL'"): "test_the_batch_quick_start",
    ("README.md", "diffq model build-tiny-lora"): "test_lora_adapters_curl",
    ("README.md", "CTRL=$(curl -s -X POST"): "test_controlnet_curl",
    ("README.md", "# a job at the fast tier"): "test_quality_tier_curl",
    ("README.md", "from diffq.client import Client"): "test_the_python_clients_batch",
    ("docs/clients.md", "# diffq.client (blocking"): "test_the_python_client_beside_curl",
    ("README.md", "# a clip of 17 frames"): "test_the_video_curl",
    ("README.md", "import openai"): "test_the_openai_videos_client",
}
NOT_RUN = {
    ("README.md", "scripts/up "): "starts the whole service and the whole suite; "
    "tests/e2e/test_embedded.py runs `diffq up` itself",
    ("README.md", "diffq is up in "): "the banner: tests/e2e/test_embedded.py matches it line "
    "by line against the one `diffq up` prints",
    ("README.md", "export DIFFQ_DATABASE_URL="): "production: needs your own PostgreSQL, "
    "RabbitMQ, S3 and GPUs; tests/e2e/test_deployment.py starts every role from its command",
    ("README.md", "diffq queues "): "a synopsis (optional arguments in brackets, ID "
    "placeholders, destructive commands); tests/e2e/test_operations.py runs each command",
    ("README.md", "diffq queue pause "): "a synopsis (the model `sdxl` and `$OPS_KEY` are "
    "the reader's, `--now` in brackets); tests/e2e/test_pause.py pauses and resumes through "
    "the API with an operator's key and runs `diffq queue list`, in both modes",
    ("README.md", "app/ "): "a map of the folders, not code",
    ("docs/clients.md", "# curl"): "the same requests as the README's quick starts, which run "
    "(a job, its events, a JSON Lines batch); `$(uuidgen)`, `$ID` and `prompts.jsonl` are "
    "the reader's",
    ("docs/clients.md", "# openai (its Batch API"): "tests/e2e/test_batches.py runs the "
    "openai client's Batch API (files.create, batches.create, retrieve, files.content)",
}


def _known(b: Block) -> tuple[str, str] | None:
    for table in (RUN, NOT_RUN):
        for path, start in table:
            if b.path == path and b.first.startswith(start):
                return path, start
    return None


def test_every_example_is_run_or_says_why_not():
    found = blocks()
    unknown = [f"{b.path}:{b.line} {b.first[:60]!r}" for b in found if _known(b) is None]
    assert unknown == [], f"a new example: run it here, or say in NOT_RUN why not: {unknown}"
    for path in DOCS:
        print(f"\n{path}: {sum(b.path == path for b in found)} code blocks")
    for (path, start), reason in NOT_RUN.items():
        print(f"not run: {path} {start!r}: {reason}")
    keys = [_known(b) for b in found]
    assert len(keys) == len(set(keys)), "two blocks match one entry"
    assert set(RUN) | set(NOT_RUN) == set(keys), "an entry matches no block"
    assert all(name in globals() for name in RUN.values())


# --- filling in what a reader fills in -----------------------------------------------


def fill(code: str, api, key: str | None = None, job: str | None = None, secret=None) -> str:
    code = code.replace(ADDRESS, f"127.0.0.1:{api.port}")
    for hole, value in ((KEY_HOLE, key), (JOB_HOLE, job), (SECRET_HOLE, secret)):
        if hole in code:
            assert value is not None, f"{hole} has nothing to stand for yet"
            code = code.replace(hole, value)
    return code


def commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, a here-document kept with its
    command, comment lines dropped."""
    found, current, until = [], "", None
    for line in text.splitlines():
        if until is not None:  # inside a here-document: every line is part of it
            current += line + "\n"
            if line == until:
                found.append(current.rstrip("\n"))
                current, until = "", None
            continue
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line + "\n"
        heredoc = re.search(r"<<-?\s*'?(\w+)'?\s*$", line)
        if heredoc:
            until = heredoc.group(1)
        elif not line.endswith("\\"):
            found.append(current.rstrip("\n"))
            current = ""
    return found


class Shell:
    """One bash fed one command at a time, as a reader's terminal: variables, exports and
    `source` carry over from one command to the next."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def run(self, command: str, timeout: float = 120) -> tuple[int, str, str]:
        marker = f"__done_{uuid.uuid4().hex}"
        out, err = self.cwd / f".{marker}.out", self.cwd / f".{marker}.err"
        self.process.stdin.write(f"{{ {command}\n}} >{out} 2>{err}; echo {marker} $?\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line.startswith(marker):
                code = int(line.split()[1])
                break
        stdout, stderr = out.read_text(), err.read_text()
        out.unlink()
        err.unlink()
        return code, stdout, stderr

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=10)


@pytest.fixture
def shell(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    opened = Shell(tmp_path, env)
    yield opened
    opened.close()


def _submit(api, key: str, **body) -> str:
    import requests

    answer = requests.post(f"{api.url}/v1/jobs", json=body, headers=auth(key), timeout=10)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


# --- the examples ------------------------------------------------------------------------


def test_quick_start_submit_poll_download(served, shell, tmp_path):
    steps = commands(block("README.md", "KEY=dq_…").text)
    job = None
    for command in steps:
        code, out, err = shell.run(fill(command, served.api, served.key, job))
        assert code == 0, (command, out, err)
        if "-X POST" in command:
            answer = json.loads(out)  # -> 202 {"id": …, "status": "queued", "urls": …}
            job = answer["id"]
            assert answer["status"] == "queued"
            assert answer["urls"]["self"].endswith(f"/v1/jobs/{job}")
        elif command.startswith("JOB="):
            # "(while it is queued or running, ask again)": the reader asks until it is done.
            wait_terminal(served.api.url, served.key, job)
        elif "/images/" not in command and "$JOB" in command:
            answer = json.loads(out)
            assert answer["status"] == "succeeded", answer
            (image,) = answer["result"]["images"]
            assert (image["width"], image["height"], image["seed"]) == (128, 128, 42)
            assert image["content_type"] == "image/png" and image["url"].startswith("http")
    assert job is not None
    assert Image.open(tmp_path / "out.png").size == (128, 128)


def test_prefer_wait_curl(served, shell):
    (command,) = commands(block("README.md", "curl -s -X POST http://127.0.0.1:8000").text)
    shell.run(f"KEY={served.key}")
    code, out, err = shell.run(fill(command, served.api, served.key))
    assert code == 0, err
    job = json.loads(out)
    assert job["status"] == "succeeded", job  # answered finished: it came back within 30 s
    assert job["input"]["steps"] == 8


def test_the_event_stream_transcript(served, shell):
    b = block("README.md", "$ curl -N ")
    (command,) = [line[2:] for line in b.text.splitlines() if line.startswith("$ ")]
    job = _submit(served.api, served.key, prompt="streamed", steps=20, width=128, height=128)
    shell.run(f"KEY={served.key}")
    code, out, err = shell.run(fill(command, served.api, served.key, job), timeout=90)
    assert code == 0, err
    shown = [line for line in b.text.splitlines()[1:] if line and line != "…"]
    assert out.splitlines()[0] == shown[0] == "retry: 2000"
    events = [chunk for chunk in out.split("\n\n") if chunk.startswith("id:")]
    names = [re.search(r"^event: (\w+)$", e, re.M).group(1) for e in events]
    ids = [int(re.search(r"^id: (\d+)$", e, re.M).group(1)) for e in events]
    assert {"status", "progress"} <= set(names) and ids == sorted(ids)
    last = json.loads(re.search(r"^data: (.*)$", events[-1], re.M).group(1))
    assert names[-1] == "status" and last["status"] == "succeeded"
    assert last["result"]["images"][0]["url"]
    # Which progress writes a stream carries depends on when it reads (on SQLite streams
    # poll, and 20 tiny steps may all fall between two reads): those it carries are
    # well-formed, and the job's own progress ends at its 20 steps.
    data = [
        json.loads(re.search(r"^data: (.*)$", e, re.M).group(1))
        for e, name in zip(events, names, strict=True)
        if name == "progress"
    ]
    assert all(p["stage"] and p["total_steps"] in (0, 20) for p in data), data
    assert last["progress"]["step"] == last["progress"]["total_steps"] == 20


def test_the_openai_client(served):
    code = fill(block("README.md", "from openai import OpenAI").text, served.api)
    scope = {"KEY": served.key}
    exec(compile(code, "README.md (openai)", "exec"), scope)
    png = base64.b64decode(scope["image"].data[0].b64_json)
    assert Image.open(io.BytesIO(png)).size == (128, 128)


def test_the_websocket_client(served):
    code = fill(block("README.md", "from websockets.exceptions").text, served.api)
    job = _submit(served.api, served.key, prompt="socket", steps=10)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md (websocket)", "exec"), {"KEY": served.key, "job_id": job})
    lines = printed.getvalue().splitlines()
    assert lines[-1] == "job succeeded", lines[-3:]
    messages = [json.loads(line) for line in lines[:-1]]
    assert messages and all(set(m) == {"id", "event", "data"} for m in messages)
    assert messages[-1]["event"] == "status" and messages[-1]["data"]["status"] == "succeeded"


def test_clients_prefer_wait_from_python(served):
    code = fill(block("docs/clients.md", "import requests").text, served.api)
    printed = io.StringIO()
    scope = {"KEY": served.key}
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/clients.md (Prefer: wait)", "exec"), scope)
    assert scope["answer"].status_code == 200, scope["answer"].text
    assert printed.getvalue().startswith("wait=30 succeeded ['http")


def test_webhook_verification(api_server, tenant_key, db, shell):
    """Signed as the delivery worker signs, with the secret `diffq webhook-secret` shows."""
    from standardwebhooks.webhooks import WebhookVerificationError

    from app.keys import get_or_create_tenant
    from app.webhooks import signing

    name = f"readme-{uuid.uuid4().hex[:8]}"
    with db.session() as session:
        get_or_create_tenant(session, name)
        session.commit()
    env = " ".join(f"{k}={v}" for k, v in _stack_env().items())
    code, out, err = shell.run(f"env {env} {sys.executable} -m cli webhook-secret --tenant {name}")
    assert code == 0, err
    secret = re.search(r"whsec_\S+", out).group(0)
    body = json.dumps({"type": "job.succeeded", "data": {"id": str(uuid.uuid4())}}).encode()
    headers = signing.headers([secret], f"msg_{uuid.uuid4().hex}", int(time.time()), body)
    example = fill(block("README.md", "from standardwebhooks").text, api_server, secret=secret)

    scope = {"request": SimpleNamespace(body=body, headers=headers)}
    exec(compile(example, "README.md (webhook)", "exec"), scope)
    assert scope["event"] == json.loads(body)
    forged = {
        "request": SimpleNamespace(body=body.replace(b"succeeded", b"failed"), headers=headers)
    }
    with pytest.raises(WebhookVerificationError):  # "raises if forged"
        exec(compile(example, "README.md (webhook)", "exec"), forged)


def _stack_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(("DIFFQ_", "AWS_"))}


def test_the_cli_transcript(served, shell, tmp_path):
    """The commands after `$ `, in one shell, from a folder holding the project's .venv
    (as the README's reader's clone does): `source .venv/bin/activate` puts diffq on PATH."""
    b = block("README.md", "$ source .venv/bin/activate")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    lines = b.text.splitlines()
    job = None
    for index, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        command = fill(line[2:], served.api, served.key, job)
        code, out, err = shell.run(command)
        shown = []  # the output the README shows under the command
        for following in lines[index + 1 :]:
            if following.startswith("$ "):
                break
            shown.append(following)
        if " jobs cancel " in command:  # "(a finished one: HTTP 409, exit 2)"
            assert code == 0 or (code == 2 and "HTTP 409 Conflict" in err), (command, err)
            continue
        assert code == 0, (command, out, err)
        if " generate " in command:
            job = re.search(rf"job ({UUID}) queued", err).group(1)
            # stderr is a file here: plain lines, and the bar only on a terminal.
            for expected in shown:
                if not expected.startswith("["):
                    assert re.search(_shape(expected), out + err, re.M), (expected, out, err)
            assert Image.open(tmp_path / "lighthouse.png").size == (128, 128)
        elif " jobs submit " in command:
            job = json.loads(out)["id"]
        elif " jobs watch " in command:
            assert out.startswith(f"{job}  succeeded"), out
        elif " jobs get " in command:
            assert re.search(r"^  image 0: \d+x\d+ seed \d+  http", out, re.M), out
    assert job is not None


def _shape(line: str) -> str:
    """A line of sample output as a pattern: its ids and numbers stand for any."""
    parts = re.split(rf"({UUID}|\d+(?:\.\d+)?)", line)
    return (
        "^"
        + "".join(
            re.escape(part) if i % 2 == 0 else (UUID if "-" in part else r"\d+(?:\.\d+)?")
            for i, part in enumerate(parts)
        )
        + "$"
    )


def test_fair_share_tenant_commands(shell):
    """Operator commands: the database directly, diffq on PATH (as after activating)."""
    env = {**_stack_env(), "PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin"}
    for name, value in env.items():
        shell.run(f"export {name}='{value}'")
    outputs = []
    for command in commands(block("README.md", "diffq keys create --tenant research").text):
        code, out, err = shell.run(command)
        assert code == 0, (command, out, err)
        outputs.append(out)
    assert "dq_" in outputs[0]  # the key, shown once
    assert re.search(r"weight\W+2", outputs[-1]), outputs[-1]


def test_the_models_file_example_loads(tmp_path):
    from app.catalog import load_catalog
    from app.config import load_settings

    models = tmp_path / "models.toml"
    models.write_text(block("README.md", "default_model = ").text)
    catalog = load_catalog(
        load_settings({"DIFFQ_HOME": str(tmp_path), "DIFFQ_MODELS_FILE": str(models)})
    )
    assert set(catalog.models) == {"sdxl", "flux-schnell", "tiny"}
    assert catalog.get(None).name == "sdxl"
    sdxl, flux = catalog.models["sdxl"], catalog.models["flux-schnell"]
    assert sdxl.max_pixels_per_job == 4194304
    assert (sdxl.family, sdxl.lora_family, sdxl.max_loras) == ("sd", "sdxl", 4)
    assert (flux.family, flux.preset, flux.lora_family) == ("flux", "schnell", "")
    assert "ddim" in sdxl.schedulers and "ddim" not in flux.schedulers


def test_the_json_log_line():
    """The README's line has the keys, in the order, that the JSON formatter writes for a
    line logged inside a job."""
    import logging

    from app.logs import JobContextFilter, JsonFormatter, job_context

    shown = json.loads(block("README.md", '{"time": ').text)
    record = logging.LogRecord("workers.execute", logging.INFO, __file__, 1, "job x", (), None)
    with job_context(job_id=uuid.uuid4(), tenant=uuid.uuid4(), attempt=1):
        JobContextFilter().filter(record)
    written = json.loads(JsonFormatter().format(record))
    assert list(shown) == list(written), (list(shown), list(written))


def test_image_to_image_and_inpainting_curl(served, shell, tmp_path):
    picture = Image.new("RGB", (96, 64), (40, 120, 200))
    picture.save(tmp_path / "photo.jpg", format="JPEG")
    mask = Image.new("L", (96, 64), 0)
    mask.paste(255, (30, 16, 60, 40))
    mask.save(tmp_path / "mask.png", format="PNG")
    shell.run(f"KEY={served.key}")
    made = []
    for command in commands(block("README.md", "IMG=$(curl -s -X POST").text):
        code, out, err = shell.run(fill(command, served.api, served.key))
        assert code == 0, (command, out, err)
        if "/v1/jobs" in command:
            answer = json.loads(out)
            assert answer["status"] == "queued", answer
            made.append(answer)
    assert [job["input"]["kind"] for job in made] == ["img2img", "inpaint"]
    for job in made:
        done = wait_terminal(served.api.url, served.key, job["id"])
        assert done["status"] == "succeeded", done
        assert (done["input"]["width"], done["input"]["height"]) == (96, 64)


def test_lora_adapters_curl(served, shell, tmp_path):
    """The adapter is the one the block's first command makes (diffq on PATH, as after
    `activate`), uploaded for the default model: the tiny one, in both modes."""
    shell.run(f"cd {tmp_path}")
    shell.run(f"export KEY={served.key} PATH={ROOT / '.venv' / 'bin'}:$PATH")
    outputs = []
    for command in commands(block("README.md", "diffq model build-tiny-lora").text):
        code, out, err = shell.run(fill(command, served.api, served.key), timeout=240)
        assert code == 0, (command, out, err)
        outputs.append(out)
    made = tmp_path / "watercolor.safetensors"
    assert made.is_file() and str(made.stat().st_size) in outputs[0], outputs[0]
    job = json.loads(outputs[2])
    assert job["status"] == "queued" and job["input"]["loras"][0]["scale"] == 0.8, job
    [adapter] = json.loads(outputs[3])["data"]
    assert (adapter["family"], adapter["bytes"]) == ("tiny", made.stat().st_size), adapter
    assert (
        adapter["name"] == "watercolor" and job["input"]["loras"][0]["sha256"] == adapter["sha256"]
    )
    done = wait_terminal(served.api.url, served.key, job["id"])
    assert done["status"] == "succeeded", done


def test_controlnet_curl(served, shell, tmp_path, stack):
    """The README's ControlNet: `tiny-canny` is the embedded catalog's (built by `diffq
    up`) and the test stack's (built here), so the block runs as written in both modes."""
    from testbed.stack import build_tiny_controlnet

    build_tiny_controlnet(stack)
    layout = Image.new("RGB", (64, 64), (10, 10, 10))
    layout.paste((250, 250, 250), (16, 8, 48, 56))
    layout.save(tmp_path / "layout.png", format="PNG")
    shell.run(f"cd {tmp_path}")
    shell.run(f"KEY={served.key}")
    outputs = []
    for command in commands(block("README.md", "CTRL=$(curl -s -X POST").text):
        code, out, err = shell.run(fill(command, served.api, served.key))
        assert code == 0, (command, out, err)
        outputs.append(out)
    job = json.loads(outputs[1])
    assert job["status"] == "queued", job
    [control] = job["input"]["controls"]
    assert (control["controlnet"], control["preprocess"], control["scale"]) == (
        "tiny-canny",
        "canny",
        0.8,
    )
    done = wait_terminal(served.api.url, served.key, job["id"])
    assert done["status"] == "succeeded", done
    assert done["result"]["manifest"]["controls"] == job["input"]["controls"]


def test_quality_tier_curl(served, shell):
    (command,) = commands(block("README.md", "# a job at the fast tier").text)
    shell.run(f"KEY={served.key}")
    code, out, err = shell.run(fill(command, served.api, served.key))
    assert code == 0, (out, err)
    job = json.loads(out)
    assert job["input"]["quality"] == "fast", job
    done = wait_terminal(served.api.url, served.key, job["id"])
    assert done["status"] == "succeeded", done
    assert done["result"]["manifest"]["quality"]["tier"] == "fast"


def test_the_batch_quick_start(served, shell, tmp_path):
    """The README's batch: its JSON Lines written by the here-document, posted with a
    window and an Idempotency-Key, read, its results, its cancel, then `diffq batch
    submit --wait -o` from the same shell (diffq on PATH, as after `activate`)."""
    shell.run(
        f"export KEY={served.key} DIFFQ_URL={served.api.url} DIFFQ_API_KEY={served.key} "
        f"PATH={ROOT / '.venv' / 'bin'}:$PATH"
    )
    batch = None
    for command in commands(block("README.md", "cat > prompts.jsonl <<'JSONL'").text):
        if BATCH_HOLE in command:
            command = command.replace(BATCH_HOLE, batch["id"])
        code, out, err = shell.run(fill(command, served.api, served.key), timeout=240)
        assert code == 0, (command, out, err)
        if "Idempotency-Key: spring-catalogue" in command:
            batch = json.loads(out)
            assert batch["object"] == "batch" and batch["counts"]["total"] == 2, batch
            _wait_batch(served.api, served.key, batch["id"])
        elif command.endswith('/results -H "Authorization: Bearer $KEY"'):
            rows = [json.loads(line) for line in out.splitlines()]
            assert [r["custom_id"] for r in rows] == ["sku-1001", "sku-1002"]
            assert all(r["status"] == "succeeded" and r["images"] for r in rows), rows
        elif command.startswith("diffq batch submit"):
            rows = [
                json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()
            ]
            assert [r["custom_id"] for r in rows] == ["sku-1001", "sku-1002"]
    assert batch is not None


def _wait_batch(api, key: str, batch_id: str) -> dict:
    import requests

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        batch = requests.get(f"{api.url}/v1/batches/{batch_id}", headers=auth(key), timeout=10)
        if batch.json()["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch.json()
        time.sleep(0.3)
    raise TimeoutError(batch_id)


def test_the_python_clients_batch(served):
    code = fill(block("README.md", "from diffq.client import Client").text, served.api)
    namespace = {"KEY": served.key}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["job"]["status"] == "succeeded"
    assert [row["status"] for row in namespace["rows"]] == ["succeeded"]


def test_the_python_client_beside_curl(served):
    code = block("docs/clients.md", "# diffq.client (blocking").text
    namespace = {
        "URL": served.api.url,
        "KEY": served.key,
        "rows": [(1, "a red sneaker"), (2, "a blue sneaker")],
    }
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, "docs/clients.md", "exec"), namespace)
    assert namespace["job"]["status"] == "succeeded"
    assert len(namespace["pngs"]) == 1 and namespace["pngs"][0].startswith(b"\x89PNG")
    assert [r["custom_id"] for r in namespace["results"]] == ["sku-1", "sku-2"]
    # The stream's lines: `status None` and `progress <percent>`, ending with the terminal
    # status. Which progress events a client sees depends on when it reads (a job may end
    # between two), so none is required.
    streamed = [line for line in printed.getvalue().splitlines() if not line.startswith("{")]
    assert streamed and streamed[-1] == "status None", streamed
    assert all(re.fullmatch(r"status None|progress \d+(\.\d+)?", line) for line in streamed)


def test_the_video_curl(served_video, shell):
    (command,) = commands(block("README.md", "# a clip of 17 frames").text)
    shell.run(f"KEY={served_video.key}")
    code, out, err = shell.run(fill(command, served_video.api, served_video.key), timeout=90)
    assert code == 0, err
    job = json.loads(out)
    assert job["status"] == "succeeded", job
    (clip,) = job["result"]["videos"]
    assert clip["frames"] == 17 and clip["content_type"] == "video/mp4"
    assert job["result"]["images"][0]["poster"] is True


def test_the_openai_videos_client(served_video, tmp_path, monkeypatch):
    import warnings

    monkeypatch.chdir(tmp_path)
    code = fill(block("README.md", "import openai").text, served_video.api)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the client marks Sora's API
        exec(compile(code, "README.md (openai videos)", "exec"), {"KEY": served_video.key})
    assert (tmp_path / "boat.mp4").read_bytes()[4:8] == b"ftyp"
