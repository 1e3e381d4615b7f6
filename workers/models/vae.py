"""Wan2.1 causal video VAE with an explicit, per-session streaming state.

Layout: pixels are [B, 3, T, H, W] in [-1, 1]; latents are [B, z_dim, T', H/8, W/8], stored
normalised per channel as (mu - mean) / std. Module and parameter names follow the public
`Wan2.1_VAE.pth` exactly, so that checkpoint loads with `load_state_dict(strict=True)`.

Causality comes from convolutions that pad only the past in time. Streaming keeps, per temporal
convolution, the last CACHE_T input frames of the previous call and feeds them in place of that
zero padding, so running a video through in pieces gives bit-identical results to one pass. The
encoder is always fed frame 0 alone and then groups of `temporal_stride` frames; the decoder one
latent frame at a time. One-shot `encode`/`decode` are the same loop over a fresh state, which is
what makes chunked and one-shot outputs equal rather than merely close.

Cache tensors keep whatever autograd graph produced them, so a long-lived stream should run under
`torch.inference_mode()` (or `no_grad`) to avoid holding every previous chunk's graph.

Decoding can also be height-sharded over N ranks (`decode_stream(..., shard=SpatialShard)`): each
rank decodes one horizontal band of latent rows. The decoder's forward path takes an optional
`shard`; with it, every conv whose kernel spans rows (the 3x3x3 CausalConv3d's, the upsamplers'
3x3 HaloConv2d) fetches its `padding` rows from the neighbour bands instead of zero-padding H (the
global top/bottom edges still get zeros), and attention gathers keys/values over the whole frame.
Norms, activations, 1x1 convs, temporal convs and nearest upsampling are per pixel and stay local.
Conv caches hold only the rank's own rows, i.e. exactly that band of what the unsharded cache holds.
`shard=None` is the original single-process path, unchanged.

On one device, `WanVAE.bands` > 1 runs the full-resolution layers (the encoder's first two levels,
the decoder's last two, where nearly all activations are) in that many height bands one after
another, each computing the halo rows its own rows depend on (workers/models/vae_bands.py). Each
band keeps causal caches of its own (`VAEStreamState.encoder_band_caches`, `decoder_band_caches`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from workers.models.presets import VAEConfig
from workers.models.repeat_memo import RepeatMemo
from workers.models.vae_bands import RowKind, RowStep, max_bands, plan_bands
from workers.parallel.halo import SpatialShard, split_rows

__all__ = [
    "CACHE_T",
    "FIRST_CALL",
    "AttentionBlock",
    "CausalConv3d",
    "Decoder3d",
    "Encoder3d",
    "HaloConv2d",
    "RMS_norm",
    "Resample",
    "ResidualBlock",
    "VAEStreamState",
    "WanVAE",
    "count_cache_slots",
    "split_rows",
]

CACHE_T = 2  # frames of history a 3-tap causal temporal conv needs
# What an encode stream with `skip_repeats` may keep of its layers' last calls (RepeatMemo): all of
# gridworld's encoder at 128×128, the first few full-resolution layers of a 480p one.
SKIP_REPEATS_MAX_BYTES = 64 * 2**20


class _FirstCall:
    """Marks a temporal-upsample slot whose first call has happened but which holds no frames yet.

    The first latent frame of a stream is decoded to a single video frame, so the first call of
    each temporal upsampler skips time upsampling; later calls must tell that state apart from
    "never called" (None) and from a real frame cache (a tensor).
    """

    def __repr__(self) -> str:
        return "FIRST_CALL"

    def __reduce__(self) -> str:
        # Copies and pickles of a stream state must still compare `is FIRST_CALL`.
        return "FIRST_CALL"


FIRST_CALL = _FirstCall()

CacheSlot = torch.Tensor | _FirstCall | None
CacheList = list[CacheSlot]


def _halo_rows(conv: nn.Conv2d | nn.Conv3d, pad_h: int) -> int:
    """Rows of neighbour halo `conv` needs under height sharding (its H padding); checks it is shardable."""
    k_h, s_h = conv.kernel_size[-2], conv.stride[-2]
    if conv.padding_mode != "zeros" or s_h != 1 or conv.dilation[-2] != 1 or k_h != 2 * pad_h + 1:
        raise NotImplementedError(
            f"height sharding needs a 'same' zero-padded, stride-1 kernel in H; got kernel {k_h}, "
            f"stride {s_h}, padding {pad_h} ({conv.padding_mode})"
        )
    return pad_h


class CausalConv3d(nn.Conv3d):
    """3D convolution padded only on the past side in time; `cache_x` replaces that padding.

    With a `shard`, the H padding comes from the neighbour ranks' rows (zeros at the frame's
    global edges) rather than from zeros at every band edge; time and W padding are unchanged.
    """

    # Index of this conv's slot in a stream cache; set by `_assign_cache_slots` for the convs
    # whose temporal kernel spans more than one frame (1-frame kernels need no history).
    cache_slot: int | None = None
    # A half-precision VAE on the CPU convolves in float32 and rounds the output back
    # (`WanVAE.convolve_in_float32`): CPUs without bf16/fp16 instructions have no fast half conv3d,
    # and a GPU's half convolution accumulates in float32 too.
    float32_convs: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.padding, tuple):
            raise ValueError(f"CausalConv3d needs numeric padding, got {self.padding!r}")
        pt, ph, pw = self.padding
        # F.pad order: (w_left, w_right, h_top, h_bottom, t_front, t_back). All temporal padding
        # goes to the front so an output frame never sees a later input frame.
        self._causal_padding: tuple[int, ...] = (pw, pw, ph, ph, 2 * pt, 0)
        self.padding = (0, 0, 0)

    def forward(
        self, x: torch.Tensor, cache_x: torch.Tensor | None = None, shard: SpatialShard | None = None
    ) -> torch.Tensor:
        pad_w, _, pad_h, _, pad_t, _ = self._causal_padding
        if cache_x is not None and pad_t > 0:
            x = torch.cat([cache_x.to(x.device, x.dtype), x], dim=2)
            pad_t -= cache_x.shape[2]
        if shard is not None and pad_h > 0:
            # After the cache concat: the neighbours' cached frames arrive with their halo rows.
            x = shard.exchange_halo(x, _halo_rows(self, pad_h))
            pad_h = 0
        if pad_t > 0:
            x = F.pad(x, (0, 0, 0, 0, pad_t, 0))
        # H and W are zero-padded by the convolution itself: padding the input first costs a
        # full-frame fill and copy per conv (9 % of a 128x128 chunk's decode on CPU).
        padding = [0, pad_h, pad_w]
        if self.float32_convs and x.dtype != torch.float32:
            bias = None if self.bias is None else self.bias.float()
            return self._conv(x.float(), self.weight.float(), bias, padding).to(x.dtype)
        return self._conv(x, self.weight, self.bias, padding)

    def _conv(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: list[int]
    ) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled():
            # PyTorch's dispatch heuristic sends batch-1, 3-tap 3D convs to its slow reference
            # kernel; oneDNN computes the same convolution several times faster on CPU. Given a
            # channels-last input it needs no reorder in and out of its blocked layout, which halves
            # the narrow full-resolution convs (8 channels at 128×128); the output stays channels-
            # last, which the channel RMS norms after it also read faster. The weight's layout does
            # not matter to it (same bits, same speed), so it is used as stored: no copy per call.
            return torch.ops.aten.mkldnn_convolution(
                x.contiguous(memory_format=torch.channels_last_3d),
                weight,
                bias,
                padding,
                list(self.stride),
                list(self.dilation),
                self.groups,
            )
        return F.conv3d(x, weight, bias, self.stride, padding, self.dilation, self.groups)


NORM_EPS = 1e-12  # F.normalize's


class RMS_norm(nn.Module):  # upstream's name, kept so code and checkpoint layouts read alike
    """Channel RMS norm: L2-normalise over channels, rescale by sqrt(dim) and a learned gain."""

    def __init__(self, dim: int, images: bool = True) -> None:
        super().__init__()
        shape = (dim, 1, 1) if images else (dim, 1, 1, 1)
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.normalize(x, dim=1), written as a sum of squares: PyTorch's CPU vector norm over a
        # strided dim runs 6-17x slower and was 38 % of a 128x128 chunk's decode. Same value to
        # float rounding (eps 1e-12 on the norm is 1e-24 on its square).
        # In float32 whatever the VAE's dtype: a float16 square overflows past |x| = 256, and
        # F.normalize accumulates half inputs in float32 too. For float32 input this is the same math.
        x32 = x.float()
        inv_norm = torch.rsqrt(x32.square().sum(dim=1, keepdim=True).clamp_min(NORM_EPS**2))
        return (x32 * inv_norm * (self.scale * self.gamma.float())).to(x.dtype)


class _Upsample2x(nn.Module):
    """Nearest-exact 2x spatial upsampling, computed in float32 (half-precision kernels are patchy)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x.float(), scale_factor=(2.0, 2.0), mode="nearest-exact").type_as(x)


