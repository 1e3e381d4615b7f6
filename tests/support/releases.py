"""Checkpoint directories with the exact file names of the public releases, and a Hugging Face cache
in huggingface_hub's own layout, for tests that must not download anything.

Two kinds of fixture:
- **Header-only** (full-size presets): every tensor at the preset's real shape, none with real
  data. A safetensors shard is its header followed by a sparse hole of the right length (the file's
  size is what the header promises; the disk holds a few kilobytes). A `.pth` holds every tensor as
  a zero-stride view of one element, so its pickle names the full shapes in a file of a few
  kilobytes. `verify` reads only headers and pickles, so these pass it exactly when the names and
  shapes do.
- **Tiny** (the `tiny` preset under the published names): real seeded weights a server can start
  from, laid out with the 14B release's file names.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from workers.families.registry import family_for
from workers.models import components, loading
from workers.models.hub import repo_folder
from workers.models.hub_files import HubFiles, HubWeights
from workers.models.presets import ModelPreset

F32 = 4


def header_only_safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A safetensors file of F32 tensors whose data region is a sparse hole of the declared length."""
    header: dict[str, object] = {}
    offset = 0
    for key, shape in shapes.items():
        nbytes = F32 * int(torch.Size(shape).numel())
        header[key] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


def header_only_pth(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A `.pth` state dict naming every shape, each tensor a zero-stride view of one shared element."""
    one = torch.zeros(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: one.expand(shape) if shape else one[0] for k, shape in shapes.items()}, path)


def shard_names(shapes: dict[str, tuple[int, ...]], names: list[str]) -> dict[str, str]:
    """key -> shard, filling the shards in key order by bytes, as released checkpoints are split."""
    total = sum(F32 * int(torch.Size(s).numel()) for s in shapes.values())
    per, weight_map, seen = total / len(names), {}, 0
    for key, shape in shapes.items():
        weight_map[key] = names[min(int(seen / per), len(names) - 1)]
        seen += F32 * int(torch.Size(shape).numel())
    return weight_map


def write_index(path: Path, weight_map: dict[str, str], total_bytes: int) -> None:
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    path.write_text(json.dumps(index, indent=1))


def dit_files_of(hub: HubFiles) -> tuple[str, list[str]]:
    """The release's DiT index and shard names, as its HubFiles list them."""
    index = next(f for f in hub.files if f.endswith(".safetensors.index.json"))
    folder = index.rsplit("/", 1)[0] + "/" if "/" in index else ""
    shards = [f for f in hub.files if f.endswith(".safetensors") and f.startswith(folder)]
    return index, shards


def header_only_release(root: Path, preset: ModelPreset, hub: HubFiles, with_dit: bool = True) -> Path:
    """`hub`'s files under `root`, header-only at the preset's shapes (see the module doc)."""
    meta = family_for(preset).meta_components(preset)
    if with_dit:
        index, shards = dit_files_of(hub)
        shapes = loading.state_shapes(meta["dit"])
        weight_map = shard_names(shapes, [s.rsplit("/", 1)[-1] for s in shards])
        folder = (root / index).parent
        for shard in {*weight_map.values()}:
            header_only_safetensors(folder / shard, {k: v for k, v in shapes.items() if weight_map[k] == shard})
        write_index(root / index, weight_map, sum(F32 * int(torch.Size(s).numel()) for s in shapes.values()))
    for name in hub.files:
        if name.endswith("Wan2.1_VAE.pth"):
            header_only_pth(root / name, loading.state_shapes(meta["vae"]))
        elif name.endswith("umt5-xxl-enc-bf16.pth"):
            header_only_pth(root / name, loading.state_shapes(meta["t5"]))
        elif name.endswith("tokenizer.json"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("{}")  # only named here: verify and the plan never read it
    return root


def tiny_release(root: Path, preset: ModelPreset, hub: HubFiles, weights_seed: int) -> Path:
    """`preset`'s seeded weights (a small preset) under the 14B release's file names."""
    cpu = torch.device("cpu")
    dit = {k: v.contiguous() for k, v in components.load_dit(preset, cpu, None, weights_seed).state_dict().items()}
    index, shards = dit_files_of(hub)
    weight_map = shard_names({k: tuple(v.shape) for k, v in dit.items()}, [s.rsplit("/", 1)[-1] for s in shards])
    folder = (root / index).parent
    folder.mkdir(parents=True, exist_ok=True)
    for shard in {s.rsplit("/", 1)[-1] for s in shards}:
        save_file({k: v for k, v in dit.items() if weight_map[k] == shard}, str(folder / shard))
    write_index(root / index, weight_map, sum(v.numel() * v.element_size() for v in dit.values()))
    torch.save(components.load_vae(preset, cpu, None, weights_seed).state_dict(), root / loading.VAE_FILE)
    t5 = components.load_text_encoder(preset, cpu, None, weights_seed).encoder.state_dict()
    torch.save(t5, root / loading.T5_FILE)
    return root


def populate_hf_cache(cache: Path, hub: HubWeights, releases: dict[str, Path], only: set[str] | None = None) -> None:
    """Put each repository's files (from its release folder) into `cache` as huggingface_hub lays
    them out: the content under blobs/, snapshots/<revision>/<file> a relative link to it, and
    refs/main naming the revision. `only`: just these files (a partial cache)."""
    for source in hub.repos:
        repo = repo_folder(cache, source.repo_id)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(source.revision)
        for name in source.files:
            if only is not None and name not in only:
                continue
            blob = repo / "blobs" / hashlib.sha256(f"{source.repo_id}/{name}".encode()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            os.replace(releases[source.repo_id] / name, blob)
            link = repo / "snapshots" / source.revision / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
