"""Train the embedded `gridworld` preset from scratch, resumably:

    python -m workers.training                      # all phases into runs/train/gridworld
    python -m workers.training --phase vae          # one phase
    python -m workers.training --install            # ... then copy the weights into the package
    python -m workers.training --phase decoder --decoder-steps 600 --install   # a tuned decoder alone
    python -m workers.training --dit-init bundled   # the DiT starts from the installed weights' DiT
    python -m workers.training --vae-init bundled   # keep the installed VAE (fine-tune the DiT only)

Phases run in order; each resumes from its checkpoint, and skips itself when its output exists
(delete that file to redo it):
  vae      train the VAE on rendered frames, then clips -> vae.ckpt.pt, vae.safetensors (+ vae.json)
           (or, with --vae-init, copy another checkpoint's VAE and its training record)
  decoder  with --decoder-steps N: tune the finished VAE's decoder, its encoder frozen
           (workers/training/decoder_tune.py) -> decoder.ckpt.pt, then vae.safetensors in place
  latents  render and encode the DiT's clips -> latents.pt
  events   walks whose prompt switches mid-walk to an event (night, snow, fog, dusk) -> events.pt
  moves    many more starts, one chunk each of single moves -> moves.pt (the DiT's first-chunk steps)
  dit      train the causal DiT on the walks (latents.pt and events.pt) -> dit.ckpt.pt
  export   weights + model card              -> weights/  (the layout the strict loader reads)
A set given 0 starts (--starts, --event-starts, --move-starts) is not built and not used, e.g. a
fine-tune on events alone: --vae-init bundled --dit-init bundled --starts 0 --move-starts 0.
Seeds fix everything: the world, the clips, the initialisations and the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from workers.models import loading
from workers.models.presets import PRESETS, ModelPreset, get_preset
from workers.models.vae import WanVAE
from workers.training import checkpoint
from workers.training.clips import WORLD_SEED
from workers.training.decoder_tune import PHASE as DECODER_PHASE
from workers.training.decoder_tune import DecoderTuneConfig, tune_decoder
from workers.training.dit_train import (
    DiTTrainConfig,
    LatentSet,
    first_span_frames,
    make_optimizer,
    new_dit,
    random_text_encoder,
    train_dit,
)
from workers.training.export import hardware, install, save_module, write_checkpoint
from workers.training.latents import (
    EVENT_STARTS,
    MOVE_STARTS,
    LatentSetConfig,
    build_latent_set,
    event_set,
    first_chunk_set,
)
from workers.training.resume_point import ResumePoint
from workers.training.vae_train import VAETrainConfig, fold_latent_stats, measure_latent_stats, train_vae
from workers.world import EVENT_PROMPTS, World, WorldEvent

# The decoder phase comes before anything that loads the VAE: a preset whose decoder changed shape
# (decoder_full_res_kernel_t) needs it before its VAE file loads.
PHASES = ("vae", "decoder", "latents", "events", "moves", "dit", "export")
WALK_SETS = ("latents", "events")  # the DiT's whole-walk steps draw from these (those built)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m workers.training",
        description="Train the embedded gridworld preset (see the module docstring for the phases).",
    )
    p.add_argument("--out", type=Path, default=None, help="work directory (default runs/train/<preset>)")
    p.add_argument("--preset", default="gridworld")
    p.add_argument("--phase", choices=(*PHASES, "all"), default="all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vae-steps", type=int, default=VAETrainConfig.steps, help="image steps, then clip steps")
    p.add_argument(
        "--vae-image-steps",
        type=int,
        default=VAETrainConfig.image_steps,
        help="the VAE's first steps, on single frames (shorter runs keep the default share)",
    )
    p.add_argument(
        "--vae-long-stream-steps",
        type=int,
        default=VAETrainConfig.long_stream_steps,
        help="the VAE's last steps on long streams (truncated backpropagation through its caches)",
    )
    p.add_argument(
        "--vae-init",
        default=None,
        help="take the VAE from this checkpoint directory ('bundled': the installed preset's) instead of "
        "training one; its model card's VAE record carries over",
    )
    p.add_argument(
        "--decoder-steps",
        type=int,
        default=DecoderTuneConfig.steps,
        help="decoder-only steps on the finished VAE (its encoder, so the latents, stay as they are)",
    )
    p.add_argument("--dit-steps", type=int, default=DiTTrainConfig.steps)
    p.add_argument("--dit-batch", type=int, default=DiTTrainConfig.batch)
    p.add_argument("--dit-lr", type=float, default=DiTTrainConfig.lr, help="peak learning rate")
    p.add_argument("--last-step-prob", type=float, default=DiTTrainConfig.last_step_prob)
    p.add_argument(
        "--rollout-share",
        type=float,
        default=DiTTrainConfig.rollout_share,
        help="share of whole-clip steps whose history is the model's own samples",
    )
    p.add_argument(
        "--dit-init",
        default=None,
        help="start a new DiT run from this checkpoint directory's DiT weights ('bundled': the installed "
        "preset's; a preset's name: the weights it ships; a shallower DiT is deepened with blocks that start "
        "as the identity, and one of another patch size keeps all but its patch embedding and head); the "
        "default is random weights",
    )
    p.add_argument("--starts", type=int, default=LatentSetConfig.starts, help="start poses in the DiT data set")
    p.add_argument("--chunks", type=int, default=LatentSetConfig.chunks, help="chunks per walk in the DiT data set")
    p.add_argument(
        "--event-starts",
        type=int,
        default=EVENT_STARTS,
        help="start poses (2 walks each) whose prompt switches to an event mid-walk",
    )
    p.add_argument(
        "--move-starts", type=int, default=MOVE_STARTS, help="start poses in the first-chunk set of single moves"
    )
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes encoding latents")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads for training")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="training device")
    p.add_argument(
        "--install",
        action="store_true",
        help="copy the exported weights into the package (with --phase decoder: the tuned VAE alone, beside "
        "the installed DiT)",
    )
    p.add_argument(
        "--resume-point",
        default=None,
        help="directory of the compact state committed to the repository (default "
        "workers/training/resume/<preset>; 'none': keep no resume point); see workers/training/resume_point.py",
    )
    args = p.parse_args(argv)
    args.out = args.out or Path("runs/train") / args.preset
    if args.resume_point == "none":
        args.keep = None
    else:
        args.keep = ResumePoint(Path(args.resume_point)) if args.resume_point else ResumePoint.for_preset(args.preset)
    return args


def _vae_config(args: argparse.Namespace) -> VAETrainConfig:
    # Shorter runs (smoke tests) keep the phases' proportions.
    default = VAETrainConfig()
    image = min(args.vae_image_steps, args.vae_steps * default.image_steps // default.steps)
    clips = args.vae_steps - image
    return VAETrainConfig(
        steps=args.vae_steps,
        image_steps=image,
        full_res_steps=min(default.full_res_steps, clips // 6),
        short_clip_steps=min(default.short_clip_steps, clips // 4),
        long_stream_steps=min(args.vae_long_stream_steps, clips // 4),
        seed=args.seed,
    )


def phase_vae(args: argparse.Namespace, preset: ModelPreset, world: World) -> None:
    final = args.out / "vae.safetensors"
    if final.is_file():
        print(f"[vae] {final} exists, skipping", flush=True)
        return
    if args.keep is not None and args.keep.restore_finished_vae(args.out):
        print(f"[vae] finished VAE copied from the resume point in {args.keep.directory}", flush=True)
        return
    if args.vae_init is not None:
        _copy_vae(_init_dir("--vae-init", args.vae_init, preset), args.out)
        return
    cfg = _vae_config(args)
    vae = train_vae(preset, world, args.out, cfg, torch.device(args.device), args.keep)
    stats = fold_latent_stats(vae, *measure_latent_stats(vae, world, preset, args.seed))
    save_file({k: v.detach().cpu().contiguous() for k, v in vae.state_dict().items()}, str(final))
    state = torch.load(args.out / "vae.ckpt.pt", weights_only=False)
    info = {
        "config": asdict(cfg),
        "wall_s": state.get("wall_s"),
        "history": state.get("history", []),
        "latent_stats_folded": stats,
    }
    (args.out / "vae.json").write_text(json.dumps(info, indent=2))
    if args.keep is not None:
        args.keep.finish_vae(args.out)


def phase_decoder(args: argparse.Namespace, preset: ModelPreset, world: World) -> None:
    cfg = DecoderTuneConfig(steps=args.decoder_steps, seed=args.seed)
    info_file = args.out / "vae.json"
    info = json.loads(info_file.read_text())
    done = info.get("decoder", {}).get("steps", 0)
    if cfg.steps <= done:
        if cfg.steps:
            print(f"[decoder] the VAE's decoder is tuned ({done} steps), skipping", flush=True)
        return
    vae = tune_decoder(preset, world, args.out, cfg, torch.device(args.device), args.keep)
    state = torch.load(args.out / f"{DECODER_PHASE}.ckpt.pt", weights_only=False)
    tmp = args.out / "vae.safetensors.tmp"
    save_file({k: v.detach().cpu().contiguous() for k, v in vae.state_dict().items()}, str(tmp))
    os.replace(tmp, args.out / "vae.safetensors")
    info["decoder"] = {"steps": cfg.steps, "wall_s": state.get("wall_s"), "history": state.get("history", [])}
    info_file.write_text(json.dumps(info, indent=2))
    if args.keep is not None:
        args.keep.finish_vae(args.out)
        args.keep.drop(DECODER_PHASE)
    print(f"[decoder] tuned for {cfg.steps} steps: {args.out / 'vae.safetensors'}", flush=True)


def _copy_vae(source: Path, out: Path) -> None:
    """Another checkpoint's VAE (latent statistics already folded) and, from its model card, the
    record of how it was trained, as the vae phase would have written them."""
    card = json.loads((source / loading.MODEL_CARD).read_text())
    record = card["training"]["vae"]
    info = {
        "config": record["history"][-1]["config"],
        "wall_s": record["wall_s"],
        "history": record["history"],
        "from": str(source),
    } | ({"decoder": record["decoder"]} if "decoder" in record else {})
    shutil.copyfile(source / loading.VAE_SAFETENSORS, out / "vae.safetensors")
    (out / "vae.json").write_text(json.dumps(info, indent=2))
    print(f"[vae] copied from {source}", flush=True)


def load_trained_vae(out: Path, preset: ModelPreset) -> WanVAE:
    vae = WanVAE(preset.vae)
    try:
        vae.load_state_dict(load_file(str(out / "vae.safetensors")), strict=True)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{out / 'vae.safetensors'} does not fit {preset.name}'s VAE (a decoder of another shape is "
            "tuned into it by the decoder phase: --decoder-steps N)"
        ) from exc
    return vae.eval().requires_grad_(False)


def _build_set(args: argparse.Namespace, preset: ModelPreset, name: str, cfg: LatentSetConfig) -> None:
    final = args.out / f"{name}.pt"
    if cfg.starts == 0:
        print(f"[{name}] 0 starts: not built", flush=True)
        return
    if final.is_file():
        print(f"[{name}] {final} exists, skipping", flush=True)
        return
    build_latent_set(preset, args.out / "vae.safetensors", final, cfg, args.device)


def phase_latents(args: argparse.Namespace, preset: ModelPreset) -> None:
    cfg = LatentSetConfig(starts=args.starts, chunks=args.chunks, seed=args.seed, workers=args.workers)
    _build_set(args, preset, "latents", cfg)


def phase_events(args: argparse.Namespace, preset: ModelPreset) -> None:
    _build_set(args, preset, "events", event_set(args.event_starts, args.seed, args.workers, args.chunks))


def phase_moves(args: argparse.Namespace, preset: ModelPreset) -> None:
    chunks = first_span_frames(preset, _dit_config(args)) // preset.chunk_latent_frames
    _build_set(args, preset, "moves", first_chunk_set(args.move_starts, args.seed, args.workers, chunks))


def _dit_config(args: argparse.Namespace) -> DiTTrainConfig:
    return DiTTrainConfig(
        steps=args.dit_steps,
        batch=args.dit_batch,
        lr=args.dit_lr,
        last_step_prob=args.last_step_prob,
        rollout_share=args.rollout_share,
        seed=args.seed,
    )


def _init_dir(flag: str, value: str, preset: ModelPreset) -> Path:
    """A checkpoint directory to start from: a path, 'bundled' for the installed preset's, or another
    preset's name for the weights it ships."""
    if value != "bundled" and value not in PRESETS:
        return Path(value)
    source = preset if value == "bundled" else PRESETS[value]
    bundled = loading.checkpoint_dir_for(source, None)
    if bundled is None:
        raise SystemExit(f"{flag} {value}: preset {source.name!r} ships no weights")
    return bundled