class HaloConv2d(nn.Conv2d):
    """A per-frame 2D conv that, given a `shard`, takes its H padding from the neighbour ranks.

    Without a shard it is exactly nn.Conv2d (same parameters, same checkpoint keys).
    """

    def forward(self, x: torch.Tensor, shard: SpatialShard | None = None) -> torch.Tensor:
        if shard is None or not isinstance(self.padding, tuple) or self.padding[0] == 0:
            return super().forward(x)
        pad_h, pad_w = self.padding
        x = shard.exchange_halo(x, _halo_rows(self, pad_h))
        return F.conv2d(x, self.weight, self.bias, self.stride, (0, pad_w), self.dilation, self.groups)


def _frames_to_batch(x: torch.Tensor) -> torch.Tensor:
    b, c, t, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def _batch_to_frames(x: torch.Tensor, t: int) -> torch.Tensor:
    bt, c, h, w = x.shape
    return x.reshape(bt // t, t, c, h, w).permute(0, 2, 1, 3, 4)


def _cached_conv(
    conv: CausalConv3d, x: torch.Tensor, cache: CacheList | None, shard: SpatialShard | None = None
) -> torch.Tensor:
    """Run `conv` on `x` with its stream history, then remember the tail of `x` for the next call.

    Under a shard `x` is the local band and so is what gets cached; halo rows are fetched afresh
    (history included) inside the conv.
    """
    if cache is None or not _is_cached_conv(conv):  # a per-frame kernel needs no history
        return conv(x, None, shard)
    slot = _slot_of(conv)
    old = cache[slot]
    old_frames = old if isinstance(old, torch.Tensor) else None
    new = x[:, :, -CACHE_T:].clone()  # clone: a view would keep the whole chunk alive
    if new.shape[2] < CACHE_T and old_frames is not None:
        # A 1-frame call still has to leave 2 frames of history: take the older one from the
        # previous cache.
        new = torch.cat([old_frames[:, :, -1:].to(new.device, new.dtype), new], dim=2)
    out = conv(x, old_frames, shard)
    cache[slot] = new
    return out


def _slot_of(conv: CausalConv3d) -> int:
    if conv.cache_slot is None:
        raise RuntimeError("this CausalConv3d has no cache slot; build it inside Encoder3d/Decoder3d")
    return conv.cache_slot


def _is_cached_conv(module: nn.Module) -> bool:
    return isinstance(module, CausalConv3d) and module.kernel_size[0] > 1


def count_cache_slots(module: nn.Module) -> int:
    """Number of stream-cache slots `module` needs: one per causal conv with a temporal kernel > 1."""
    return sum(1 for m in module.modules() if _is_cached_conv(m))


def _assign_cache_slots(module: nn.Module) -> int:
    count = 0
    for m in module.modules():
        if _is_cached_conv(m):
            assert isinstance(m, CausalConv3d)
            m.cache_slot = count
            count += 1
    return count


def _conv3x3(in_dim: int, out_dim: int, kernel_t: int) -> CausalConv3d:
    """A 3×3 spatial conv spanning `kernel_t` frames (3: causal in time; 1: per frame)."""
    return CausalConv3d(in_dim, out_dim, (kernel_t, 3, 3), padding=(kernel_t // 2, 1, 1))


class ResidualBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0, kernel_t: int = 3) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.residual = nn.Sequential(
            RMS_norm(in_dim, images=False),
            nn.SiLU(),
            _conv3x3(in_dim, out_dim, kernel_t),
            RMS_norm(out_dim, images=False),
            nn.SiLU(),
            nn.Dropout(dropout),
            _conv3x3(out_dim, out_dim, kernel_t),
        )
        self.shortcut: nn.Module = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(
        self, x: torch.Tensor, cache: CacheList | None = None, shard: SpatialShard | None = None
    ) -> torch.Tensor:
        h = self.shortcut(x)  # 1x1x1: local under a shard
        for layer in self.residual:
            x = _cached_conv(layer, x, cache, shard) if isinstance(layer, CausalConv3d) else layer(x)
        return x + h


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame independently (no time mixing).

    Under a shard, queries are the local rows only; keys and values are gathered from every band.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.norm = RMS_norm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, shard: SpatialShard | None = None) -> torch.Tensor:
        identity = x
        b, c, t, h, w = x.shape
        y = self.norm(_frames_to_batch(x))
        if shard is None:
            qkv = self.to_qkv(y).reshape(b * t, 1, c * 3, h * w).permute(0, 1, 3, 2).contiguous()
            q, k, v = qkv.chunk(3, dim=-1)  # each [b*t, 1, h*w, c]
        else:
            qkv = self.to_qkv(y)  # [b*t, 3c, h, w]: the local rows
            kv = shard.gather_rows(qkv[:, c:])  # [b*t, 2c, H, w]: the whole frame
            q = qkv[:, :c].reshape(b * t, 1, c, h * w).permute(0, 1, 3, 2).contiguous()
            k, v = kv.reshape(b * t, 1, 2 * c, -1).permute(0, 1, 3, 2).contiguous().chunk(2, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v)
        y = y.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)
        y = self.proj(y)
        return _batch_to_frames(y, t) + identity


