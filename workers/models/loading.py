"""Building model components and loading them strictly from a local checkpoint directory, laid out
as released or as diffusers saves a pipeline (workers/models/checkpoint_files.py names the files of
both and tells them apart). The diffusers layout stores the same tensors under other names: its
sources map every stored name to the module's through workers/models/diffusers_layout.py before
anything is compared, so both layouts go through the same check and the same stream below.

Presets with `bundled_weights` load from workers/models/weights/<name>/ when no directory is given.

Loading streams, in two passes over a component's files:
1. Check. Every key and shape is compared with the module, built on the meta device, from the file
   headers alone (safetensors headers; a `.pth` opened with mmap, whose pickle names the shapes
   without touching the data). Every mismatch (missing, unexpected, mis-shaped keys) is collected
   and reported together before a byte of weight data is read.
2. Load. One tensor at a time: read it (a safetensors tensor is read with positional reads into a
   fresh buffer of exactly its size; a `.pth` tensor is a view of the mmap), cast it to the target
   dtype on the host, move it to the target device, assign it into the meta module in place, and
   drop the source before the next one is read.

Memory guarantee: while a component loads, the memory it takes stays within its final weights
plus its largest single tensor as stored.
- To the CPU: the host holds the weights loaded so far, one source tensor and its cast copy (which
  is one of the final weights).
- To CUDA: the device only ever receives cast weights, so it holds at most the final weights; the
  host holds one source tensor and its cast copy at a time.
Why this design: reading whole files into a state dict before converting costs the stored size on
top of the weights (an fp32-stored 18.5 B-parameter DiT needs 74 GB before shrinking to 37 GB of
bf16). Mapping a safetensors file (`safe_open`) keeps every page read from it resident, counted
against the process, until the file closes: a whole shard on top of the bound (measured loading
the 1.3B DiT from 2 GiB shards both ways: a peak 2.0 GiB higher than with positional reads, which
go through the page cache, which the kernel may evict and charges to no process).
A `.pth` is read through `torch.load`'s mmap: its pages are clean and file-backed, reclaimable by
the kernel, yet resident until the component is loaded and the mapping closes; the anonymous
memory keeps the bound.
The loaded weights never alias a reader buffer or a file mapping, so the files may be replaced
while the model runs.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.nn as nn

from workers.models import diffusers_layout
from workers.models.checkpoint_files import (  # noqa: F401 - the layout's names, used as loading.X
    DIFFUSERS_DIT,
    DIFFUSERS_T5,
    DIFFUSERS_VAE,
    DIT_INDEX,
    DIT_SINGLE,
    DIT_SUBDIR,
    T5_FILE,
    T5_SAFETENSORS,
    TOKENIZER_DIR,
    VAE_FILE,
    VAE_SAFETENSORS,
    Layout,
    detect_layout,
    diffusers_files,
    dit_files,
)
from workers.models.presets import ModelPreset, VAEConfig

MODEL_CARD = "model_card.json"
BUNDLED_ROOT = Path(__file__).resolve().parent / "weights"


def checkpoint_dir_for(preset: ModelPreset, checkpoint_dir: str | Path | None) -> Path | None:
    """The directory to load from: the given one, else the preset's bundled weights, else None (random)."""
    if checkpoint_dir is not None:
        return Path(checkpoint_dir)
    if preset.bundled_weights is None:
        return None
    bundled = BUNDLED_ROOT / preset.bundled_weights
    if not (bundled / DIT_SUBDIR / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"preset {preset.name!r} ships its weights in {bundled}, but they are missing; "
            "restore them from the repository or retrain with `python -m workers.training --install`"
        )
    return bundled


def model_events(preset: ModelPreset, checkpoint_dir: str | Path | None) -> dict[str, str]:
    """The world events the weights learned (name -> the prompt that names it), from their model card's
    `events`; none for weights without a card or a card without events (random weights included)."""
    directory = checkpoint_dir_for(preset, checkpoint_dir)
    card = None if directory is None else directory / MODEL_CARD
    if card is None or not card.is_file():
        return {}
    events = json.loads(card.read_text()).get("events") or {}
    return {str(name): str(prompt) for name, prompt in events.items()}


class CheckpointError(ValueError):
    """A checkpoint does not match the preset, or a file cannot be read; the message lists every problem."""


