"""Memory savings: what a session may trade to fit a smaller GPU, each a setting of its own.

Four savings, in the order of their quality cost (measured by `python -m benchmarks.savings`,
docs/models-and-weights.md, "Savings"):

- `vae_bands` N: the VAE encodes and decodes the full-resolution part of each frame in N height
  bands one after another (workers/models/vae_bands.py), so its largest activations shrink about N
  times. Exact up to float rounding: each band carries the halo rows its convolutions read.
- `text_encoder_on_cpu`: the context encoder (umT5, CLIP) runs on the host, as Wan2.1's `--t5_cpu`
  does; its embeddings move to the GPU once per prompt. Exact: same weights, same dtype (it keeps
  the dtype it would have on the GPU, so host memory holds bf16, not float32), slower per prompt.
- `vae_dtype`: the VAE in bfloat16 or float16 (the Matrix-Game 2.0 release decodes in float16)
  instead of float32: half the VAE's weights, caches and activations.
- `quantization` fp8: the DiT's linear weights stored as float8 e4m3 with one float32 scale per
  output channel, computed in the DiT's own dtype (workers/models/fp8.py): about half the DiT's
  weight bytes.

Defaults are exact (no saving on). A saving is part of what a session was made with, like its
weights and placement: /v1/model and recordings name them, and a snapshot made with other savings
is refused (server/snapshots/shelf.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch only where a dtype is asked for: the server's settings import this module
    import torch


class Quantization(enum.StrEnum):
    NONE = "none"
    FP8 = "fp8"  # weight-only, per output channel (vLLM's `--quantization fp8` name)


class VAEDtype(enum.StrEnum):
    AUTO = "auto"  # float32, as released
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return torch.float32 if self is VAEDtype.AUTO else getattr(torch, self.value)

    @property
    def reduced(self) -> bool:
        return self not in (VAEDtype.AUTO, VAEDtype.FLOAT32)


MAX_VAE_BANDS = 16


@dataclass(frozen=True)
class Savings:
    quantization: Quantization = Quantization.NONE
    text_encoder_on_cpu: bool = False
    vae_dtype: VAEDtype = VAEDtype.AUTO
    vae_bands: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.vae_bands <= MAX_VAE_BANDS:
            raise ValueError(f"vae_bands must be between 1 and {MAX_VAE_BANDS}, got {self.vae_bands}")

    @property
    def exact(self) -> bool:
        """No saving that changes the numbers (bands and the host placement only reorder the work)."""
        return self.quantization is Quantization.NONE and not self.vae_dtype.reduced

    def names(self) -> list[str]:
        """The savings that are on, as the command line spells them (empty: none)."""
        on = []
        if self.vae_bands > 1:
            on.append(f"--vae-bands {self.vae_bands}")
        if self.text_encoder_on_cpu:
            on.append("--text-encoder-on-cpu")
        if self.vae_dtype.reduced:
            on.append(f"--vae-dtype {self.vae_dtype.value}")
        if self.quantization is not Quantization.NONE:
            on.append(f"--quantization {self.quantization.value}")
        return on

    def describe(self) -> str:
        return " ".join(self.names()) or "none (exact)"

    def record(self) -> dict[str, Any]:
        """JSON form, for /v1/model, RUN.json, recordings and snapshots' made-with."""
        return {f.name: (v.value if isinstance(v := getattr(self, f.name), enum.Enum) else v) for f in fields(self)}

    @staticmethod
    def from_record(record: dict[str, Any] | None) -> Savings:
        if not record:
            return NO_SAVINGS
        return Savings(
            Quantization(record.get("quantization", "none")),
            bool(record.get("text_encoder_on_cpu", False)),
            VAEDtype(record.get("vae_dtype", "auto")),
            int(record.get("vae_bands", 1)),
        )

    def check(self, device: torch.device) -> None:
        """Raise ValueError, naming what is missing, when a saving cannot run here."""
        import torch

        if self.quantization is Quantization.FP8 and not hasattr(torch, "float8_e4m3fn"):
            raise ValueError(f"--quantization fp8 needs torch.float8_e4m3fn, which torch {torch.__version__} lacks")
        cuda_here = device.type == "cuda" and torch.cuda.is_available()  # a plan for another machine checks nothing
        if self.vae_dtype is VAEDtype.BFLOAT16 and cuda_here and not torch.cuda.is_bf16_supported():
            raise ValueError(f"--vae-dtype bfloat16: {device} does not support bfloat16; use float16")


NO_SAVINGS = Savings()

# The ladder the plan climbs to fit a card (workers/runtime/savings_plan.py): each rung adds one
# saving to the one before, cheapest quality cost first: the exact ones, then the VAE's dtype, then
# fp8 weights last. More than 4 bands costs more in halo caches than it saves in activations at
# 832×480 (the plan's figures), so the ladder stops there.
LADDER: tuple[Savings, ...] = (
    NO_SAVINGS,
    Savings(vae_bands=2),
    Savings(vae_bands=4),
    Savings(vae_bands=4, text_encoder_on_cpu=True),
    Savings(vae_bands=4, text_encoder_on_cpu=True, vae_dtype=VAEDtype.BFLOAT16),
    Savings(vae_bands=4, text_encoder_on_cpu=True, vae_dtype=VAEDtype.BFLOAT16, quantization=Quantization.FP8),
)


def add_savings_arguments(parser: Any) -> None:
    """The savings flags, the same on `worldrtc serve`, `plan` and `replay` (an argparse parser)."""
    parser.add_argument(
        "--quantization",
        choices=[q.value for q in Quantization],
        default=None,
        help="fp8: the DiT's block weights in float8 with per-channel scales, computed in bf16 (default none)",
    )
    parser.add_argument(
        "--text-encoder-on-cpu",
        action="store_true",
        default=None,
        help="run the context encoder (umT5, CLIP) on the host; embeddings move to the GPU once per prompt",
    )
    parser.add_argument(
        "--vae-dtype", choices=[d.value for d in VAEDtype], default=None, help="the VAE's dtype (default float32)"
    )
    parser.add_argument(
        "--vae-bands",
        metavar="N",
        type=int,
        default=None,
        help="run the VAE's full-resolution layers in N height bands one after another (exact; default 1)",
    )


def savings_from_arguments(args: Any, base: Savings = NO_SAVINGS) -> Savings:
    """The savings the flags name, on top of `base` (ValueError for a bad value)."""
    return Savings(
        Quantization(args.quantization) if args.quantization is not None else base.quantization,
        bool(args.text_encoder_on_cpu) or base.text_encoder_on_cpu,
        VAEDtype(args.vae_dtype) if args.vae_dtype is not None else base.vae_dtype,
        args.vae_bands if args.vae_bands is not None else base.vae_bands,
    )