_RESAMPLE_MODES = ("upsample2d", "upsample3d", "downsample2d", "downsample3d")


class Resample(nn.Module):
    """2x spatial resampling per frame, plus 2x temporal resampling in the *3d modes.

    Upsampling also halves the channel count (the decoder's next stage expects that).
    """

    def __init__(self, dim: int, mode: str) -> None:
        super().__init__()
        if mode not in _RESAMPLE_MODES:
            raise ValueError(f"Resample mode must be one of {_RESAMPLE_MODES}, got {mode!r}")
        self.dim = dim
        self.mode = mode
        self.time_conv: CausalConv3d | None = None
        if mode.startswith("upsample"):
            self.resample = nn.Sequential(_Upsample2x(), HaloConv2d(dim, dim // 2, 3, padding=1))
            if mode == "upsample3d":
                # Produces both output frames of each input frame as two channel groups.
                self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        else:
            # Pad right/bottom only, so stride 2 keeps pixel (0, 0) aligned with the input grid.
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=(2, 2)))
            if mode == "downsample3d":
                self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))

    def forward(
        self, x: torch.Tensor, cache: CacheList | None = None, shard: SpatialShard | None = None
    ) -> torch.Tensor:
        if shard is not None and not self.mode.startswith("upsample"):
            raise NotImplementedError(f"Resample({self.mode!r}) does not support height sharding")
        if self.mode == "upsample3d":
            x = self._time_upsample(x, self._require_cache(cache))  # (3, 1, 1) conv: local rows
        t = x.shape[2]
        y = _frames_to_batch(x)
        for layer in self.resample:
            y = layer(y, shard) if isinstance(layer, HaloConv2d) else layer(y)
        x = _batch_to_frames(y, t)
        if self.mode == "downsample3d":
            x = self._time_downsample(x, self._require_cache(cache))
        return x

    def _require_cache(self, cache: CacheList | None) -> CacheList:
        # Without history the temporal path is undefined (upstream silently skips it, which
        # changes the frame count); callers always stream through a cache.
        if cache is None:
            raise ValueError(f"Resample({self.mode!r}) needs a stream cache")
        return cache

    def _time_upsample(self, x: torch.Tensor, cache: CacheList) -> torch.Tensor:
        assert self.time_conv is not None
        slot = _slot_of(self.time_conv)
        old = cache[slot]
        if old is None:
            # First latent frame of a stream decodes to one frame: no temporal upsampling.
            cache[slot] = FIRST_CALL
            return x
        old_frames = old if isinstance(old, torch.Tensor) else None
        new = x[:, :, -CACHE_T:].clone()
        if new.shape[2] < CACHE_T:
            # After the first call there is no real history yet: zeros stand for it, exactly the
            # padding a cache-less causal conv would have used.
            older = torch.zeros_like(new) if old_frames is None else old_frames[:, :, -1:].to(new)
            new = torch.cat([older, new], dim=2)
        x = self.time_conv(x, old_frames)
        cache[slot] = new
        b, c2, t, h, w = x.shape
        c = c2 // 2
        # Channel groups [0:c] and [c:2c] are the even and odd output frames: interleave them.
        x = x.reshape(b, 2, c, t, h, w)
        x = torch.stack((x[:, 0], x[:, 1]), dim=3)
        return x.reshape(b, c, t * 2, h, w)

    def _time_downsample(self, x: torch.Tensor, cache: CacheList) -> torch.Tensor:
        assert self.time_conv is not None
        slot = _slot_of(self.time_conv)
        old = cache[slot]
        if old is None:
            # Frame 0 passes alone and unchanged; only its last frame is ever read back.
            cache[slot] = x[:, :, -1:].clone()
            return x
        assert isinstance(old, torch.Tensor)
        new = x[:, :, -1:].clone()
        x = self.time_conv(torch.cat([old[:, :, -1:].to(x), x], dim=2))
        cache[slot] = new
        return x