@dataclass(frozen=True)
class KeyReport:
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    misshaped: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # (key, expected, found)
    # Where a key found under another name is stored ("as 'name' in file"), for a source that
    # renames (the diffusers layout); every key is reported in the module's names, this adds the file's.
    stored_as: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped)

    def _named(self, key: str) -> str:
        where = self.stored_as.get(key)
        return key if where is None else f"{key} (stored {where})"

    def describe(self, component: str, limit: int = 20) -> str:
        lines = [f"{component}: checkpoint does not match the preset"]
        for title, items in (("missing", self.missing), ("unexpected", self.unexpected)):
            if items:
                shown = ", ".join(self._named(k) for k in items[:limit])
                shown += f", … (+{len(items) - limit})" if len(items) > limit else ""
                lines.append(f"  {len(items)} {title} key(s): {shown}")
        for key, want, got in self.misshaped[:limit]:
            lines.append(f"  mis-shaped {self._named(key)}: expected {list(want)}, found {list(got)}")
        if len(self.misshaped) > limit:
            lines.append(f"  … and {len(self.misshaped) - limit} more mis-shaped keys")
        return "\n".join(lines)


def compare_shapes(
    expected: dict[str, tuple[int, ...]],
    found: dict[str, tuple[int, ...]],
    stored_as: Mapping[str, str] | None = None,
) -> KeyReport:
    return KeyReport(
        missing=tuple(sorted(set(expected) - set(found))),
        unexpected=tuple(sorted(set(found) - set(expected))),
        misshaped=tuple(
            (k, expected[k], found[k]) for k in sorted(set(expected) & set(found)) if expected[k] != found[k]
        ),
        stored_as=dict(stored_as or {}),
    )


def state_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def build_on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return factory()


# ---- checkpoint sources: shapes from headers, then tensors one at a time ----


