"""Causal DiT training on the encoded walks, run exactly the way inference runs a session.

A step takes a batch of clips of K chunks and walks them chunk by chunk through one KV cache (the
inference cache class, batch = clips): each chunk is noised to one of the few-step sampler's own
timesteps (the only ones inference ever uses), denoised with the history in the cache, and scored
by the error of its x0 prediction (the quantity the sampler keeps, and what PSNR judges); then the
chunk is committed with a t = 0 forward, as inference commits it. Chunk 3 of a 4-chunk clip already
attends through a rolled window (sink + recent frames), so training sees the cache states a long
session reaches.

Exposure bias: inference commits the model's own x0 from its last step, not the truth. With
probability `last_step_prob` a clip's chunk is noised to that last timestep and its prediction
(detached) is committed in place of the true latents, so later chunks learn to continue from the
model's own output, still towards the true continuation. (Other chunks draw their timestep
uniformly, the last one included; those commit the truth.) That prediction starts from the true
chunk lightly noised, so it is nearly the truth; a live session's history is the sampler's whole
chain from noise, and its error grows chunk by chunk (the drift). Rollout steps (`rollout_share`)
train on exactly that history: every chunk but the last is sampled by the model from noise, as
inference samples it, and committed, and each chunk is scored against the truth given it. On the
shipped weights, a rollout's x0 error at chunk 8 of a walk is 3.6x that of a teacher-forced one.
Yet regressing rolled-out chunks to the truth did not help: an 800-step fine-tune of those weights
(8-chunk walks, rollout_share 0.7) scored lower on every world_eval figure (PSNR 1-2 s 20.4 -> 19.0
dB, drift 15.0 -> 14.6 dB), so the shipped weights use none. A teacher-forced fine-tune on the same
data (600 walks, smaller than the shipped run's) also scored lower, so that test does not yet
settle what rollouts are worth.

Conditioning matches inference: the image condition is the stored start-image stream, the camera
is the server's integration of the clip's keys (`CameraTrack`), and the prompt is each chunk's own:
an event set (`latents.event_set`) stores the prompt its walk switched to at each chunk, and the
DiT's cross-attention K/V change with it at that chunk, as a live prompt change makes them; other
clips draw one prompt that names no event (`latents.PROMPTS`, empty included) and keep it.

Camera: the camera path starts as the identity and learns at `camera_lr_scale` × the rate; half the
steps train first chunks only (see `first_chunk_share`), drawn from the walks and from a wider set
of single moves (`latents.first_chunk_set`). Trained on 8 clips (2 starts) alone, the
model learns to tell their paths apart within 100 steps, but on held-out starts the gain from the
true camera over another path's grows slowly (0.5 % → 2 % of the first chunk's loss over 400
first-chunk steps): control is learned last, and most slowly.

Warm start (`init_from`): a DiT trained on another VAE's latents is a far better start than random
weights. Only the latent space changes; what the blocks know of the town, of motion and of the
camera carries over, so the first ~600 steps on the new latents reach the loss a random start
reaches after ~2600. A source with fewer blocks than the preset is deepened with identity blocks
(`workers/training/grow.py`). The checkpoint and the model card record where the weights came from.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workers.models import loading
from workers.models.camera import CameraTrack
from workers.models.components import text_config
from workers.models.dit import ChunkCamera, WanDiT
from workers.models.kv_cache import KVCacheSpec, SessionKVCache
from workers.models.presets import ModelPreset
from workers.models.random_init import init_random_weights
from workers.models.t5 import TextEncoder, UMT5Encoder
from workers.models.tokenizer import load_tokenizer
from workers.stages.denoise import make_sampler, noise_generator
from workers.training import checkpoint
from workers.training.grow import load_grown
from workers.training.latents import PROMPTS, control_from_dict
from workers.training.progress import Progress
from workers.training.repatch import repatch, source_patch
from workers.training.resume_point import ResumePoint
from workers.training.vae_train import lr_at

TEXT_ENCODER_SEED = 2  # the small umT5 keeps seeded random weights; the DiT learns what its output names


@dataclass(frozen=True)
class DiTTrainConfig:
    steps: int = 18500
    batch: int = 8
    lr: float = 4e-4
    # The camera path (Plücker embedding, injector and per-block scale/shift) starts at the identity
    # and carries a weak signal at first; at the base rate it was still barely used after 1500 steps.
    camera_lr_scale: float = 4.0
    warmup_steps: int = 100
    last_step_prob: float = 0.4  # how often a chunk is noised to the sampler's last timestep
    # Share of whole-clip steps that roll out (see `train_step`): every chunk but the last is then
    # committed as inference commits it, from the sampler's whole chain started at noise.
    rollout_share: float = 0.0
    # Share of steps that train only the clips' first chunk, at twice the batch. The first chunk is
    # where a session starts from a real image and where the camera must take the view somewhere;
    # it costs a quarter of a clip, so these steps see 2× the clips at about half the cost.
    first_chunk_share: float = 0.5
    # What those steps train: the clips' first latent frames, at least this many (whole chunks), so
    # that they always see the view taken somewhere: one chunk of 4 latent frames, or four of a
    # preset whose chunk is one latent frame (its first chunk is the start image alone).
    first_span_latent_frames: int = 4
    # Autocast matmuls to bf16 (fp32 master weights); None: where it is fast (`bf16_is_fast`). It is
    # 1.8× faster on AVX-512 CPUs, and 10-14× SLOWER on CPUs without AVX-512 (an AVX2 AMD EPYC: a
    # 4-chunk step 25 s against 2.5 s in float32), where PyTorch emulates bf16 arithmetic.
    bf16: bool | None = None
    checkpoint_every: int = 100
    seed: int = 0


class LatentSet:
    """Encoded clips plus their camera inputs (computed once, kept in float16).

    A camera input depends only on the clip's controls, and many clips share them (a set of single
    moves has a dozen different ones in thousands of clips), so each distinct input is kept once.
    """

    def __init__(
        self,
        latents: torch.Tensor,
        conds: torch.Tensor,
        start_of: torch.Tensor,
        cameras: torch.Tensor,
        camera_of: torch.Tensor,
        prompts: list[tuple[str, ...] | None] | None = None,
    ) -> None:
        self.latents = latents  # [N, 16, F, h, w]
        self.conds = conds  # [S, 20, F, h, w], one per start
        self.start_of = start_of  # [N], each clip's start
        self.cameras = cameras  # [U, 384, F, h, w], the distinct camera inputs
        self.camera_of = camera_of  # [N], each clip's camera input
        # [N]: each clip's prompt per chunk, or None where the clip keeps none (drawn in training)
        self.prompts = prompts if prompts is not None else [None] * len(latents)

    @staticmethod
    def from_data(data: dict, preset: ModelPreset) -> LatentSet:
        """From a `build_latent_set` file, computing the camera input by the server's integration."""
        chunk = preset.chunk_latent_frames
        index: dict[str, int] = {}
        cams: list[torch.Tensor] = []
        camera_of: list[int] = []
        for controls in data["controls"]:
            key = json.dumps(controls, sort_keys=True)
            if key not in index:
                index[key] = len(cams)
                track = CameraTrack.for_preset(preset)
                cams.append(torch.cat([track.next_chunk(control_from_dict(c), chunk) for c in controls], dim=1).half())
            camera_of.append(index[key])
        prompts: list[tuple[str, ...] | None] | None = None
        if data.get("prompts"):  # an event set's walks: each chunk's prompt
            prompts = [tuple(p) for p in data["prompts"]]
        return LatentSet(
            data["latents"], data["conds"], data["start_of"], torch.stack(cams), torch.tensor(camera_of), prompts
        )

    @staticmethod
    def concat(sets: list[LatentSet]) -> LatentSet:
        """All clips of `sets`, which must be of the same length, as one set."""
        if len({s.frames for s in sets}) > 1:
            raise ValueError(f"sets of different lengths: {[s.frames for s in sets]} latent frames")
        return LatentSet._join(sets, None, None)

    @staticmethod
    def first_chunks(sets: list[LatentSet], frames: int, chunk: int) -> LatentSet:
        """All clips of `sets`, cut to their first `frames` latent frames (whole chunks of `chunk`), as
        one set."""
        return LatentSet._join(sets, frames, frames // chunk)

    @staticmethod
    def _join(sets: list[LatentSet], frames: int | None, chunks: int | None) -> LatentSet:
        def offsets(counts: list[int]) -> list[int]:
            return np.cumsum([0, *counts[:-1]]).tolist()

        start_offsets = offsets([len(s.conds) for s in sets])
        camera_offsets = offsets([len(s.cameras) for s in sets])
        cut = slice(0, frames)
        return LatentSet(
            torch.cat([s.latents[:, :, cut] for s in sets]),
            torch.cat([s.conds[:, :, cut] for s in sets]),
            torch.cat([s.start_of + o for s, o in zip(sets, start_offsets, strict=True)]),
            torch.cat([s.cameras[:, :, cut] for s in sets]),
            torch.cat([s.camera_of + o for s, o in zip(sets, camera_offsets, strict=True)]),
            [p if p is None else p[:chunks] for s in sets for p in s.prompts],
        )

    def __len__(self) -> int:
        return len(self.latents)

    @property
    def frames(self) -> int:
        return self.latents.shape[2]

    def batch(self, idx: torch.Tensor, frames: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Clips `idx` as float32, cut to their first `frames` latent frames (default: all)."""
        f = slice(0, frames)
        latents, conds = self.latents[idx][:, :, f], self.conds[self.start_of[idx]][:, :, f]
        return latents.float(), conds.float(), self.cameras[self.camera_of[idx]][:, :, f].float()


def first_span_frames(preset: ModelPreset, cfg: DiTTrainConfig) -> int:
    """The latent frames a first-chunk step trains: whole chunks, at least `first_span_latent_frames`."""
    chunk = preset.chunk_latent_frames
    return chunk * max(1, -(-cfg.first_span_latent_frames // chunk))


def random_text_encoder(preset: ModelPreset) -> TextEncoder:
    model = UMT5Encoder(text_config(preset))
    init_random_weights(model, TEXT_ENCODER_SEED)
    return TextEncoder(model, load_tokenizer(text_config(preset), None))


def new_dit(preset: ModelPreset, seed: int) -> WanDiT:
    """PyTorch's default initialisation, with each block's camera scale/shift starting at zero so the
    camera path starts as the identity (as when camera layers are added to a pretrained model)."""
    torch.manual_seed(seed)
    dit = WanDiT(preset.dit)
    with torch.no_grad():
        for block in dit.block_list:
            for layer in (block.cam_scale_layer, block.cam_shift_layer):
                layer.weight.zero_()
                layer.bias.zero_()
    return dit


def warm_start(dit: WanDiT, checkpoint_dir: Path) -> dict:
    """Load another checkpoint's DiT weights into `dit` (strict keys and shapes, after deepening and
    repatching: a source with fewer blocks or another patch size is adapted, see grow.py and
    repatch.py); return
    the record the checkpoint keeps: the source, the digest of its weights (the source may later be
    overwritten, e.g. by installing the new weights over the bundled ones) and, from its model card,
    how it was trained."""
    trained = loading.read_dit_state(checkpoint_dir, "cpu")
    patch = source_patch(trained)
    trained_layers = load_grown(dit, repatch(trained, dit))
    digest = hashlib.sha256()
    for shard in loading.dit_shards(checkpoint_dir):
        digest.update(shard.read_bytes())
    card_path = checkpoint_dir / loading.MODEL_CARD
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    source = card.get("training", {}).get("dit", {})
    return {
        "from": str(checkpoint_dir),
        "sha256": digest.hexdigest(),
        "dit_steps": source.get("steps"),
        "dit_wall_s": source.get("wall_s"),
        "dit_init": source.get("init"),
        # A shallower source was deepened with identity blocks (workers/training/grow.py).
        "grown_from_layers": trained_layers if trained_layers != len(dit.blocks) else None,
        # A source of another patch size lent all but its latent-space layers (workers/training/repatch.py).
        "repatched_from": [1, patch, patch] if patch != dit.cfg.patch_size[1] else None,
    }


def is_camera_param(name: str) -> bool:
    return name.startswith(("patch_embedding_wancamctrl", "c2ws_hidden_states")) or ".cam_" in name


def make_optimizer(dit: WanDiT, cfg: DiTTrainConfig) -> torch.optim.AdamW:
    """AdamW with two groups, the rest and the camera path; each group's `lr_scale` multiplies the
    scheduled rate."""
    named = list(dit.named_parameters())
    groups = [
        {"params": [p for n, p in named if not is_camera_param(n)], "lr_scale": 1.0},
        {"params": [p for n, p in named if is_camera_param(n)], "lr_scale": cfg.camera_lr_scale},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.01)


def _velocity(
    dit: WanDiT,
    cond: torch.Tensor,
    text_kv: list[tuple[torch.Tensor, torch.Tensor]],
    camera: ChunkCamera,
    start_frame: int,
    cache: SessionKVCache,
    x_t: torch.Tensor,
    t: torch.Tensor,
) -> torch.Tensor:
    """The sampler's model call for one chunk of a batch: an uncommitted forward at timestep `t`."""
    return dit(x_t, cond, t.expand(x_t.shape[0]), text_kv, camera, start_frame, cache, commit=False)


def train_step(
    dit: WanDiT,
    preset: ModelPreset,
    x0: torch.Tensor,  # [B, 16, F, h, w]
    cond: torch.Tensor,  # [B, 20, F, h, w]
    cams: torch.Tensor,  # [B, 384, F, h, w]
    text: list[list[torch.Tensor]],
    gen: torch.Generator,
    last_step_prob: float,
    rollout: bool = False,
) -> tuple[torch.Tensor, list[float]]:
    """One clip batch through the causal chunk loop; returns the loss and per-chunk x0 MSE.

    `text[k]`: chunk k's prompt embeddings, one per clip; the cross-attention K/V are computed anew
    where the list is not the previous chunk's (pass the same list while no prompt changes).

    `rollout`: each chunk but the last is committed as the model's own sample, drawn with the
    inference sampler from noise (no gradient), so every later chunk is scored against the truth
    from a history the model made itself, as in a live session. Teacher-forced histories (the
    default) never show the model its own accumulated error, which is what drift is.
    """
    cfg, chunk = preset.dit, preset.chunk_latent_frames
    sampler = make_sampler(preset)
    schedule = sampler.schedule
    b, _, frames = x0.shape[:3]
    spec = KVCacheSpec.for_dit(cfg, preset.tokens_per_latent_frame, chunk, batch=b)
    device = x0.device
    cache = SessionKVCache(spec, torch.float32, device)
    if len(text) != frames // chunk:
        raise ValueError(f"text: one list per chunk ({frames // chunk}), got {len(text)}")
    steps = len(schedule.timesteps)
    total = x0.new_zeros(())
    per_chunk = []
    for k in range(frames // chunk):
        sl = slice(k * chunk, (k + 1) * chunk)
        clean, c = x0[:, :, sl], cond[:, :, sl]
        if k == 0 or text[k] is not text[k - 1]:
            text_kv = dit.text_kv([e.to(device) for e in text[k]])
        # Drawn on the CPU generator whatever the device, so a seed means the same draws everywhere.
        last = torch.rand(b, generator=gen) < last_step_prob
        idx = torch.where(last, steps - 1, torch.randint(0, steps, (b,), generator=gen))
        sigma = schedule.sigmas[idx].view(b, 1, 1, 1, 1).to(device)
        noise = torch.randn(clean.shape, generator=gen).to(device)
        x_t = (1 - sigma) * clean + sigma * noise
        camera = dit.chunk_camera(cams[:, :, sl])
        v = dit(x_t, c, schedule.timesteps[idx].to(device), text_kv, camera, k * chunk, cache, commit=False)
        pred = x_t - sigma * v
        mse = (pred - clean).pow(2).mean()
        total = total + mse
        per_chunk.append(mse.item())
        if k + 1 == frames // chunk:
            break  # nothing attends to the last chunk's commit
        cache.detach_()  # the staged K/V are saved for backward: commit into fresh buffers
        with torch.no_grad():
            if rollout:
                # The sampler draws its re-noising on the device: seed a device generator from `gen`.
                chain = noise_generator(device, int(torch.randint(2**62, (1,), generator=gen)))
                start = torch.randn(clean.shape, generator=gen).to(device)
                committed = sampler.sample(
                    start,
                    functools.partial(_velocity, dit, c, text_kv, camera, k * chunk, cache),
                    chain,
                )
            else:
                committed = torch.where(last.view(b, 1, 1, 1, 1).to(device), pred.detach(), clean)
            dit(committed, c, torch.zeros(b, device=device), text_kv, camera, k * chunk, cache, commit=True)
    return total / (frames // chunk), per_chunk


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bf16 autocast speeds training up on `device`: on a GPU, and on CPUs with AVX-512."""
    return device.type != "cpu" or torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _batch_text(
    source: LatentSet, idx: torch.Tensor, chunks: int, rng: np.random.Generator, embedding: dict[str, torch.Tensor]
) -> list[list[torch.Tensor]]:
    """Each chunk's prompt embeddings for the clips `idx`: a clip's own prompts where it keeps them,
    else one drawn from `PROMPTS` for the whole clip (drawn for every clip, so the draws do not depend
    on which clips keep prompts)."""
    drawn = [PROMPTS[int(i)] for i in rng.integers(0, len(PROMPTS), len(idx))]
    own = [source.prompts[int(i)] for i in idx]
    per_chunk = [[p[k] if p is not None else d for p, d in zip(own, drawn, strict=True)] for k in range(chunks)]
    lists: list[list[torch.Tensor]] = []
    for k, texts in enumerate(per_chunk):
        same = k > 0 and texts == per_chunk[k - 1]
        lists.append(lists[-1] if same else [embedding[t] for t in texts])
    return lists


def train_dit(
    preset: ModelPreset,
    data: LatentSet,
    text_encoder: TextEncoder,
    out_dir: Path,
    cfg: DiTTrainConfig,
    device: torch.device | None = None,
    first_chunk_data: LatentSet | None = None,
    init_from: Path | None = None,
    keep: ResumePoint | None = None,
) -> WanDiT:
    """Train on `data`; the first-chunk steps draw from `first_chunk_data` when given (clips of at
    least one chunk, e.g. `LatentSet.first_chunks` of `data` and a `first_chunk_set`). A new run
    starts from `init_from`'s DiT weights when given; a resumed one ignores it. With `keep`, each
    checkpoint is also written there compactly (`resume_point.py`)."""
    device = device or torch.device("cpu")
    first_data = data if first_chunk_data is None else first_chunk_data
    dit = new_dit(preset, cfg.seed)
    path = out_dir / "dit.ckpt.pt"
    # A warm start only seeds a new run: a resumed run's checkpoint holds its weights and its record.
    resuming = path.is_file() or (keep is not None and keep.step("dit") is not None)
    init = warm_start(dit, init_from) if init_from is not None and not resuming else None
    dit = dit.to(device).train()
    opt = make_optimizer(dit, cfg)
    state = checkpoint.resume_run(path, "dit", dit, opt, keep)
    if state is not None:
        init = state.get("init")
    elif init is not None:
        print(f"[dit] warm start from {init_from} ({init['dit_steps']} steps there)", flush=True)
    step = start_step = state["step"] if state else 0
    wall_s = state.get("wall_s", 0.0) if state else 0.0
    t_run = time.perf_counter()
    kept = {text for clip in (*data.prompts, *first_data.prompts) if clip is not None for text in clip}
    pool = list(dict.fromkeys((*PROMPTS, *sorted(kept))))  # every prompt a step can draw or read
    embedding = dict(zip(pool, text_encoder.encode(pool), strict=True))
    progress = Progress("dit", cfg.steps, start=step, every=20)
    bf16 = bf16_is_fast(device) if cfg.bf16 is None else cfg.bf16
    print(f"[dit] matmuls in {'bf16' if bf16 else 'float32'} on {device}", flush=True)
    while step < cfg.steps:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rng = np.random.default_rng([cfg.seed, step])
        first_only = rng.random() < cfg.first_chunk_share
        rollout = not first_only and rng.random() < cfg.rollout_share
        source = first_data if first_only else data
        batch = min(2 * cfg.batch, len(source)) if first_only else cfg.batch
        frames = first_span_frames(preset, cfg) if first_only else data.frames
        idx = torch.from_numpy(rng.choice(len(source), batch, replace=False))
        x0, cond, cams = (t.to(device) for t in source.batch(idx, frames))
        text = _batch_text(source, idx, frames // preset.chunk_latent_frames, rng, embedding)
        for group in opt.param_groups:
            group["lr"] = group["lr_scale"] * lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, per_chunk = train_step(dit, preset, x0, cond, cams, text, gen, cfg.last_step_prob, rollout)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dit.parameters(), 1.0)
        opt.step()
        step += 1
        # Rolled-out chunks report as r0, r1, ...: their error is the drift a live session sees.
        prefix = "r" if rollout else "c"
        metrics = {"loss": loss.item()} | {f"{prefix}{k}": m for k, m in enumerate(per_chunk)}
        progress.update(step, **metrics)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"DiT loss is {loss.item()} at step {step}")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps or checkpoint.stop_requested():
            run_s = time.perf_counter() - t_run
            runs = checkpoint.history(state, start_step, step, cfg, run_s)
            checkpoint.save_run(path, "dit", step, dit, opt, keep, wall_s=wall_s + run_s, history=runs, init=init)
    return dit.eval()