def _run_layer(layer: nn.Module, x: torch.Tensor, cache: CacheList, shard: SpatialShard | None) -> torch.Tensor:
    if isinstance(layer, CausalConv3d):
        return _cached_conv(layer, x, cache, shard)
    if isinstance(layer, (ResidualBlock, Resample)):
        return cast(torch.Tensor, layer(x, cache, shard))
    if isinstance(layer, AttentionBlock):
        return layer(x, shard)
    return cast(torch.Tensor, layer(x))


def _run_sequence(
    layers: Iterable[nn.Module],
    x: torch.Tensor,
    cache: CacheList,
    shard: SpatialShard | None = None,
    memo: RepeatMemo | None = None,
) -> torch.Tensor:
    for layer in layers:
        run = functools.partial(_run_layer, layer, x, cache, shard)
        history = None if memo is None else _history(layer, cache)
        # Same input and same cached frames: the same output, and the same tails left in the caches
        # (workers/models/repeat_memo.py).
        x = run() if memo is None or history is None else memo.run(id(layer), (x, *history), run)
    return x


def _history(layer: nn.Module, cache: CacheList) -> list[torch.Tensor] | None:
    """The cached frames `layer` reads; None while any of its caches holds none yet."""
    frames = [cache[slot] for slot in _cache_slots(layer)]
    return None if any(not isinstance(f, torch.Tensor) for f in frames) else cast(list[torch.Tensor], frames)


def _cache_slots(layer: nn.Module) -> list[int]:
    """The stream-cache slots `layer` reads and writes (its causal convs')."""
    return [_slot_of(m) for m in layer.modules() if isinstance(m, CausalConv3d) and _is_cached_conv(m)]


def _row_step(layer: nn.Module) -> RowStep:
    """How `layer` maps rows (workers/models/vae_bands.py); attention mixes the whole frame and has none."""
    if isinstance(layer, CausalConv3d):
        return RowStep(RowKind.SAME, layer._causal_padding[2])
    if isinstance(layer, ResidualBlock):
        return RowStep(RowKind.SAME, sum(_row_step(m).radius for m in layer.residual if isinstance(m, CausalConv3d)))
    if isinstance(layer, Resample):
        return RowStep(RowKind.UP, 1) if layer.mode.startswith("upsample") else RowStep(RowKind.DOWN)
    if isinstance(layer, RMS_norm | nn.SiLU | nn.Dropout | nn.Identity):
        return RowStep(RowKind.SAME)
    raise ValueError(f"{type(layer).__name__} cannot run in height bands")


def _run_banded(layers: list[nn.Module], x: torch.Tensor, band_caches: list[CacheList]) -> torch.Tensor:
    """`layers` over `x` in len(band_caches) height bands one after another: the same rows (to float
    rounding) as one pass, with one band's activations alive at a time."""
    bands = plan_bands([_row_step(m) for m in layers], x.shape[-2], len(band_caches))
    kept = []
    for band, cache in zip(bands, band_caches, strict=True):
        out = _run_sequence(layers, x[..., band.in_lo : band.in_hi, :], cache)
        # A copy (the halo rows go now) in the band's own layout: channels-last from a CPU conv, so
        # the layers after see the layout, and so compute the bits, that one pass would give them.
        kept.append(out[..., band.keep_lo : band.keep_hi, :].clone(memory_format=torch.preserve_format))
        del out
    return torch.cat(kept, dim=-2)