def _load_set(args: argparse.Namespace, preset: ModelPreset, name: str) -> LatentSet | None:
    path = args.out / f"{name}.pt"
    return LatentSet.from_data(torch.load(path, weights_only=False), preset) if path.is_file() else None


def phase_dit(args: argparse.Namespace, preset: ModelPreset) -> None:
    walks = {name: s for name in WALK_SETS if (s := _load_set(args, preset, name)) is not None}
    if not walks:
        raise FileNotFoundError(f"no walks in {args.out} ({', '.join(f'{n}.pt' for n in WALK_SETS)})")
    data = LatentSet.concat(list(walks.values()))
    moves = _load_set(args, preset, "moves")
    span = first_span_frames(preset, _dit_config(args))
    first = LatentSet.first_chunks([data, *([moves] if moves else [])], span, preset.chunk_latent_frames)
    counts = ", ".join(f"{len(s)} from {name}.pt" for name, s in walks.items())
    print(f"[dit] {len(data)} walks ({counts}); first-chunk steps draw from {len(first)} clips", flush=True)
    text = random_text_encoder(preset)
    init = None if args.dit_init is None else _init_dir("--dit-init", args.dit_init, preset)
    train_dit(preset, data, text, args.out, _dit_config(args), torch.device(args.device), first, init, args.keep)


