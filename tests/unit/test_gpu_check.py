"""scripts/gpu-check keeps working before a GPU is at hand: its dry run (CPU, scaled
down) runs every step and writes the report; what `--prepare` ships is what the GPU image
lacks and nothing it has."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.gpu_check import steps

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1200)  # its own command may take 900 s
def test_the_dry_run_runs_every_step_and_writes_one_report(tmp_path):
    report = tmp_path / "report.md"
    done = subprocess.run(
        [str(ROOT / "scripts/gpu-check"), "--dry-run", "--report", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = report.read_text()
    assert text.startswith("# diffq GPU check (dry run: CPU, scaled down)")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "seconds" not in line]
    assert len(rows) == len(steps(dry_run=True)), rows
    for row in rows:
        assert "| passed |" in row or "| skipped" in row, row
    # Each step's own table made it into the report.
    for heading in (
        "no CUDA device visible to torch",  # tests/gpu: skipped, with the reason
        "through diffq",  # bench.gpu
        "Quality tiers on cpu",  # bench.quality
        "GPU duty over 3 jobs",  # bench.duty
        "one call per batch size",  # bench.batching
        "Cold start, process start to first job ready",  # bench.cold_start
        "operators, a job through diffq against bare",  # bench.step_profile
    ):
        assert heading in text, heading


def test_prepare_ships_what_the_gpu_image_lacks_and_nothing_it_has():
    from bench.gpu_check import IMAGE_HAS, NOT_SHIPPED, shipped

    wanted = shipped()
    for name in ("diffusers", "celery", "kombu", "flask", "sqlalchemy", "alembic", "pytest"):
        assert name in wanted, name
    for name in (*IMAGE_HAS, *NOT_SHIPPED, "numpy", "huggingface-hub", "diffq"):
        assert name not in wanted, name
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".gpu-wheels/" in ignored and ".gpu-site/" in ignored


def test_the_gpu_plan_runs_the_new_rows_first_within_one_ten_minute_command():
    """The rows never measured on a GPU (FLUX.1-dev's, the quality tiers, the step
    profile, quantized weights) come right after the GPU tests and fit the budget at
    their whole limits (540 s, + install: under 600 s); the budget's remainder goes to the
    steps after them (FLUX compiled, then the bench.gpu rows), and one it leaves no time
    for is reported as not run."""
    plan = steps(dry_run=False)
    commands = [" ".join(step.args[2:]) for step in plan]
    gpu_rows = [i for i, c in enumerate(commands) if c.startswith("bench.gpu ")]
    assert sum(s.limit for s in plan[:5]) <= 540 and min(gpu_rows) == 6
    assert all(s.limit <= 540 for s in plan)
    assert commands[0].endswith("tests/gpu")
    assert commands[1].startswith("bench.quality --models flux-dev --seeds 1 --steps 28")
    assert "--compile" not in commands[1] and "--compile" in commands[5]
    assert commands[2].startswith("bench.quality --models sd15 sdxl")
    assert commands[3].startswith("bench.step_profile --model sdxl --steps 20")
    assert commands[4].startswith("bench.quantized --model sd15")
    for model in ("sd15", "sdxl"):
        [bench] = [c for c in commands if c.startswith(f"bench.gpu --models {model}")]
        assert "--steps 20" in bench
    assert any(c.startswith("bench.gpu --models sd15") and "--compile" in c for c in commands)
    assert any("bench.duty --embedded --jobs 100 --seconds 0.5 2" in c for c in commands)
    assert any(c.startswith("bench.batching") for c in commands)
    [cold] = [c for c in commands if c.startswith("bench.cold_start")]
    assert "sd15" in cold and "sdxl" in cold  # SDXL's 20 s goal is measured there
