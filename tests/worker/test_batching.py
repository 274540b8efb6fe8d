"""Dynamic batching on the tiny model (CPU): per-job seeds, a job leaving the batch at a
step (its rows cut, nothing of it decoded), and what may share a batch."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.catalog import tiny_spec
from app.kinds import compatible, kind_of
from testbed.factories import generate_one, job_request
from workers.call import Interrupted, generate
from workers.pipelines import LoadedModel


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _run(model, jobs, on_step=None):
    steps = on_step or [lambda s, t: True] * len(jobs)
    return generate(model, jobs, on_step=steps)


@pytest.fixture
def decodes(tiny_pipeline, monkeypatch):
    """The batch size of every VAE decode."""
    sizes: list[int] = []
    decode = tiny_pipeline.vae.decode

    def counting(latents, *args, **kwargs):
        sizes.append(int(latents.shape[0]))
        return decode(latents, *args, **kwargs)

    monkeypatch.setattr(tiny_pipeline.vae, "decode", counting)
    return sizes


@pytest.mark.parametrize("scheduler", ["default", "euler_a"])
def test_each_job_keeps_its_seed_whatever_it_is_batched_with(tiny_model, scheduler):
    job = job_request(prompt="a red cube", seed=11, scheduler=scheduler)
    with_one = [job, job_request(prompt="a blue sphere", seed=5, scheduler=scheduler)]
    with_other = [
        job,
        job_request(prompt="grass", negative_prompt="fog", seed=99, scheduler=scheduler),
    ]
    first = _run(tiny_model, with_one)
    second = _run(tiny_model, with_other)
    # Same batch shape, other companions: the job's image is the same bytes.
    assert _png(first[0].images[0]) == _png(second[0].images[0])
    assert _png(first[1].images[0]) != _png(second[1].images[0])
    # Alone (one row instead of two): the same image, up to float rounding in kernels
    # whose summation order depends on the batch's size (MKL/oneDNN on CPU, cuBLAS).
    alone = generate_one(tiny_model, job).images[0]
    batched = np.asarray(first[0].images[0], dtype=int)
    difference = np.abs(np.asarray(alone, dtype=int) - batched)
    other = np.abs(np.asarray(first[1].images[0], dtype=int) - batched)
    print(
        f"{scheduler}: alone vs batched: bytes equal {_png(alone) == _png(first[0].images[0])}, "
        f"max level difference {difference.max()}, pixels differing {np.mean(difference > 0):.5f}; "
        f"another job's image differs by up to {other.max()}"
    )
    assert difference.max() <= 2 and np.mean(difference > 0) < 0.01
    assert other.max() > 50  # a different seed is a different image


def test_a_job_with_several_images_gets_seed_seed_plus_one(tiny_model):
    jobs = [job_request(seed=3, num_images=2), job_request(prompt="other", seed=4)]
    out = _run(tiny_model, jobs)
    assert [len(o.images) for o in out] == [2, 1]
    # Image 1 of job 0 (seed 4) and job 1 (seed 4) share their starting noise but not
    # their prompt; image 0 of job 0 (seed 3) is another image altogether.
    assert len({_png(out[0].images[0]), _png(out[0].images[1]), _png(out[1].images[0])}) == 3


@pytest.mark.parametrize("scheduler", ["default", "euler_a", "dpm++", "lms", "pndm"])
def test_a_job_that_leaves_is_cut_from_the_batch_and_the_others_finish(
    tiny_model, decodes, scheduler
):
    jobs = [
        job_request(seed=1, steps=6, scheduler=scheduler),
        job_request(prompt="leaves", seed=2, steps=6, num_images=2, scheduler=scheduler),
        job_request(prompt="stays", seed=3, steps=6, scheduler=scheduler),
    ]
    seen = {0: [], 1: [], 2: []}

    def on_step(index, leave_at=None):
        def step(s, _t):
            seen[index].append(s)
            return leave_at is None or s < leave_at

        return step

    out = _run(tiny_model, jobs, [on_step(0), on_step(1, leave_at=2), on_step(2)])
    print(f"{scheduler}: steps seen {seen}, decode batch sizes {decodes}")
    assert out[1] is None
    assert [len(out[0].images), len(out[2].images)] == [1, 1]
    # Every step for those that stay (PNDM runs one more than asked), two for the other.
    assert seen[1] == [1, 2] and seen[0] == seen[2] == list(range(1, len(seen[0]) + 1))
    assert len(seen[0]) >= 6
    assert decodes == [2]  # only the two staying images were decoded


def test_when_every_job_leaves_nothing_is_decoded(tiny_model, decodes):
    jobs = [job_request(seed=1, steps=6), job_request(seed=2, steps=6)]
    with pytest.raises(Interrupted):
        _run(tiny_model, jobs, [lambda s, t: s < 2, lambda s, t: s < 3])
    assert decodes == []


def test_what_may_share_a_batch(tiny_model):
    base = job_request(model="tiny")
    assert compatible(base, job_request(model="tiny", prompt="x", negative_prompt="y", seed=1))
    assert compatible(base, job_request(model="tiny", num_images=3, output_format="jpeg"))
    for field, value in [
        ("guidance_scale", 5.0),
        ("steps", 5),
        ("width", 128),
        ("height", 128),
        ("scheduler", "euler"),
        ("model", "other"),
    ]:
        assert not compatible(base, replace(base, **{field: value})), field
    kind = kind_of(base)
    assert kind.batch_key(replace(base, guidance_scale=7)) == kind.batch_key(
        replace(base, guidance_scale=7.0)
    )
    with pytest.raises(ValueError, match="share"):
        generate(tiny_model, [base, replace(base, steps=9)], on_step=[])


@pytest.fixture(scope="module")
def tiny_xl_pipeline(tiny_pipeline):
    """A tiny random-weight SDXL pipeline: the added text and time conditions are per-row
    tensors of their own, which a job leaving the batch must be cut from too."""
    import torch
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(0)
    tokenizer = tiny_pipeline.tokenizer
    vocab = tokenizer.get_vocab()

    def config():
        return CLIPTextConfig(
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(vocab),
            max_position_embeddings=77,
            projection_dim=32,
        )

    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=64,
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + 32,
    )
    pipeline = StableDiffusionXLPipeline(
        vae=tiny_pipeline.vae,
        text_encoder=CLIPTextModel(config()),
        text_encoder_2=CLIPTextModelWithProjection(config()),
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=tiny_pipeline.scheduler,
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.mark.parametrize("scheduler", ["default", "dpm++"])
def test_sdxl_a_job_that_leaves_is_cut_from_the_added_conditions_too(tiny_xl_pipeline, scheduler):
    model = LoadedModel(tiny_spec(Path("/models/tiny-xl")), tiny_xl_pipeline, "cpu", 0.0)
    jobs = [
        job_request(seed=1, steps=4, scheduler=scheduler),
        job_request(prompt="leaves", seed=2, steps=4, scheduler=scheduler),
        job_request(prompt="stays", negative_prompt="fog", seed=3, steps=4, scheduler=scheduler),
    ]
    whole = _run(model, jobs)
    assert [len(o.images) for o in whole] == [1, 1, 1]
    out = _run(model, jobs, [lambda s, t: True, lambda s, t: s < 2, lambda s, t: True])
    assert out[1] is None and len(out[0].images) == len(out[2].images) == 1
