"""Training smoke tests: a few steps on a tiny data set reduce the loss, and runs resume."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from workers.models import loading
from workers.models.dit import WanDiT
from workers.models.presets import GRIDWORLD, ModelPreset
from workers.models.vae import WanVAE
from workers.training.clips import WORLD_SEED, ClipSpec, frames_to_model, heldout_cell, sample_start, split_rng
from workers.training.dit_train import (
    DiTTrainConfig,
    LatentSet,
    make_optimizer,
    new_dit,
    random_text_encoder,
    train_dit,
    train_step,
    warm_start,
)
from workers.training.grow import block_sources
from workers.training.latents import (
    MOVES,
    LatentSetConfig,
    build_latent_set,
    control_from_dict,
    event_set,
    first_chunk_set,
)
from workers.training.vae_train import (
    VAETrainConfig,
    fold_latent_stats,
    init_for_training,
    measure_latent_stats,
    render_windows,
    train_vae,
)
from workers.world import World

pytestmark = pytest.mark.training

# The embedded preset's geometry with narrower networks, so a few steps take seconds.
SMALL = replace(
    GRIDWORLD,
    dit=replace(GRIDWORLD.dit, dim=32, ffn_dim=64, num_layers=2, num_heads=2),
)


@pytest.fixture(scope="module")
def world() -> World:
    return World.generate(WORLD_SEED)


def test_splits_keep_eval_starts_out_of_training(world: World) -> None:
    for split in ("train", "eval"):
        for i in range(20):
            start = sample_start(split_rng(0, split, i), world, split)  # type: ignore[arg-type]
            row, col = world.map.cell_of(start.position[0], start.position[2])
            assert heldout_cell(row, col) == (split == "eval")
            assert world.is_free(start.position[0], start.position[2], 0.4)


def test_vae_training_reduces_reconstruction_error_and_folds_stats_exactly(world: World, tmp_path: Path) -> None:
    spec = ClipSpec.for_preset(SMALL)
    probe = frames_to_model(render_windows(world, spec, split_rng(1, "eval", 0), 2, 5))[..., :32, :32]
    cfg = VAETrainConfig(
        steps=16,
        image_steps=10,  # then 4 clip steps, the last two on long streams
        image_batch=4,
        image_lr=3e-3,
        full_res_steps=0,
        long_stream_steps=2,  # the last two steps stream 1 + 8·2 frames in segments
        stream_segments=2,
        batch=2,
        crop_px=32,
        lr=3e-4,
        warmup_steps=1,
        checkpoint_every=7,
    )
    torch.manual_seed(cfg.seed)  # what train_vae seeds before building its VAE: the same initial weights
    initial = WanVAE(SMALL.vae)
    init_for_training(initial)
    with torch.no_grad():
        before = F.mse_loss(initial.decode(initial.encode(probe)), probe).item()
    # Train up to the long-stream steps, then resume through them: they change the decoder alone.
    before_long = train_vae(SMALL, world, tmp_path, replace(cfg, steps=14, long_stream_steps=0)).state_dict()
    before_long = {k: v.clone() for k, v in before_long.items()}
    vae = train_vae(SMALL, world, tmp_path, cfg)
    after_long = vae.state_dict()
    encoder_keys = [k for k in after_long if k.startswith(("encoder.", "conv1."))]
    assert encoder_keys and all(torch.equal(before_long[k], after_long[k]) for k in encoder_keys)
    assert not all(torch.equal(before_long[k], after_long[k]) for k in after_long if k.startswith("decoder."))
    with torch.no_grad():
        recon = vae.decode(vae.encode(probe))
        after = F.mse_loss(recon, probe).item()
        assert after < 0.9 * before, (before, after)
        fold_latent_stats(vae, *measure_latent_stats(vae, world, SMALL, seed=0, clips=2))
        latents = vae.encode(probe)
        assert (vae.decode(latents) - recon).abs().max() < 1e-4  # folding is exact
    assert torch.load(tmp_path / "vae.ckpt.pt", weights_only=False)["step"] == 16


def test_initial_vae_is_the_image_model_applied_to_each_group_last_frame(world: World) -> None:
    # Before the clip phase trains the temporal taps, a latent group must be the image latent of the
    # group's last frame, decoded four times: what the image phase learnt carries over to video.
    spec = ClipSpec.for_preset(SMALL)
    video = frames_to_model(render_windows(world, spec, split_rng(2, "eval", 0), 1, 9))[..., :32, :32]
    torch.manual_seed(0)
    vae = WanVAE(SMALL.vae)
    with torch.no_grad():
        for p in vae.parameters():  # non-zero everywhere first, so the test sees what the init zeroes
            p.add_(0.05 * torch.randn_like(p))
        init_for_training(vae)
        latents = vae.encode(video)
        recon = vae.decode(latents)
        for group, last in ((1, 4), (2, 8)):
            image_latent = vae.encode(video[:, :, last : last + 1])
            torch.testing.assert_close(latents[:, :, group], image_latent[:, :, 0], atol=1e-5, rtol=1e-4)
            image_recon = vae.decode(image_latent)[:, :, 0]
            for frame in range(last - 3, last + 1):
                torch.testing.assert_close(recon[:, :, frame], image_recon, atol=1e-5, rtol=1e-4)
        assert recon[:, :, 1:5].std() > 0.01  # not a degenerate (constant) map


def test_camera_path_trains_at_its_own_rate() -> None:
    dit = new_dit(SMALL, 0)
    rest, camera = make_optimizer(dit, DiTTrainConfig(camera_lr_scale=4.0)).param_groups
    name_of = {id(p): n for n, p in dit.named_parameters()}
    camera_names = {name_of[id(p)] for p in camera["params"]}
    assert camera_names == {n for n in name_of.values() if "cam" in n or "c2ws" in n}
    assert len(rest["params"]) + len(camera["params"]) == len(name_of)
    assert (rest["lr_scale"], camera["lr_scale"]) == (1.0, 4.0)


def two_walks(tmp_path: Path) -> LatentSet:
    """Two 2-chunk walks from one start, encoded by a random-weight VAE."""
    torch.manual_seed(0)
    vae_path = tmp_path / "vae.safetensors"
    save_file(WanVAE(SMALL.vae).state_dict(), str(vae_path))
    cfg = LatentSetConfig(starts=1, paths_per_start=2, chunks=2, workers=1)
    return LatentSet.from_data(build_latent_set(SMALL, vae_path, tmp_path / "latents.pt", cfg), SMALL)


def test_dit_training_loss_goes_down_and_resumes(world: World, tmp_path: Path) -> None:
    data = two_walks(tmp_path)
    assert len(data) == 2 and data.batch(torch.tensor([0, 1]))[2].shape[1:3] == (384, 8)

    # Fixed batch and noise: the loss of repeated steps must fall.
    dit = new_dit(SMALL, 0)
    text = [random_text_encoder(SMALL).encode(["", "a walk"])] * 2  # both chunks, each clip its own
    opt = torch.optim.Adam(dit.parameters(), lr=2e-3)
    x0, cond, cams = data.batch(torch.tensor([0, 1]))
    losses = []
    for _ in range(12):
        loss, per_chunk = train_step(dit, SMALL, x0, cond, cams, text, torch.Generator().manual_seed(0), 0.4)
        assert len(per_chunk) == 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses

    # The training loop checkpoints and picks up where it stopped.
    text_encoder = random_text_encoder(SMALL)
    train_dit(SMALL, data, text_encoder, tmp_path, DiTTrainConfig(steps=2, batch=2, checkpoint_every=1))
    resumed = train_dit(SMALL, data, text_encoder, tmp_path, DiTTrainConfig(steps=3, batch=2, checkpoint_every=1))
    state = torch.load(tmp_path / "dit.ckpt.pt", weights_only=False)
    assert state["step"] == 3
    assert [run["steps"] for run in state["history"]] == [[0, 2], [2, 3]]
    assert [run["config"]["steps"] for run in state["history"]] == [2, 3]
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in state["model"].items())


def test_rollout_history_is_the_models_own_sample_not_the_truth(tmp_path: Path) -> None:
    data = two_walks(tmp_path)
    dit = new_dit(SMALL, 0)
    text = [random_text_encoder(SMALL).encode(["", ""])] * 2
    x0, cond, cams = data.batch(torch.tensor([0, 1]))
    chunk = SMALL.chunk_latent_frames
    other_first_chunk = x0.clone()
    other_first_chunk[:, :, :chunk] = x0[:, :, :chunk].flip(0)  # each clip gets the other's first chunk

    def chunk_losses(latents: torch.Tensor, rollout: bool) -> list[float]:
        gen = torch.Generator().manual_seed(3)
        # last_step_prob 0: a teacher-forced history is the truth itself.
        return train_step(dit, SMALL, latents, cond, cams, text, gen, 0.0, rollout)[1]

    with torch.no_grad():
        forced, forced_other = chunk_losses(x0, False), chunk_losses(other_first_chunk, False)
        rolled, rolled_other = chunk_losses(x0, True), chunk_losses(other_first_chunk, True)
    assert rolled[0] == forced[0]  # the first chunk has no history either way
    assert forced_other[1] != forced[1]  # teacher forcing: chunk 1 sees the true chunk 0
    # Rolled out, chunk 1 sees the model's sample of chunk 0, which the true chunk 0 does not enter.
    assert rolled_other[1] == rolled[1] and rolled[1] != forced[1]


def test_a_chunks_prompt_reaches_that_chunk_and_not_the_ones_before(tmp_path: Path) -> None:
    data = two_walks(tmp_path)
    dit = new_dit(SMALL, 0)
    text_encoder = random_text_encoder(SMALL)
    day, snow = text_encoder.encode(["", ""]), text_encoder.encode(["it starts to snow"] * 2)
    x0, cond, cams = data.batch(torch.tensor([0, 1]))

    def chunk_losses(text: list[list[torch.Tensor]]) -> list[float]:
        with torch.no_grad():
            return train_step(dit, SMALL, x0, cond, cams, text, torch.Generator().manual_seed(3), 0.0)[1]

    kept, switched = chunk_losses([day, day]), chunk_losses([day, snow])
    assert switched[0] == kept[0] and switched[1] != kept[1]
    with pytest.raises(ValueError, match="one list per chunk"):
        chunk_losses([day])


@pytest.mark.long
def test_an_event_set_keeps_each_walks_prompt_per_chunk_and_training_reads_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    vae_path = tmp_path / "vae.safetensors"
    save_file(WanVAE(SMALL.vae).state_dict(), str(vae_path))
    data = build_latent_set(SMALL, vae_path, tmp_path / "events.pt", event_set(2, seed=0, workers=1, chunks=2))
    assert len(data["prompts"]) == len(data["latents"]) == 4
    assert all(len(p) == 2 and all(isinstance(t, str) for t in p) for p in data["prompts"])
    events = LatentSet.from_data(data, SMALL)
    walks = LatentSet.from_data(
        build_latent_set(SMALL, vae_path, tmp_path / "walks.pt", LatentSetConfig(starts=1, chunks=2, workers=1)),
        SMALL,
    )
    joined = LatentSet.concat([walks, events])
    assert joined.prompts == [None] * len(walks) + data["prompts"]
    first = LatentSet.first_chunks([joined], SMALL.chunk_latent_frames, SMALL.chunk_latent_frames)
    assert first.prompts == [None] * len(walks) + [p[:1] for p in data["prompts"]]
    cfg = DiTTrainConfig(steps=2, batch=2, first_chunk_share=0.5, checkpoint_every=2)
    train_dit(SMALL, joined, random_text_encoder(SMALL), tmp_path, cfg, first_chunk_data=first)
    assert torch.load(tmp_path / "dit.ckpt.pt", weights_only=False)["step"] == 2


def saved_dit(tmp_path: Path) -> tuple[WanDiT, Path]:
    """A seeded small DiT and the checkpoint directory it was saved into."""
    trained, source = new_dit(SMALL, seed=5), tmp_path / "source"
    (source / loading.DIT_SUBDIR).mkdir(parents=True)
    save_file(trained.state_dict(), str(source / loading.DIT_SUBDIR / "model.safetensors"))
    return trained, source


def test_dit_warm_start_loads_another_checkpoint_and_records_it(tmp_path: Path) -> None:
    data = two_walks(tmp_path)
    trained, source = saved_dit(tmp_path)
    (source / loading.MODEL_CARD).write_text('{"training": {"dit": {"steps": 1234, "wall_s": 5.0}}}')

    fresh = new_dit(SMALL, seed=0)
    record = warm_start(fresh, source)
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in fresh.state_dict().items())
    digest = hashlib.sha256((source / loading.DIT_SUBDIR / "model.safetensors").read_bytes()).hexdigest()
    expected = {"from": str(source), "sha256": digest, "dit_steps": 1234, "dit_wall_s": 5.0, "dit_init": None}
    assert record == expected | {"grown_from_layers": None, "repatched_from": None}

    run = tmp_path / "run"
    text_encoder = random_text_encoder(SMALL)
    one_step = DiTTrainConfig(steps=1, batch=2, lr=1e-12, warmup_steps=1, checkpoint_every=1)
    warm = train_dit(SMALL, data, text_encoder, run, one_step, init_from=source)
    # At a vanishing rate one AdamW step barely moves the weights: they are the source's, not a new init.
    assert all(torch.allclose(v, trained.state_dict()[k], atol=1e-6) for k, v in warm.state_dict().items())
    # A resumed run keeps the record of where its weights came from and ignores a new init_from.
    train_dit(SMALL, data, text_encoder, run, replace(one_step, steps=2), init_from=tmp_path / "elsewhere")
    state = torch.load(run / "dit.ckpt.pt", weights_only=False)
    assert state["step"] == 2 and state["init"] == record


def test_a_deeper_dit_warm_started_from_a_shallower_one_starts_as_it_and_can_learn(tmp_path: Path) -> None:
    data = two_walks(tmp_path)
    trained, source = saved_dit(tmp_path)
    deeper_preset = replace(SMALL, dit=replace(SMALL.dit, num_layers=3))
    deeper = new_dit(deeper_preset, seed=0)
    assert warm_start(deeper, source)["grown_from_layers"] == 2
    assert block_sources(2, 3) == [(0, False), (0, True), (1, False)]
    text = [random_text_encoder(SMALL).encode(["", ""])] * 2
    x0, cond, cams = data.batch(torch.tensor([0, 1]))

    def chunk_losses(dit: WanDiT, preset: ModelPreset) -> tuple[torch.Tensor, list[float]]:
        return train_step(dit, preset, x0, cond, cams, text, torch.Generator().manual_seed(3), 0.4)

    with torch.no_grad():
        shallow = chunk_losses(trained, SMALL)[1]
    loss, deep = chunk_losses(deeper, deeper_preset)
    # The inserted block adds exactly nothing, so the deeper model predicts what the trained one did
    # (to float rounding: its KV cache holds one more layer, the arithmetic is otherwise the same).
    assert deep == pytest.approx(shallow, rel=1e-5)
    loss.backward()
    out = deeper.block_list[1].self_attn.o  # the new block's attention output, zeroed
    assert out.weight.grad is not None and not out.weight.any() and out.weight.grad.abs().sum() > 0  # it can learn


@pytest.mark.long
def test_first_chunk_set_holds_different_single_moves_from_new_starts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    vae_path = tmp_path / "vae.safetensors"
    save_file(WanVAE(SMALL.vae).state_dict(), str(vae_path))
    walks_data = build_latent_set(
        SMALL, vae_path, tmp_path / "walks.pt", LatentSetConfig(starts=2, chunks=2, workers=1)
    )
    moves_data = build_latent_set(SMALL, vae_path, tmp_path / "moves.pt", first_chunk_set(2, seed=0, workers=1))
    chunk = SMALL.chunk_latent_frames
    assert moves_data["latents"].shape[:3] == (8, 16, chunk)
    moves = [tuple(sorted(control_from_dict(c[0]).keys)) for c in moves_data["controls"]]
    assert all(m in {tuple(sorted(k)) for k in MOVES} for m in moves)
    for s in range(2):
        assert len({m for m, start in zip(moves, moves_data["start_of"].tolist(), strict=True) if start == s}) == 4
    # Another stream of starts: none of the walks' start images reappears.
    for cond in moves_data["conds"]:
        assert not any(torch.equal(cond[:, :1], other[:, :1]) for other in walks_data["conds"])

    walks, extra = LatentSet.from_data(walks_data, SMALL), LatentSet.from_data(moves_data, SMALL)
    assert len(extra.cameras) == len(set(moves))  # clips of the same move share one camera input
    first = LatentSet.first_chunks([walks, extra], chunk, chunk)
    assert len(first) == 16 and first.frames == chunk
    for i, (source, j) in enumerate([(walks, n) for n in range(8)] + [(extra, n) for n in range(8)]):
        got, want = first.batch(torch.tensor([i])), source.batch(torch.tensor([j]), chunk)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))

    cfg = DiTTrainConfig(steps=2, batch=2, first_chunk_share=0.5, checkpoint_every=2)
    train_dit(SMALL, walks, random_text_encoder(SMALL), tmp_path, cfg, first_chunk_data=first)
    assert torch.load(tmp_path / "dit.ckpt.pt", weights_only=False)["step"] == 2