def phase_export(args: argparse.Namespace, preset: ModelPreset) -> Path:
    dit = new_dit(preset, args.seed)
    dit_state = checkpoint.resume(args.out / "dit.ckpt.pt", dit)
    if dit_state is None and args.keep is not None:  # a fresh clone: the committed (float16) weights
        dit_state = args.keep.load("dit", dit, make_optimizer(dit, _dit_config(args)))
    if dit_state is None:
        raise FileNotFoundError(f"no DiT checkpoint in {args.out}; run the dit phase first")
    vae_info = json.loads((args.out / "vae.json").read_text())
    sets = {
        name: torch.load(args.out / f"{name}.pt", weights_only=False)
        for name in (*WALK_SETS, "moves")
        if (args.out / f"{name}.pt").is_file()
    }
    card = {
        "preset": preset.name,
        "architecture": "Wan2.1 DiT with LingBot-World camera layers, Wan2.1 causal VAE, umT5 (small widths)",
        "resolution": [preset.width_px, preset.height_px],
        "fps": preset.fps,
        "chunk_latent_frames": preset.chunk_latent_frames,
        "params": {
            "dit": sum(p.numel() for p in dit.parameters()),
            "vae": sum(p.numel() for p in WanVAE(preset.vae).parameters()),
        },
        "world": {"generator": "workers.world", "seed": WORLD_SEED},
        "data": {
            "vae": _vae_data(vae_info),
            "dit": "; ".join(_set_data(name, data) for name, data in sets.items()),
            "held_out": "evaluation starts lie only in held-out cells; evaluation paths use their own seeds",
        },
        "training": {
            "vae": _vae_training(vae_info),
            "latents": {f"{name}_wall_s": data["wall_s"] for name, data in sets.items()},
            "dit": {
                "steps": dit_state["step"],
                "wall_s": dit_state.get("wall_s"),
                "history": dit_state.get("history", []),
                "init": dit_state.get("init"),
            },
        },
        # What the page's chips offer and /v1/model lists: each event and the prompt that names it
        # (the day's is empty: no prompt brings the day back).
        "events": {e.value: EVENT_PROMPTS[e][0] for e in WorldEvent} if "events" in sets else {},
        "hardware": hardware(),
        "text": "the text encoder keeps seeded random weights; the DiT learned the prompts that name events "
        "(workers/world/events.py) from walks whose prompt switches mid-walk"
        if "events" in sets
        else "the text encoder keeps seeded random weights; prompts do not steer this world",
        "evaluation": "run `python -m benchmarks.world_eval --out EVAL.json`",
    }
    out = args.out / "weights"
    write_checkpoint(out, dit, load_trained_vae(args.out, preset), random_text_encoder(preset).encoder, card)
    print(f"[export] wrote {out}", flush=True)
    return out