class TensorSource(Protocol):
    """One component's checkpoint files."""

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every key's shape, from the headers only: no tensor data is read."""
        ...

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each tensor once, in its stored dtype on the host. The reader keeps no reference to a tensor
        it has yielded, so a consumer that drops it frees it before the next one is read."""
        ...


# The safetensors format's dtype names (https://github.com/huggingface/safetensors, format section).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# The format's own cap: a larger length prefix means the file is not a safetensors file.
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class SafetensorsEntry:
    """One tensor of a safetensors file, as its header describes it."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def read_safetensors_header(path: Path) -> tuple[SafetensorsEntry, ...]:
    """The file's tensors in file order, checked against the file's size, so a truncated or corrupt
    file is named here, before any data is read (the format library's messages do not name the file)."""
    size = path.stat().st_size  # FileNotFoundError names the path

    def corrupt(reason: str) -> CheckpointError:
        return CheckpointError(f"cannot read {path}: {reason}")

    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise corrupt(f"{size} bytes is too short for a safetensors file")
        header_len = int.from_bytes(prefix, "little")
        if header_len > MAX_SAFETENSORS_HEADER_BYTES or 8 + header_len > size:
            raise corrupt(f"a header of {header_len} bytes does not fit the file's {size} bytes")
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise corrupt(f"the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise corrupt("the header is not a JSON object")
    data_start = 8 + header_len
    data_len = size - data_start
    entries = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise corrupt(f"bad header entry for {key!r}: {info!r} ({exc!r})") from None
        if not 0 <= begin <= end <= data_len:
            raise corrupt(f"{key!r} lies at data bytes {begin}..{end} but the file holds {data_len} (truncated?)")
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * dtype.itemsize:
            raise corrupt(f"{key!r} has {end - begin} bytes for shape {list(shape)} of {info['dtype']}")
        entries.append(SafetensorsEntry(key, dtype, shape, data_start + begin, data_start + end))
    return tuple(sorted(entries, key=lambda e: e.begin))


def _read_entry(fd: int, path: Path, entry: SafetensorsEntry) -> torch.Tensor:
    """One tensor, read with positional reads into a fresh buffer of its size (no file mapping: see
    the module docstring). The buffer is a private anonymous mapping of its own, unmapped the moment
    the tensor dies: from the C heap instead, source buffers of many sizes, each freed while the
    weights cast from them stay, fragment the heap so that little is given back to the kernel
    (measured on the 1.3B DiT, fp32 to bf16: 1.6 GB beyond the weights stayed resident)."""
    if entry.nbytes == 0:
        return torch.empty(entry.shape, dtype=entry.dtype)
    block = mmap.mmap(-1, entry.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # Transparent huge pages where the kernel allows them: reading 2 GB takes a third of the time
    # (fewer page faults). Only whole 2 MB pages inside the buffer qualify, so none is oversized.
    with contextlib.suppress(AttributeError, OSError):  # no THP on this platform or kernel
        block.madvise(mmap.MADV_HUGEPAGE)
    with memoryview(block) as view:
        done = 0
        while done < entry.nbytes:  # one read returns at most ~2 GiB on Linux
            n = os.preadv(fd, [view[done:]], entry.begin + done)
            if n == 0:
                raise CheckpointError(f"cannot read {path}: the file ends inside {entry.key!r} (truncated?)")
            done += n
    # The tensor holds the only reference to the mapping; the view's slices are released above.
    return torch.frombuffer(block, dtype=torch.uint8).view(entry.dtype).reshape(entry.shape)


def _stream(path: Path, entries: Sequence[tuple[SafetensorsEntry, str]]) -> Iterator[tuple[str, torch.Tensor]]:
    """One file's tensors, each read when asked for and yielded under the name paired with its entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for entry, name in entries:
            # Yielded without a local name: the suspended generator must not keep it alive.
            yield name, _read_entry(fd, path, entry)
    finally:
        os.close(fd)  # each shard closes once its tensors are read


@dataclass(frozen=True)
class SafetensorsSource:
    """Safetensors files (a DiT's shards, or one component file)."""

    paths: tuple[Path, ...]

    def headers(self) -> list[tuple[Path, tuple[SafetensorsEntry, ...]]]:
        headers = [(path, read_safetensors_header(path)) for path in self.paths]
        seen: dict[str, Path] = {}
        for path, entries in headers:
            for e in entries:
                if e.key in seen:
                    raise CheckpointError(f"{e.key!r} is stored twice: in {seen[e.key]} and in {path}")
                seen[e.key] = path
        return headers

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {e.key: e.shape for _, entries in self.headers() for e in entries}

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for path, entries in self.headers():
            yield from _stream(path, [(e, e.key) for e in entries])


@dataclass(frozen=True)
class RenamedSource:
    """Safetensors files that store the module's tensors under other names (the diffusers layout).
    Every stored name is mapped to the module's through `names` from the headers, so the strict
    check, its report (which adds each key's stored name and file) and the one-tensor-at-a-time
    stream are those of the released layout; a name the table ties to another is never read."""

    files: SafetensorsSource
    names: diffusers_layout.NameTable

    def headers(self) -> list[tuple[Path, tuple[SafetensorsEntry, ...]]]:
        """The files' entries under their stored names."""
        return self.files.headers()

    def _plan(self) -> list[tuple[Path, list[tuple[SafetensorsEntry, str]]]]:
        """Per file, each entry to read with its native name."""
        headers = self.files.headers()
        ignored = self.names.ignored({e.key for _, entries in headers for e in entries})
        seen: dict[str, tuple[str, Path]] = {}
        plan = []
        for path, entries in headers:
            renamed = []
            for entry in entries:
                if entry.key in ignored:
                    continue
                native = self.names.to_native(entry.key)
                if native in seen:
                    first, first_path = seen[native]
                    raise CheckpointError(
                        f"{self.names.component}: {native!r} is stored twice, as {first!r} in {first_path} and as "
                        f"{entry.key!r} in {path}; keep one of them"
                    )
                seen[native] = (entry.key, path)
                renamed.append((entry, native))
            plan.append((path, renamed))
        return plan

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {native: e.shape for _, renamed in self._plan() for e, native in renamed}

    def stored_as(self) -> dict[str, str]:
        """Native name -> where it is stored: "as 'stored name' in file", or "in file" where the names agree."""
        return {
            native: f"in {path}" if e.key == native else f"as {e.key!r} in {path}"
            for path, renamed in self._plan()
            for e, native in renamed
        }

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for path, renamed in self._plan():
            yield from _stream(path, renamed)


@dataclass(frozen=True)
class PthSource:
    """A `.pth` state dict (the released VAE, umT5 and CLIP files). `rename` maps a stored name to the
    module's, None for a tensor the module does not hold (never read); without it names are kept."""

    path: Path
    rename: Callable[[str], str | None] | None = None

    def _open(self) -> dict[str, torch.Tensor]:
        if not self.path.is_file():
            raise FileNotFoundError(f"missing checkpoint file {self.path}")
        # mmap: the pickle is read for the shapes; tensor data is paged in only when a tensor is copied.
        state = torch.load(self.path, map_location="cpu", mmap=True, weights_only=True)
        if not isinstance(state, dict):
            raise CheckpointError(f"{self.path} does not hold a state dict")
        return state

    def _native(self, key: str) -> str | None:
        return key if self.rename is None else self.rename(key)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        named = ((self._native(k), v) for k, v in self._open().items())
        return {name: tuple(v.shape) for name, v in named if name is not None}

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        state = self._open()
        for key in list(state):
            name = self._native(key)
            if name is None:
                del state[key]
            else:
                yield name, state.pop(key)  # no reference kept here while the loader holds it


def dit_shards(checkpoint_dir: Path) -> list[Path]:
    """The DiT's safetensors files, in either layout."""
    if detect_layout(checkpoint_dir) is Layout.DIFFUSERS:
        return diffusers_files(checkpoint_dir, DIFFUSERS_DIT)
    return dit_files(checkpoint_dir)


def dit_source(checkpoint_dir: Path) -> SafetensorsSource | RenamedSource:
    files = SafetensorsSource(tuple(dit_shards(checkpoint_dir)))
    if detect_layout(checkpoint_dir) is Layout.DIFFUSERS:
        return RenamedSource(files, diffusers_layout.DIT_NAMES)
    return files


def component_source(checkpoint_dir: Path, pth_name: str, safetensors_name: str) -> TensorSource:
    """The component's safetensors file when present, else its released .pth name."""
    st = checkpoint_dir / safetensors_name
    return SafetensorsSource((st,)) if st.is_file() else PthSource(checkpoint_dir / pth_name)


def vae_source(checkpoint_dir: Path, config: VAEConfig) -> TensorSource:
    """The VAE's weights, in either layout (the diffusers table depends on the VAE's block count)."""
    if detect_layout(checkpoint_dir) is Layout.DIFFUSERS:
        files = SafetensorsSource(tuple(diffusers_files(checkpoint_dir, DIFFUSERS_VAE)))
        return RenamedSource(files, diffusers_layout.vae_names(config))
    return component_source(checkpoint_dir, VAE_FILE, VAE_SAFETENSORS)


def text_encoder_source(checkpoint_dir: Path) -> TensorSource:
    """The umT5 encoder's weights, in either layout."""
    if detect_layout(checkpoint_dir) is Layout.DIFFUSERS:
        files = SafetensorsSource(tuple(diffusers_files(checkpoint_dir, DIFFUSERS_T5)))
        return RenamedSource(files, diffusers_layout.T5_NAMES)
    return component_source(checkpoint_dir, T5_FILE, T5_SAFETENSORS)


def read_dit_shapes(checkpoint_dir: Path) -> dict[str, tuple[int, ...]]:
    return dit_source(checkpoint_dir).shapes()


def read_dit_state(checkpoint_dir: Path, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The DiT's whole state dict in its stored dtype, for loading into a live module (training's warm
    start); building a model for inference goes through `load_strict`, which keeps the memory bound."""
    return {key: tensor.to(device) for key, tensor in dit_source(checkpoint_dir).tensors()}


# ---- loading ----


def check_source(module: nn.Module, source: TensorSource) -> KeyReport:
    """Every key and shape of `source` against `module`, from the headers alone."""
    stored_as = source.stored_as() if isinstance(source, RenamedSource) else None
    return compare_shapes(state_shapes(module), source.shapes(), stored_as)


def check_sources(
    modules: Mapping[str, nn.Module], sources: Mapping[str, Callable[[], TensorSource]]
) -> dict[str, KeyReport | str]:
    """`check_source` per component; a component whose files cannot be opened or read gets the reason."""
    results: dict[str, KeyReport | str] = {}
    for name, source in sources.items():
        try:
            results[name] = check_source(modules[name], source())
        except (OSError, ValueError, RuntimeError) as exc:  # missing, corrupt or truncated files
            results[name] = str(exc)
    return results


def _to_target(source: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh tensor in `dtype` on `device`. The cast happens on the host, so the device only ever
    holds final weights; integer and bool tensors keep their dtype (a cast would corrupt them)."""
    if source.is_floating_point() and source.dtype != dtype:
        host = source.to(dtype)
    elif device.type == "cpu":
        host = source.clone()  # never alias the reader's buffer or a file mapping
    else:
        host = source
    return host.to(device)


def load_strict(
    component: str, module: nn.Module, source: TensorSource, dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """Assign `source`'s tensors into a meta-built `module`, after checking every key and shape from
    the headers; peak memory is the final weights plus one source tensor (module docstring)."""
    report = check_source(module, source)
    if not report.ok:
        raise CheckpointError(report.describe(component))
    for key, tensor in source.tensors():
        owner_name, _, name = key.rpartition(".")
        owner = module.get_submodule(owner_name)
        weight = _to_target(tensor, dtype, device)
        del tensor  # the source dies here, before the next one is read
        if name in owner._parameters:
            owner._parameters[name] = nn.Parameter(weight, requires_grad=False)
        else:
            owner._buffers[name] = weight
    return module


def materialize_random(
    module: nn.Module, init: Callable[[nn.Module], None], dtype: torch.dtype, device: torch.device
) -> nn.Module:
    # In `dtype` from the start: a float32 copy first would make the load's peak twice the bf16
    # model on a GPU (the init's values are drawn on the host in float32 and rounded as they are
    # copied in, the same bits as rounding the whole model afterwards).
    module = module.to(dtype=dtype).to_empty(device=device)
    init(module)
    return module
