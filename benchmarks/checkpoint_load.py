"""Peak memory of loading a DiT checkpoint, against the streaming loader's bound.

    python -m benchmarks.checkpoint_load --preset lingbot-world-v2-1.3b [--dtype bf16] [--shard-gib 2] \
        [--dir DIR] [--json]

Writes a synthetic fp32 DiT checkpoint in the released sharded layout (`transformers/` shards plus
`model.safetensors.index.json`, keys from the preset's own module, seeded random values), one
tensor at a time so that writing stays bounded too. Then a fresh Python process (so the writer's
memory does not count) loads it through `components.load_dit` onto the CPU in `--dtype` and reports:

- the final weights' bytes and the largest tensor's bytes as stored (fp32);
- the resident memory when the load starts: the interpreter, torch and what they set up once per
  process, paid before the measurement (the symbolic-shape stack that the first module built on
  the meta device imports, the cast kernels, the intra-op threads), with the C allocator's free
  memory handed back to the kernel so that the load cannot hide in it;
- the peaks during the load: VmHWM from /proc/self/status, reset when the load starts through
  /proc/self/clear_refs, so it is exact and counts every resident page, file-backed ones included
  (a mapped checkpoint file shows there); and anonymous and file-backed resident memory sampled
  every 2 ms (a sampler may miss a short peak; VmHWM cannot);
- what the load added at its peak, split into what it keeps (the weights and the module's Python
  objects) and what it held only while loading; that peak over the final weights; and whether it
  stays within the loader's bound, final weights + largest tensor + 10 %. The module's Python
  objects and allocator pages are a few MB whatever the model's size: nothing at the 1.3B DiT's
  3.3 GB, but as much as the weights at the `tiny` preset's 2.8 MB (its test allows for them).

The checkpoint is written to a temporary directory that is removed afterwards, unless `--dir` is
given: then it stays there and a later run with the same preset, seed and shard size reuses it.
The files are in the page cache after writing, so `load_s` times memory traffic, not the disk.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from workers.models import components, loading
from workers.models.dit import WanDiT
from workers.models.presets import ModelPreset, get_preset

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BOUND_SLACK = 0.10
GIB = 1 << 30
MANIFEST = "checkpoint_load.json"  # what a kept --dir holds, so a later run can reuse it
SAMPLE_INTERVAL_S = 0.002


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- writing ----


@dataclass(frozen=True)
class WrittenCheckpoint:
    root: Path
    shards: tuple[str, ...]
    tensors: int
    total_bytes: int
    largest_tensor_bytes: int


def plan_shards(nbytes: dict[str, int], shard_bytes: int) -> list[list[str]]:
    """Keys in module order, cut into shards of at most `shard_bytes` (a larger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    filled = 0
    for key, size in nbytes.items():
        if shards[-1] and filled + size > shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(key)
        filled += size
    return shards


def _safetensors_header(keys: list[str], shapes: dict[str, tuple[int, ...]], nbytes: dict[str, int]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key in keys:
        header[key] = {"dtype": "F32", "shape": list(shapes[key]), "data_offsets": [offset, offset + nbytes[key]]}
        offset += nbytes[key]
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header so the data starts 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw


def write_checkpoint(
    preset: ModelPreset, root: Path, shard_bytes: int, seed: int = 0, progress: Callable[[str], None] = log
) -> WrittenCheckpoint:
    """The preset's DiT as fp32 safetensors shards under `root`, one tensor in memory at a time."""
    shapes = loading.state_shapes(loading.build_on_meta(lambda: WanDiT(preset.dit)))
    nbytes = {k: 4 * _numel(s) for k, s in shapes.items()}
    plan = plan_shards(nbytes, shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    sub = root / loading.DIT_SUBDIR
    sub.mkdir(parents=True, exist_ok=True)
    total = sum(nbytes.values())
    generator = torch.Generator().manual_seed(seed)
    written = 0
    next_report = GIB
    for name, keys in zip(names, plan, strict=True):
        progress(f"writing {name}: {len(keys)} tensors, {sum(nbytes[k] for k in keys) / GIB:.2f} GiB")
        with open(sub / name, "wb") as f:
            f.write(_safetensors_header(keys, shapes, nbytes))
            for key in keys:
                values = torch.randn(shapes[key], generator=generator, dtype=torch.float32)
                f.write(values.numpy().data)
                del values
                written += nbytes[key]
                if written >= next_report:
                    progress(f"  {written / GIB:.1f} / {total / GIB:.1f} GiB written")
                    next_report += GIB
    weight_map = {key: name for name, keys in zip(names, plan, strict=True) for key in keys}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (sub / loading.DIT_INDEX).write_text(json.dumps(index, indent=1))
    return WrittenCheckpoint(
        root=root,
        shards=tuple(names),
        tensors=len(shapes),
        total_bytes=total,
        largest_tensor_bytes=max(nbytes.values()),
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ---- measuring (in the process that loads) ----


def proc_status() -> dict[str, int]:
    """This process's memory lines of /proc/self/status, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[name] = int(value.split()[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Set VmHWM to the current VmRSS (Linux: clear_refs 5); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def release_free_heap() -> None:
    """Hand the C allocator's free memory back to the kernel (glibc), so that a load reusing it does
    not look smaller than it is."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the baseline may include free memory
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakSampler:
    """The largest anonymous and file-backed resident memory seen, sampled on a thread."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.peak_anon = 0
        self.peak_file = 0
        self.samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> None:
        with self._lock:
            status = proc_status()
            self.peak_anon = max(self.peak_anon, status["RssAnon"])
            self.peak_file = max(self.peak_file, status["RssFile"])
            self.samples += 1

    def restart(self) -> None:
        """Forget the peaks so far: the thread starts before the measured interval does."""
        with self._lock:
            self.peak_anon = self.peak_file = self.samples = 0
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class LoadReport:
    preset: str
    dtype: str
    tensors: int
    load_s: float
    final_weights_bytes: int
    largest_tensor_bytes: int  # as stored (fp32)
    bound_bytes: int  # (final weights + largest tensor) * 1.1
    rss_before_bytes: int  # VmRSS when the load starts: interpreter and libraries
    anon_before_bytes: int
    file_before_bytes: int
    peak_rss_bytes: int  # VmHWM during the load
    peak_rss_exact: bool  # False where VmHWM could not be reset (then it may predate the load)
    peak_anon_bytes: int  # sampled
    peak_file_bytes: int  # sampled
    samples: int
    rss_after_bytes: int  # VmRSS with the loaded module alive
    load_peak_rss_bytes: int  # peak_rss - rss_before: what the load added at its peak
    load_peak_anon_bytes: int  # peak_anon - anon_before
    load_peak_file_bytes: int  # peak_file - file_before: mapped file pages (and library code paged in)
    retained_bytes: int  # rss_after - rss_before: what the load keeps (the weights, the module's objects)
    transient_bytes: int  # peak_rss - rss_after: what it held only while loading
    load_peak_over_final: float  # load_peak_rss / final weights
    process_peak_over_final: float  # peak_rss / final weights, the interpreter included
    within_bound: bool  # both load peaks <= bound_bytes


def measure_load_here(checkpoint_dir: Path, preset: ModelPreset, dtype_name: str) -> LoadReport:
    """Load the DiT in this process through `load_dit` onto the CPU and measure its memory."""
    dtype = DTYPES[dtype_name]
    stored = loading.dit_source(checkpoint_dir).headers()
    largest = max(e.nbytes for _, entries in stored for e in entries)
    del stored
    # Once-per-process costs are the interpreter's, not the load's, so they are paid first: the first
    # module built on the meta device imports torch's symbolic-shape stack (sympy, mpmath: some 70 MB),
    # and the first cast pages in its kernels and starts the intra-op threads.
    loading.build_on_meta(lambda: WanDiT(preset.dit))
    torch.randn(1 << 16).to(dtype).clone()
    with PeakSampler() as sampler:
        release_free_heap()
        exact = reset_peak_rss()
        before = proc_status()
        sampler.restart()
        t0 = time.perf_counter()
        dit = components.load_dit(preset, torch.device("cpu"), checkpoint_dir, dtype=dtype)
        load_s = time.perf_counter() - t0
        after = proc_status()
        sampler.sample()
    state = dit.state_dict()
    if any(t.dtype != dtype for t in state.values()):
        raise AssertionError(f"load_dit did not load the weights in {dtype}")
    final = sum(t.numel() * t.element_size() for t in state.values())
    bound = int((final + largest) * (1 + BOUND_SLACK))
    load_peak_rss = after["VmHWM"] - before["VmRSS"]
    load_peak_anon = sampler.peak_anon - before["RssAnon"]
    return LoadReport(
        preset=preset.name,
        dtype=dtype_name,
        tensors=len(state),
        load_s=load_s,
        final_weights_bytes=final,
        largest_tensor_bytes=largest,
        bound_bytes=bound,
        rss_before_bytes=before["VmRSS"],
        anon_before_bytes=before["RssAnon"],
        file_before_bytes=before["RssFile"],
        peak_rss_bytes=after["VmHWM"],
        peak_rss_exact=exact,
        peak_anon_bytes=sampler.peak_anon,
        peak_file_bytes=sampler.peak_file,
        samples=sampler.samples,
        rss_after_bytes=after["VmRSS"],
        load_peak_rss_bytes=load_peak_rss,
        load_peak_anon_bytes=load_peak_anon,
        load_peak_file_bytes=sampler.peak_file - before["RssFile"],
        retained_bytes=after["VmRSS"] - before["VmRSS"],
        transient_bytes=after["VmHWM"] - after["VmRSS"],
        load_peak_over_final=load_peak_rss / final,
        process_peak_over_final=after["VmHWM"] / final,
        within_bound=load_peak_rss <= bound and load_peak_anon <= bound,
    )


def measure_load(checkpoint_dir: Path, preset: ModelPreset, dtype_name: str) -> LoadReport:
    """`measure_load_here` in a fresh Python process, so nothing this process holds counts."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.checkpoint_load",
        "--preset",
        preset.name,
        "--dtype",
        dtype_name,
        "--measure-load",
        str(checkpoint_dir),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the loading process failed ({done.returncode}):\n{done.stderr}")
    return LoadReport(**json.loads(done.stdout))


# ---- command line ----


def _manifest(preset: ModelPreset, shard_bytes: int, seed: int) -> dict[str, object]:
    return {"preset": preset.name, "shard_bytes": shard_bytes, "seed": seed, "dtype": "F32"}


def ensure_checkpoint(preset: ModelPreset, root: Path, shard_bytes: int, seed: int) -> None:
    """Write the checkpoint under `root`, unless a complete one with the same parameters is there."""
    manifest = root / MANIFEST
    want = _manifest(preset, shard_bytes, seed)
    if manifest.is_file() and json.loads(manifest.read_text()) == want:
        log(f"reusing the checkpoint in {root}")
        return
    manifest.unlink(missing_ok=True)  # a half-written checkpoint must not be reused
    written = write_checkpoint(preset, root, shard_bytes, seed)
    log(f"wrote {written.tensors} tensors, {written.total_bytes / GIB:.2f} GiB in {len(written.shards)} shards")
    manifest.write_text(json.dumps(want) + "\n")


def describe(r: LoadReport) -> str:
    def mib(n: int) -> str:
        return f"{n / (1 << 20):10.1f} MiB"

    return "\n".join(
        [
            f"{r.preset}: fp32 checkpoint → {r.dtype} on the CPU, {r.tensors} tensors, {r.load_s:.1f} s",
            f"  final weights     {mib(r.final_weights_bytes)}",
            f"  largest tensor    {mib(r.largest_tensor_bytes)} (as stored, fp32)",
            f"  bound             {mib(r.bound_bytes)} (final + largest, + 10 %)",
            f"  before the load   {mib(r.rss_before_bytes)} resident: {mib(r.anon_before_bytes).strip()} anonymous, "
            f"{mib(r.file_before_bytes).strip()} file-backed",
            f"  peak (VmHWM)      {mib(r.peak_rss_bytes)}"
            + ("" if r.peak_rss_exact else " (VmHWM could not be reset: it may predate the load)"),
            f"  peak, sampled     {mib(r.peak_anon_bytes)} anonymous, {mib(r.peak_file_bytes).strip()} file-backed "
            f"({r.samples} samples)",
            f"  load's peak       {mib(r.load_peak_rss_bytes)} resident, {mib(r.load_peak_anon_bytes).strip()} "
            f"anonymous, {mib(r.load_peak_file_bytes).strip()} file-backed",
            f"  kept / transient  {mib(r.retained_bytes)} / {mib(r.transient_bytes).strip()}",
            f"  peak / final      {r.load_peak_over_final:10.3f} (the load's), {r.process_peak_over_final:.3f} "
            "(the process's, interpreter included)",
            f"  within the bound  {r.within_bound}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="lingbot-world-v2-1.3b")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="the loaded weights' dtype")
    p.add_argument("--shard-gib", type=float, default=2.0, help="the checkpoint's shard size")
    p.add_argument("--seed", type=int, default=0, help="seeds the random weights")
    p.add_argument("--dir", type=Path, default=None, help="write (and keep) the checkpoint here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--measure-load", type=Path, default=None, help=argparse.SUPPRESS)  # the fresh process
    args = p.parse_args(argv)
    preset = get_preset(args.preset)
    if args.measure_load is not None:
        print(json.dumps(dataclasses.asdict(measure_load_here(args.measure_load, preset, args.dtype))))
        return 0

    root = args.dir if args.dir is not None else Path(tempfile.mkdtemp(prefix="checkpoint_load-"))
    try:
        root.mkdir(parents=True, exist_ok=True)
        ensure_checkpoint(preset, root, int(args.shard_gib * GIB), args.seed)
        log("loading in a fresh process …")
        report = measure_load(root, preset, args.dtype)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(dataclasses.asdict(report), indent=2) if args.json else describe(report))
    return 0 if report.within_bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
