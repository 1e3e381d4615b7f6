"""Start images: read from a file or array, fit to the model resolution, convert to model range."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

MAX_IMAGE_PIXELS = 64_000_000  # the default cap on width × height, checked before decoding


class ImageError(ValueError):
    """An image that cannot be read or used."""


def read_image(source: str | Path | bytes | np.ndarray, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """Any supported source -> HxWx3 uint8 RGB. An encoded image larger than `max_pixels` is
    refused from its header, before any pixel is decoded (a small file can claim a huge size)."""
    if isinstance(source, np.ndarray):
        arr = source
        if arr.ndim == 2:
            arr = np.repeat(arr[..., None], 3, axis=-1)
        if arr.ndim != 3 or arr.shape[-1] not in (3, 4):
            raise ImageError(f"image array must be HxWx3 (or HxWx4), got shape {arr.shape}")
        if arr.dtype != np.uint8:
            raise ImageError(f"image array must be uint8, got {arr.dtype}")
        return np.ascontiguousarray(arr[..., :3])
    too_big = f"at most {max_pixels:,} pixels are accepted"
    try:
        img = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)  # reads the header only
        width, height = img.size
        if width * height > max_pixels:
            raise ImageError(f"image is {width}×{height} pixels; {too_big}")
        img.load()
    except FileNotFoundError:
        raise ImageError(f"image file not found: {source!s}") from None
    except Image.DecompressionBombError:  # Pillow's own cap, met in `open` by far larger images
        raise ImageError(f"image claims more pixels than Pillow will open; {too_big}") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        if isinstance(exc, ImageError):
            raise
        # Pillow's messages name Python objects ("cannot identify image file <_io.BytesIO …>"): the
        # reader of this one is a person choosing a file.
        what = "is not an image" if isinstance(exc, UnidentifiedImageError) else "is damaged or cut short"
        raise ImageError(f"the file {what}; use a PNG or JPEG image") from None
    return np.asarray(img.convert("RGB"))


def fit_image(rgb: np.ndarray, height_px: int, width_px: int) -> np.ndarray:
    """Centre-crop to the target aspect ratio, then resize (bicubic). Returns HxWx3 uint8."""
    h, w = rgb.shape[:2]
    target = width_px / height_px
    if w / h > target:
        crop_w = round(h * target)
        x0 = (w - crop_w) // 2
        rgb = rgb[:, x0 : x0 + crop_w]
    elif w / h < target:
        crop_h = round(w / target)
        y0 = (h - crop_h) // 2
        rgb = rgb[y0 : y0 + crop_h]
    if rgb.shape[:2] != (height_px, width_px):
        rgb = np.asarray(Image.fromarray(rgb).resize((width_px, height_px), Image.Resampling.BICUBIC))
    return np.ascontiguousarray(rgb)


def to_model_range(rgb: np.ndarray) -> torch.Tensor:
    """HxWx3 uint8 -> [3, H, W] float32 in [-1, 1]."""
    return torch.from_numpy(np.array(rgb)).permute(2, 0, 1).float().div(127.5).sub(1.0)


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, T, H, W] in [-1, 1] -> [T, H, W, 3] uint8."""
    frames = video.float().clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().cpu().numpy()
