"""A model folder's digest kept between starts (workers/manifest.py): the same value as
reading every byte, not read again while the files are unchanged, read again when any
changes, even with its modification time put back."""

from __future__ import annotations

import os

import pytest

from workers import manifest


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    (folder / "unet").mkdir(parents=True)
    (folder / "unet" / "weights.safetensors").write_bytes(b"a" * 1000)
    (folder / "model_index.json").write_text("{}")
    return folder


def test_a_kept_digest_is_the_read_one_and_is_not_read_again(model, tmp_path, monkeypatch):
    cache = tmp_path / "digests"
    read = manifest.files_digest(model)
    assert manifest.files_digest(model, cache) == read
    assert len(list(cache.glob("*.sha256"))) == 1

    def no_reading(*_args):
        raise AssertionError("the weights were read again")

    monkeypatch.setattr(manifest, "_read_digest", no_reading)
    assert manifest.files_digest(model, cache) == read


def test_a_changed_file_is_read_again_even_with_its_times_put_back(model, tmp_path):
    cache = tmp_path / "digests"
    first = manifest.files_digest(model, cache)
    weights = model / "unet" / "weights.safetensors"
    before = weights.stat()
    weights.write_bytes(b"b" * 1000)  # same size
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # as cp -p or tar would
    second = manifest.files_digest(model, cache)
    assert second != first
    assert second == manifest.files_digest(model)


def test_a_cache_that_cannot_be_written_still_gives_the_digest(model, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert manifest.files_digest(model, blocked / "digests") == manifest.files_digest(model)
