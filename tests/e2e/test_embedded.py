"""`diffq up` serves a job to completion with no RabbitMQ, PostgreSQL or S3."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from PIL import Image

from app.catalog import tiny_spec
from testbed.jobs import auth, submit, wait_terminal
from testbed.ports import free_port


def _clean_env(home) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DIFFQ_", "AWS_")) and k not in ("PYTHONPATH",)
    }
    env["HOME"] = str(home)
    # Any attempt to reach a server would fail here, not silently find the shared ones.
    env["PGHOST"] = "127.0.0.1"
    env["PGPORT"] = "1"
    return env


def _wait_banner(process: subprocess.Popen, log_path, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if "diffq is up" in text:
            return text
        if process.poll() is not None:
            raise AssertionError(f"diffq up exited {process.returncode}:\n{text[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no banner after {timeout}s:\n{log_path.read_text()[-3000:]}")


def _largest_size_finishes_inside_its_limit(url: str, key: str, spec) -> None:
    """The page offers every size the embedded catalog accepts: the largest must finish."""
    job = submit(url, key, prompt="the largest size", width=spec.max_width, height=spec.max_height)
    done = wait_terminal(url, key, job["id"], timeout=spec.time_limit + 30)
    run = done["metrics"]["run_seconds"]
    print(
        f"embedded {spec.max_width}x{spec.max_height} at {done['input']['steps']} steps: "
        f"{done['status']} in {run} s (soft limit {spec.soft_time_limit} s)"
    )
    assert done["status"] == "succeeded", done
    assert done["input"]["steps"] == spec.default_steps
    assert done["result"]["images"][0]["width"] == spec.max_width


ROOT = Path(__file__).resolve().parents[2]


def _pattern(line: str) -> str:
    """A README banner line as a pattern: the address, key, folder and numbers vary."""
    tokens = r"(http://127\.0\.0\.1:8000|dq_\S*…|/home/you/\S+|\d+)"
    parts = re.split(tokens, line)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(re.escape(part))
        elif part.startswith("http://"):
            out.append(r"http://127\.0\.0\.1:\d+")
        elif part.startswith(("dq_", "/home/")):
            out.append(r"\S+")
        else:
            out.append(r"\d+")
    return "^" + "".join(out) + "$"


def _the_readme_shows_this_banner(banner: str) -> None:
    """Each line of the README's banner (up to its `…`) is a line of the real one, in order."""
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("It prints the URL and an API key:\n\n```\n", 1)[1].split("```", 1)[0]
    lines = banner[banner.index("diffq is up") :].splitlines()
    # A start that installed says so in its first line (the README's next paragraph).
    lines[0] = re.sub(r"\(\d+ s installing; ", "(", lines[0])
    at = 0
    for expected in shown.splitlines():
        if expected == "…":
            break
        pattern = _pattern(expected)
        found = next((i for i in range(at, len(lines)) if re.match(pattern, lines[i])), None)
        assert found is not None, (expected, lines)
        at = found + 1