class Encoder3d(nn.Module):
    def __init__(
        self,
        dim: int,
        out_channels: int,
        dim_mult: tuple[int, ...],
        num_res_blocks: int,
        temporal_downsample: tuple[bool, ...],
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        dims = [dim * u for u in (1, *dim_mult)]
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)

        blocks: list[nn.Module] = []
        out_dim = dims[0]
        for i, (in_dim, out_dim) in enumerate(itertools.pairwise(dims)):
            for _ in range(num_res_blocks):
                blocks.append(ResidualBlock(in_dim, out_dim, dropout))
                in_dim = out_dim
            if i != len(dim_mult) - 1:
                blocks.append(Resample(out_dim, "downsample3d" if temporal_downsample[i] else "downsample2d"))
        self.downsamples = nn.Sequential(*blocks)

        self.middle = nn.Sequential(
            ResidualBlock(out_dim, out_dim, dropout),
            AttentionBlock(out_dim),
            ResidualBlock(out_dim, out_dim, dropout),
        )
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False), nn.SiLU(), CausalConv3d(out_dim, out_channels, 3, padding=1)
        )
        self.num_cache_slots = _assign_cache_slots(self)

    @property
    def banded_layers(self) -> tuple[list[nn.Module], list[nn.Module]]:
        """(the full-resolution layers bands run: conv1 to the second downsample, the rest)."""
        layers = list(self.downsamples)
        resamples = [i for i, m in enumerate(layers) if isinstance(m, Resample)]
        cut = resamples[1] + 1 if len(resamples) > 1 else len(layers)
        return [self.conv1, *layers[:cut]], layers[cut:]

    def forward(
        self,
        x: torch.Tensor,
        cache: CacheList,
        band_caches: list[CacheList] | None = None,
        memo: RepeatMemo | None = None,
    ) -> torch.Tensor:
        if band_caches:
            banded, rest = self.banded_layers
            x = _run_sequence(rest, _run_banded(banded, x, band_caches), cache, memo=memo)
        else:
            x = _run_sequence([self.conv1, *self.downsamples], x, cache, memo=memo)
        x = _run_sequence(self.middle, x, cache, memo=memo)
        return _run_sequence(self.head, x, cache, memo=memo)