def _set_data(name: str, data: dict) -> str:
    cfg = data["config"]
    clips, starts, paths = len(data["latents"]), cfg["starts"], cfg["paths_per_start"]
    if name == "moves":
        return f"first-chunk steps add {clips} one-chunk clips of single moves from {starts} starts ({paths} each)"
    what = "walks whose prompt switches to an event (night, snow, fog, dusk) mid-walk" if cfg.get("events") else "walks"
    return f"{clips} {what} of {cfg['chunks']} chunks from {starts} train-split starts ({paths} paths each)"


def _vae_data(vae_info: dict) -> str:
    """The model card's account of the VAE's training data, the decoder phase's included."""
    vae = vae_info["config"]
    image_steps = vae.get("image_steps", 0)  # VAEs trained before the image phase existed have none
    text = (
        "rendered on the fly from the train split; "
        f"{image_steps} steps × {vae.get('image_batch', 0)} single frames, then "
        f"{vae['steps'] - image_steps} steps × {vae['batch']} clips × {vae['clip_frames']} frames"
    )
    if vae["long_stream_steps"]:
        text += (
            f", the last {vae['long_stream_steps']} on streams of 1 + 8·{vae['stream_segments']} frames (decoder only)"
        )
    if "decoder" in vae_info:
        cfg = vae_info["decoder"]["history"][-1]["config"]
        clips = f"{cfg['batch']} clips × {cfg['clip_frames']} frames"
        text += f"; then {vae_info['decoder']['steps']} decoder-only steps × {clips}"
    return text