def _the_embedded_worker_is_counted_as_a_consumer(home) -> None:
    """`diffq queues` showed 0 consumers while the embedded worker ran: the filesystem
    broker keeps no count, so the workers are asked."""
    result = subprocess.run(
        [sys.executable, "-m", "cli", "queues", "--json"],
        env=_clean_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rows = {row["queue"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["gpu.tiny"]["queue_consumers"] == 1, rows


def test_a_taken_port_is_refused_at_once_naming_a_free_one(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "cli", "up", "--bind", f"127.0.0.1:{port}"],
            env=_clean_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"127.0.0.1:{port} is already in use" in result.stderr
    suggested = re.search(r"scripts/up --bind 127\.0\.0\.1:(\d+)", result.stderr)
    assert suggested and int(suggested.group(1)) != port, result.stderr
    assert "Traceback" not in output
    # Refused before anything started: no model built, no server booted.
    assert "Booting worker" not in output and "building the tiny" not in output
    assert not (tmp_path / ".diffq" / "models").exists()


# A first start builds the model and warms the worker up; on a loaded 2-core machine that
# has taken over 2 minutes.
STARTUP_TIMEOUT = 300


def _start_up(home, **env: str) -> tuple[subprocess.Popen, Path]:
    port = free_port()
    log_path = home / "up.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--bind", f"127.0.0.1:{port}"],
            env={**_clean_env(home), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log_path


def _stop(process: subprocess.Popen, log_path) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    assert code == 0, log_path.read_text()[-3000:]


@pytest.mark.timeout(600)
def test_a_first_start_serves_a_job_end_to_end_quietly_and_counts_from_scripts_up(tmp_path):
    """One first start of `diffq up` (a fresh home: the model is built) checked for what
    each start must do: the README's banner, counted from scripts/up's start with the
    install's part said; no alembic or torchvision chatter; and a job through the whole
    embedded path (SQLite, the filesystem broker, local files) with no server reached.

    A start said 7 lines of alembic's plugins set up, 2 of its migration context per
    readiness check, and, building the tiny model, transformers' notices that its image
    processors fall back to PIL without torchvision: none of it is the user's concern.
    scripts/up runs scripts/bootstrap (the install, on a first run) before `diffq up`
    starts: the banner's time begins at scripts/up's start (DIFFQ_UP_STARTED) and says
    the install's part (DIFFQ_UP_INSTALL_SECONDS, as scripts/up exports them: below)."""
    started = time.time() - 300
    process, log_path = _start_up(
        tmp_path, DIFFQ_UP_STARTED=f"{started:.3f}", DIFFQ_UP_INSTALL_SECONDS="271.4"
    )
    try:
        banner = _wait_banner(process, log_path, timeout=STARTUP_TIMEOUT)
        shown_at = time.time()
        assert "building the tiny demo model" in banner  # the first start: the model is built
        took = re.search(r"^diffq is up in (\d+) s \(271 s installing; embedded: ", banner, re.M)
        assert took, banner[banner.index("diffq is up") :][:200]
        assert 300 <= int(took.group(1)) <= round(shown_at - started), took.group(0)
        _the_readme_shows_this_banner(banner)
        url = re.search(r"API +(http://\S+)", banner).group(1)
        key = re.search(r"API key\s+(dq_\S+)", banner).group(1)
        # The banner says how to stop it and how to reach the CLI, which is not on PATH.
        assert re.search(r"^  stop +Ctrl-C", banner, re.M), banner
        assert f"export DIFFQ_URL={url} DIFFQ_API_KEY={key}" in banner
        assert re.search(r"^  \S*/bin/diffq generate 'a red fox'", banner, re.M), banner
        _a_job_runs_end_to_end(url, key, tmp_path)
        assert "amqp://" not in log_path.read_text()
    finally:
        _stop(process, log_path)
    output = log_path.read_text()
    # By logger name in diffq's format, by message in Celery's (which names no logger).
    alembic = re.compile(r"INFO\W+alembic|setup plugin alembic|Context impl |Will assume ")
    assert [line for line in output.splitlines() if alembic.search(line)] == []
    assert "torchvision" not in output, [x for x in output.splitlines() if "torchvision" in x]
    # The tiny video model has no float32 modules to keep: diffusers' warning says so.
    assert "kept in float32" not in output, [x for x in output.splitlines() if "float32" in x]


def _a_job_runs_end_to_end(url: str, key: str, tmp_path) -> None:
    job = submit(url, key, prompt="a lantern", width=96, height=64, steps=3, seed=3)
    done = wait_terminal(url, key, job["id"], timeout=90)
    assert done["status"] == "succeeded", done
    # The banner is printed once the worker has its model: the job did not wait for it.
    assert done["metrics"]["queue_seconds"] < 4, done["metrics"]
    image_url = done["result"]["images"][0]["url"]
    assert image_url.startswith(f"{url}/files/") and "signature=" in image_url
    body = requests.get(image_url, timeout=10)
    assert body.status_code == 200
    assert Image.open(io.BytesIO(body.content)).size == (96, 64)
    assert requests.get(image_url.split("?")[0], timeout=10).status_code == 403
    redirect = requests.get(
        f"{url}/v1/jobs/{job['id']}/images/0", headers=auth(key), allow_redirects=False
    )
    assert redirect.status_code == 302
    home = tmp_path / ".diffq"
    _the_embedded_worker_is_counted_as_a_consumer(tmp_path)
    _largest_size_finishes_inside_its_limit(url, key, tiny_spec(home / "models" / "tiny"))
    assert (home / "diffq.sqlite3").is_file()
    assert list((home / "images").rglob("0.png"))


def _fake_checkout(tmp_path, *, installs: bool) -> Path:
    """scripts/up in a tree of its own, beside a bootstrap that installs (touching its
    stamp, as scripts/bootstrap does) or finds everything there, and a `diffq` that
    prints what it was given."""
    tree = tmp_path / "checkout"
    (tree / "scripts").mkdir(parents=True)
    (tree / ".venv" / "bin").mkdir(parents=True)
    stamp = tree / ".venv" / ".diffq-installed"
    stamp.write_text("")
    (tree / "scripts" / "up").write_bytes((ROOT / "scripts" / "up").read_bytes())
    (tree / "scripts" / "bootstrap").write_text(
        "#!/usr/bin/env bash\n"
        + ("touch .venv/.diffq-installed\n" if installs else "")
        + "date +%s.%N > bootstrap-ran-at\n"
    )
    (tree / ".venv" / "bin" / "diffq").write_text(
        "#!/usr/bin/env bash\n"
        'echo "started=${DIFFQ_UP_STARTED:-} install=${DIFFQ_UP_INSTALL_SECONDS:-} args=$*"\n'
    )
    for script in ("scripts/up", "scripts/bootstrap", ".venv/bin/diffq"):
        (tree / script).chmod(0o755)
    os.utime(stamp, (time.time() - 60, time.time() - 60))
    return tree


@pytest.mark.parametrize("installs", [False, True])
def test_scripts_up_exports_its_start_and_the_install_it_waited_for(tmp_path, installs):
    tree = _fake_checkout(tmp_path, installs=installs)
    before = time.time()
    result = subprocess.run(
        [str(tree / "scripts" / "up"), "--bind", "127.0.0.1:9000"],
        env={**_clean_env(tmp_path), "DIFFQ_UP_INSTALL_SECONDS": "999"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    after = time.time()
    assert result.returncode == 0, result.stderr
    shown = re.fullmatch(r"started=(\S+) install=(\S*) args=(.*)\n", result.stdout)
    assert shown, result.stdout
    started, install, args = shown.groups()
    assert args == "up --bind 127.0.0.1:9000"
    bootstrap_ran = float((tree / "bootstrap-ran-at").read_text())
    assert before <= float(started) <= bootstrap_ran <= after
    if installs:
        assert 0 <= float(install) <= after - float(started) + 0.1
    else:
        assert install == ""  # nothing installed: nothing said, whatever the caller had


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