class Decoder3d(nn.Module):
    def __init__(
        self,
        dim: int,
        z_dim: int,
        dim_mult: tuple[int, ...],
        num_res_blocks: int,
        temporal_upsample: tuple[bool, ...],
        dropout: float = 0.0,
        full_res_kernel_t: int = 3,
    ) -> None:
        super().__init__()
        dims = [dim * u for u in (dim_mult[-1], *dim_mult[::-1])]
        last_stage = len(dim_mult) - 1
        self.conv1 = CausalConv3d(z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(
            ResidualBlock(dims[0], dims[0], dropout),
            AttentionBlock(dims[0]),
            ResidualBlock(dims[0], dims[0], dropout),
        )

        blocks: list[nn.Module] = []
        out_dim = dims[0]
        for i, (in_dim, out_dim) in enumerate(itertools.pairwise(dims)):
            if i > 0:
                in_dim //= 2  # the previous stage's Resample halved the channels
            kernel_t = full_res_kernel_t if i == last_stage else 3
            for _ in range(num_res_blocks + 1):
                blocks.append(ResidualBlock(in_dim, out_dim, dropout, kernel_t))
                in_dim = out_dim
            if i != last_stage:
                blocks.append(Resample(out_dim, "upsample3d" if temporal_upsample[i] else "upsample2d"))
        self.upsamples = nn.Sequential(*blocks)

        self.head = nn.Sequential(RMS_norm(out_dim, images=False), nn.SiLU(), _conv3x3(out_dim, 3, full_res_kernel_t))
        self.num_cache_slots = _assign_cache_slots(self)

    @property
    def banded_layers(self) -> tuple[list[nn.Module], list[nn.Module]]:
        """(the upsampling layers before the bands, the full-resolution layers bands run: from the
        second-to-last upsample's output to the head)."""
        layers = list(self.upsamples)
        resamples = [i for i, m in enumerate(layers) if isinstance(m, Resample)]
        cut = resamples[-2] + 1 if len(resamples) > 1 else 0
        return layers[:cut], [*layers[cut:], *self.head]

    @property
    def frame_layers(self) -> tuple[list[nn.Module], list[nn.Module]]:
        """(the upsampling layers up to the last temporal one, the layers after it: these map video
        frames one by one, their causal caches carrying time, so a latent frame's video frames can
        run through them a few at a time)."""
        layers = list(self.upsamples)
        temporal = [i for i, m in enumerate(layers) if isinstance(m, Resample) and m.mode == "upsample3d"]
        cut = temporal[-1] + 1 if temporal else 0
        return layers[:cut], [*layers[cut:], *self.head]

    def forward(
        self,
        x: torch.Tensor,
        cache: CacheList,
        shard: SpatialShard | None = None,
        band_caches: list[CacheList] | None = None,
    ) -> torch.Tensor:
        """One latent frame (or more) -> video frames; with a `shard`, the band of rows it owns."""
        x = _cached_conv(self.conv1, x, cache, shard)
        x = _run_sequence(self.middle, x, cache, shard)
        if band_caches:
            before, banded = self.banded_layers
            return _run_banded(banded, _run_sequence(before, x, cache), band_caches)
        x = _run_sequence(self.upsamples, x, cache, shard)
        return _run_sequence(self.head, x, cache, shard)

    def forward_first_apart(self, x: torch.Tensor, cache: CacheList, first_frames: int) -> Iterator[torch.Tensor]:
        """`forward` of one latent frame (unsharded, unbanded) in two pieces: its first
        `first_frames` video frames, made before the rest is started, then the rest."""
        before, after = self.frame_layers
        x = _cached_conv(self.conv1, x, cache)
        x = _run_sequence(self.middle, x, cache)
        x = _run_sequence(before, x, cache)
        yield _run_sequence(after, x[:, :, :first_frames], cache)
        yield _run_sequence(after, x[:, :, first_frames:], cache)


@dataclass
class VAEStreamState:
    """Conv history of one encode stream and one decode stream (independent of each other).

    Slots hold None (never run), FIRST_CALL (temporal upsampler after its first call) or the last
    input frames of that conv. Geometry (batch, height, width) is pinned by the first call of each
    direction so a mismatched chunk fails with a clear message instead of deep inside a conv.
    """

    num_encoder_slots: int
    num_decoder_slots: int
    bands: int = 1  # height bands of the full-resolution layers (WanVAE.bands), fixed for the stream
    # Skip encoder layers whose inputs repeat the previous call's (workers/models/repeat_memo.py).
    skip_repeats: bool = False
    encoder_cache: CacheList = field(init=False)
    decoder_cache: CacheList = field(init=False)
    # Per band, the caches of the banded layers (empty unless bands > 1); the unbanded layers use the above.
    encoder_band_caches: list[CacheList] = field(init=False)
    decoder_band_caches: list[CacheList] = field(init=False)
    frames_encoded: int = field(init=False, default=0)  # video frames consumed by encode_stream
    latents_encoded: int = field(init=False, default=0)  # latent frames produced by encode_stream
    latents_decoded: int = field(init=False, default=0)  # latent frames consumed by decode_stream
    frames_decoded: int = field(init=False, default=0)  # video frames produced by decode_stream
    encoder_geometry: tuple[int, int, int] | None = field(init=False, default=None)
    encoder_memo: RepeatMemo | None = field(init=False, default=None)  # with skip_repeats
    # Of the latents this process decodes: under a shard, its band (b, h / world_size, w).
    decoder_geometry: tuple[int, int, int] | None = field(init=False, default=None)
    # (rank, world_size) of the shard the decode stream runs under; (0, 1) when unsharded.
    decoder_shard: tuple[int, int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.reset_encoder()
        self.reset_decoder()

    def reset_encoder(self) -> None:
        self.encoder_cache = [None] * self.num_encoder_slots
        self.encoder_band_caches = self._band_caches(self.num_encoder_slots)
        self.frames_encoded = 0
        self.latents_encoded = 0
        self.encoder_geometry = None
        self.encoder_memo = RepeatMemo(SKIP_REPEATS_MAX_BYTES) if self.skip_repeats else None

    def reset_decoder(self) -> None:
        self.decoder_cache = [None] * self.num_decoder_slots
        self.decoder_band_caches = self._band_caches(self.num_decoder_slots)
        self.latents_decoded = 0
        self.frames_decoded = 0
        self.decoder_geometry = None
        self.decoder_shard = None

    def _band_caches(self, slots: int) -> list[CacheList]:
        return [[None] * slots for _ in range(self.bands)] if self.bands > 1 else []

    def cache_tensors(self, direction: str) -> list[torch.Tensor]:
        """Every cached tensor of one direction ("encoder" or "decoder"), bands included."""
        lists = [getattr(self, f"{direction}_cache"), *getattr(self, f"{direction}_band_caches")]
        return [c for cache in lists for c in cache if isinstance(c, torch.Tensor)]

    def memo_tensors(self) -> list[torch.Tensor]:
        """What the encoder's `skip_repeats` memo keeps beyond the caches (a snapshot does not copy it)."""
        cached = {id(t) for t in self.cache_tensors("encoder")}
        kept = [] if self.encoder_memo is None else self.encoder_memo.kept()
        return [t for t in kept if id(t) not in cached]


class WanVAE(nn.Module):
    """The Wan2.1 VAE (z_dim 16, 8x spatial / 4x temporal compression with the default config)."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else VAEConfig()
        z = config.z_dim
        self.z_dim = z
        self.encoder = Encoder3d(
            config.base_dim, 2 * z, config.dim_mult, config.num_res_blocks, config.temporal_downsample
        )
        self.conv1 = CausalConv3d(2 * z, 2 * z, 1)
        self.conv2 = CausalConv3d(z, z, 1)
        self.decoder = Decoder3d(
            config.base_dim,
            z,
            config.dim_mult,
            config.num_res_blocks,
            config.temporal_downsample[::-1],
            full_res_kernel_t=config.decoder_full_res_kernel_t,
        )
        # Kept outside the state dict (the checkpoint has no such keys) and outside buffers (a
        # meta-built model loaded with assign=True would leave buffers on meta).
        self._latent_stats: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        # Height bands of the full-resolution layers on one device (a memory saving; 1: one pass).
        self.bands = 1

    # ----------------------------------------------------------------------------- state / helpers

    def new_stream_state(self, skip_repeats: bool = False) -> VAEStreamState:
        """A fresh stream; `skip_repeats`: encoder layers whose inputs repeat return their last output
        instead of running again (exact; workers/models/repeat_memo.py)."""
        return VAEStreamState(self.encoder.num_cache_slots, self.decoder.num_cache_slots, self.bands, skip_repeats)

    def max_bands(self, height_px: int) -> int:
        """The most height bands frames of `height_px` rows allow, in both directions."""
        spatial = self.config.spatial_stride
        enc, _ = self.encoder.banded_layers
        _, dec = self.decoder.banded_layers
        # The decoder's banded layers start at the resolution its second-to-last upsample gives.
        ups = sum(1 for m in dec if isinstance(m, Resample))
        dec_input = height_px // 2 ** (ups + 1) if ups else height_px // spatial
        return min(max_bands([_row_step(m) for m in enc], height_px), max_bands([_row_step(m) for m in dec], dec_input))

    def convolve_in_float32(self, on: bool) -> None:
        """Causal convs of a half-precision VAE in float32 (what the CPU needs; see CausalConv3d)."""
        for m in self.modules():
            if isinstance(m, CausalConv3d):
                m.float32_convs = on

    def set_bands(self, bands: int, height_px: int) -> None:
        """Run the full-resolution layers in `bands` height bands; ValueError if the rows do not allow it."""
        most = self.max_bands(height_px)
        if not 1 <= bands <= most:
            raise ValueError(f"--vae-bands {bands}: frames of {height_px} rows allow 1 to {most} bands")
        self.bands = bands

    def latent_stats(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel (mean, std) as float32 [1, z, 1, 1, 1] tensors on `device`."""
        device = torch.device(device)
        stats = self._latent_stats.get(device)
        if stats is None:
            shape = (1, self.z_dim, 1, 1, 1)
            mean = torch.tensor(self.config.latent_mean, dtype=torch.float32, device=device).view(shape)
            std = torch.tensor(self.config.latent_std, dtype=torch.float32, device=device).view(shape)
            stats = self._latent_stats[device] = (mean, std)
        return stats

    def _param_dtype(self) -> torch.dtype:
        return self.conv1.weight.dtype

    def _check_state(self, state: VAEStreamState) -> None:
        if (
            len(state.encoder_cache) != self.encoder.num_cache_slots
            or len(state.decoder_cache) != self.decoder.num_cache_slots
        ):
            raise ValueError(
                f"stream state has {len(state.encoder_cache)}/{len(state.decoder_cache)} encoder/decoder "
                f"slots, this VAE needs {self.encoder.num_cache_slots}/{self.decoder.num_cache_slots}; "
                "create it with new_stream_state()"
            )
        if state.bands != self.bands:
            raise ValueError(f"stream state has {state.bands} band(s), this VAE runs {self.bands}")

    # ----------------------------------------------------------------------------- streaming

    def encode_stream(self, video: torch.Tensor, state: VAEStreamState) -> torch.Tensor:
        """Encode the next frames of a stream: [B, 3, T, H, W] in [-1, 1] -> float32 latents.

        The first call of a stream takes T = s*n + 1 frames and yields n + 1 latent frames; later
        calls take T = s*n (n >= 1) and yield n, where s = config.temporal_stride (4 for Wan2.1).
        """
        self._check_state(state)
        s, p = self.config.temporal_stride, self.config.spatial_stride
        if video.ndim != 5 or video.shape[1] != 3:
            raise ValueError(f"video must be [B, 3, T, H, W], got {tuple(video.shape)}")
        b, _, t, h, w = video.shape
        if h % p or w % p or h == 0 or w == 0:
            raise ValueError(f"frame size {h}x{w} must be a positive multiple of {p}")
        first = state.frames_encoded == 0
        if first:
            if t < 1 or (t - 1) % s:
                raise ValueError(
                    f"the first chunk of a stream needs {s}n+1 frames (1, {s + 1}, {2 * s + 1}, ...), got {t}"
                )
            bounds = [(0, 1)] + [(i, i + s) for i in range(1, t, s)]
        else:
            if t < s or t % s:
                raise ValueError(f"chunks after the first need a positive multiple of {s} frames, got {t}")
            if state.encoder_geometry != (b, h, w):
                raise ValueError(
                    f"chunk geometry (batch, height, width) = {(b, h, w)} differs from the stream's "
                    f"{state.encoder_geometry}"
                )
            bounds = [(i, i + s) for i in range(0, t, s)]

        x = video.to(self._param_dtype())
        mean, std = self.latent_stats(video.device)
        latents = []
        for lo, hi in bounds:
            feats = self.encoder(x[:, :, lo:hi], state.encoder_cache, state.encoder_band_caches, state.encoder_memo)
            # conv1 is 1x1x1 so it could run once on the whole chunk; running it per group keeps
            # kernel shapes independent of how the caller split the stream (bit-exact chunking).
            mu = self.conv1(feats)[:, : self.z_dim]  # the log-variance half is unused
            latents.append((mu.float() - mean) / std)

        state.encoder_geometry = (b, h, w)
        state.frames_encoded += t
        state.latents_encoded += len(bounds)
        return torch.cat(latents, dim=2)

    def decode_stream(
        self, latents: torch.Tensor, state: VAEStreamState, shard: SpatialShard | None = None
    ) -> torch.Tensor:
        """Decode the next latent frames of a stream: [B, z, F, h, w] -> float32 video in [-1, 1].

        The stream's first latent frame yields 1 video frame, every later one config.temporal_stride.
        A `shard` as in `decode_stream_parts`, which hands the video on in pieces.
        """
        ((video, _),) = self.decode_stream_parts(latents, state, shard)
        return video

    def decode_stream_parts(
        self, latents: torch.Tensor, state: VAEStreamState, shard: SpatialShard | None = None, first_frames: int = 0
    ) -> Iterator[tuple[torch.Tensor, bool]]:
        """`decode_stream` as (video, is the last piece) pieces: one, or with `first_frames` k (unsharded,
        unbanded) two when the first latent frame yields more than k video frames: its first k,
        decoded before anything else is started, then the rest. A viewer sees a chunk's first frames
        sooner; the layers after the last temporal upsampling run on fewer frames at a time, which
        moves the frames by float rounding only.

        With a `shard`, `latents` is this rank's band of latent rows (`split_rows(latents, rank, N)`)
        and the result is this rank's band of output rows, [B, 3, T, 8*h_band, W]: row band r of
        the frame the unsharded decode would produce. Every rank of the shard's group must call
        this together, with equally shaped bands and its own `state` (the caches hold the rank's
        rows only); a stream keeps one shard layout from its first call until `reset_decoder`.
        `decode_stream_sharded` also gathers the full frame.
        """
        self._check_state(state)
        if latents.ndim != 5 or latents.shape[1] != self.z_dim:
            raise ValueError(f"latents must be [B, {self.z_dim}, F, h, w], got {tuple(latents.shape)}")
        if first_frames < 0 or (first_frames and (shard is not None or self.bands > 1)):
            raise ValueError(f"first_frames {first_frames}: a positive count, unsharded and unbanded (or 0)")
        b, _, n, h, w = latents.shape
        if n < 1 or h < 1 or w < 1:
            raise ValueError(f"latents need at least one frame and pixel, got {tuple(latents.shape)}")
        layout = (0, 1) if shard is None else (shard.rank, shard.world_size)
        if shard is not None and self.bands > 1:
            raise ValueError("height bands run on one device; a sharded decode splits rows across ranks already")
        if shard is not None:
            # Collective: a rank with a different band or stream position would hang the halo exchange.
            shard.check_uniform(
                (b, n, h, w, state.latents_decoded), "latent band (b, F, h, w, position)", latents.device
            )
        if state.latents_decoded and state.decoder_shard != layout:
            raise ValueError(
                f"shard layout (rank, world_size) = {layout} differs from the stream's {state.decoder_shard}"
            )
        if state.latents_decoded and state.decoder_geometry != (b, h, w):
            raise ValueError(
                f"latent geometry (batch, height, width) = {(b, h, w)} differs from the stream's "
                f"{state.decoder_geometry}"
            )

        mean, std = self.latent_stats(latents.device)
        z = (latents.float() * std + mean).to(self._param_dtype())
        apart = 0 < first_frames < (1 if state.latents_decoded == 0 else self.config.temporal_stride)
        frames = []
        for i in range(n):
            x = self.conv2(z[:, :, i : i + 1])
            if i == 0 and apart:
                pieces = self.decoder.forward_first_apart(x, state.decoder_cache, first_frames)
                yield next(pieces).float().clamp_(-1.0, 1.0), False
                frames.append(next(pieces).float().clamp_(-1.0, 1.0))
                continue
            out = self.decoder(x, state.decoder_cache, shard, state.decoder_band_caches)
            frames.append(out.float().clamp_(-1.0, 1.0))
        video = torch.cat(frames, dim=2)

        state.decoder_geometry = (b, h, w)
        state.decoder_shard = layout
        state.latents_decoded += n
        state.frames_decoded += video.shape[2] + (first_frames if apart else 0)
        yield video, True

    def decode_stream_sharded(
        self, latents: torch.Tensor, state: VAEStreamState, shard: SpatialShard, gather_to: int | None = 0
    ) -> torch.Tensor | None:
        """`decode_stream` under `shard`, then the bands gathered into full frames [B, 3, T, H, W].

        `gather_to`: the group rank that receives the frames (the others get None); None gives
        every rank the frames (an all_gather). One gather per call, after all its latent frames.
        """
        band = self.decode_stream(latents, state, shard)
        if gather_to is None:
            return shard.gather_rows(band)
        return shard.gather_rows_to(band, gather_to)

    @staticmethod
    def split_rows(latents: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
        """Rank `rank`'s band of latent rows: [B, z, F, h, w] -> [B, z, F, h / world_size, w] (a view).

        Raises ValueError unless `world_size` divides h.
        """
        return split_rows(latents, rank, world_size)

    # ----------------------------------------------------------------------------- one-shot

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Encode a whole clip of s*n + 1 frames to n + 1 normalised latent frames."""
        return self.encode_stream(video, self.new_stream_state())

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode F latent frames to s*(F - 1) + 1 video frames in [-1, 1]."""
        return self.decode_stream(latents, self.new_stream_state())