def _vae_training(vae_info: dict) -> dict:
    record = {"steps": vae_info["config"]["steps"], "wall_s": vae_info["wall_s"], "history": vae_info["history"]}
    return record | ({"decoder": vae_info["decoder"]} if "decoder" in vae_info else {})


def install_vae(args: argparse.Namespace, preset: ModelPreset) -> Path:
    """The finished (or decoder-tuned) VAE into the preset's installed weights, its model card's VAE
    record with it; the DiT there stays. The decoder phase leaves the latents as they were, so a
    tuned decoder serves with the DiT already installed. The card's evaluation, made with the old
    VAE, goes: `world_eval --card` records the new one."""
    dst = loading.BUNDLED_ROOT / (preset.bundled_weights or preset.name)
    card_path = dst / loading.MODEL_CARD
    if not card_path.is_file():
        raise FileNotFoundError(f"no installed weights in {dst}: export and --install the whole preset first")
    vae = load_trained_vae(args.out, preset)
    vae_info = json.loads((args.out / "vae.json").read_text())
    card = json.loads(card_path.read_text())
    card["params"]["vae"] = sum(p.numel() for p in vae.parameters())
    card["data"]["vae"] = _vae_data(vae_info)
    card["training"]["vae"] = _vae_training(vae_info)
    card.pop("evaluation", None)
    save_module(vae, dst / loading.VAE_SAFETENSORS)
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return dst


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    preset = get_preset(args.preset)
    world = World.generate(WORLD_SEED)
    phases = PHASES if args.phase == "all" else (args.phase,)
    t0 = time.time()
    checkpoint.stop_on_signals()
    try:
        _run_phases(args, preset, world, phases)
    except checkpoint.Interrupted as stop:
        where = f"; commit {args.keep.directory} to resume on another machine" if args.keep else ""
        print(f"[training] {stop} after {time.time() - t0:.0f} s: run the same command to resume{where}", flush=True)
        raise SystemExit(130) from None
    print(f"[training] done in {time.time() - t0:.0f} s", flush=True)


def _run_phases(args: argparse.Namespace, preset: ModelPreset, world: World, phases: tuple[str, ...]) -> None:
    if "vae" in phases:
        phase_vae(args, preset, world)
    if "decoder" in phases:
        phase_decoder(args, preset, world)
        if args.install and "export" not in phases:
            where = install_vae(args, preset)
            print(f"[decoder] the VAE installed into {where}; evaluate it into its card: world_eval --card", flush=True)
    if "latents" in phases:
        phase_latents(args, preset)
    if "events" in phases:
        phase_events(args, preset)
    if "moves" in phases:
        phase_moves(args, preset)
    if "dit" in phases:
        phase_dit(args, preset)
    if "export" in phases:
        out = phase_export(args, preset)
        if args.install:
            print(f"[export] installed into {install(out, preset.bundled_weights or preset.name)}", flush=True)


if __name__ == "__main__":
    main()
