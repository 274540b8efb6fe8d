"""One tiny random-weight pipeline per session, run in this process (no services)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pipeline():
    import torch

    from workers.tiny import build_tiny_pipeline

    # One thread: the tiny model gains nothing from more, and a shared machine loses a lot.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    pipeline = build_tiny_pipeline(seed=0)
    pipeline.set_progress_bar_config(disable=True)
    yield pipeline
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model(tiny_pipeline):
    """The tiny pipeline as a worker holds a loaded model (workers/pipelines.py)."""
    from pathlib import Path

    from app.catalog import tiny_spec
    from workers.pipelines import LoadedModel

    return LoadedModel(tiny_spec(Path("/models/tiny")), tiny_pipeline, "cpu", 0.0)
