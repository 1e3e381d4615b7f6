"""Frame similarity, detail and structure of uint8 RGB frames, per frame: PSNR, SSIM, Laplacian
energy, and edge F1 against a reference."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def psnr_db(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[T, H, W, 3] uint8 pairs -> [T] PSNR in dB (peak 255; identical frames give 100)."""
    diff = a.astype(np.float64) - b.astype(np.float64)
    mse = (diff**2).reshape(len(a), -1).mean(axis=1)
    return np.where(mse > 0, 10.0 * np.log10(255.0**2 / np.maximum(mse, 1e-12)), 100.0)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(3, 1, size, size).contiguous()


def ssim(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[T, H, W, 3] uint8 pairs -> [T] SSIM (Wang et al. 2004: 11×11 Gaussian σ 1.5, per channel, mean)."""
    x = torch.from_numpy(a).permute(0, 3, 1, 2).double()
    y = torch.from_numpy(b).permute(0, 3, 1, 2).double()
    w = _gaussian_window()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, w, groups=3)  # valid region only, as the reference implementation

    mx, my = blur(x), blur(y)
    sxx, syy, sxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx**2 + my**2 + c1) * (sxx + syy + c2))
    return s.mean(dim=(1, 2, 3)).numpy()


def gaussian_blur(frames: np.ndarray, sigma_px: float) -> np.ndarray:
    """[T, H, W, 3] uint8 -> the same frames blurred by a Gaussian of `sigma_px` (edges replicated):
    a known loss of detail to calibrate `laplacian_variance` ratios against."""
    radius = math.ceil(3 * sigma_px)
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).double()
    x = F.conv2d(F.pad(x, (radius,) * 4, mode="replicate"), _gaussian_window(2 * radius + 1, sigma_px), groups=3)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


_LAPLACIAN = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)


def laplacian_variance(frames: np.ndarray) -> np.ndarray:
    """[T, H, W, 3] uint8 -> [T] variance of the Laplacian of each frame's luma (valid region): the
    high-frequency energy a blurred frame lacks (edges, texture), 0 for a flat one."""
    rgb = torch.from_numpy(frames).double()
    luma = (rgb @ torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64))[:, None]  # [T, 1, H, W]
    lap = F.conv2d(luma, _LAPLACIAN[None, None])
    return lap.flatten(1).var(dim=1).numpy()


# Edges: Sobel gradient of luma in [0, 1], scaled so that a step of height h reads h. A pixel is an
# edge where that is at least EDGE_STEP: a tenth of the luma range, well above the renderer's
# shading gradients and well below its tile and wall outlines.
EDGE_STEP = 0.1
_SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=torch.float64) / 4


def edges(frames: np.ndarray) -> torch.Tensor:
    """[T, H, W, 3] uint8 -> [T, H, W] bool: where luma changes by at least EDGE_STEP (valid region,
    padded back with no edges)."""
    rgb = torch.from_numpy(frames).double() / 255
    luma = (rgb @ torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64))[:, None]
    gx = F.conv2d(luma, _SOBEL_X[None, None])
    gy = F.conv2d(luma, _SOBEL_X.T[None, None])
    return F.pad((gx.square() + gy.square()).sqrt() >= EDGE_STEP, (1, 1, 1, 1))[:, 0]


def edge_f1(made: np.ndarray, truth: np.ndarray, tolerance_px: int = 1) -> np.ndarray:
    """[T, H, W, 3] uint8 pair -> [T] F1 of `made`'s edges against `truth`'s, an edge counting as
    matched when the other has one within `tolerance_px` (Chebyshev distance).

    Precision: the share of generated edges that lie on the reference's outlines; recall: the share
    of the reference's outlines the generated frame draws. Blur loses both (edges fade below the
    step or smear wider than the tolerance); texture in the wrong place loses precision, which an
    energy ratio such as `laplacian_variance`'s cannot see. 1 when both frames have no edges."""
    a, b = edges(made).double()[:, None], edges(truth).double()[:, None]
    k = 2 * tolerance_px + 1

    def near(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, k, stride=1, padding=tolerance_px)

    hits_a, n_a = (a * near(b)).flatten(1).sum(1), a.flatten(1).sum(1)
    hits_b, n_b = (b * near(a)).flatten(1).sum(1), b.flatten(1).sum(1)
    precision = torch.where(n_a > 0, hits_a / n_a.clamp(min=1), (n_b == 0).double())
    recall = torch.where(n_b > 0, hits_b / n_b.clamp(min=1), (n_a == 0).double())
    both = precision + recall
    return torch.where(both > 0, 2 * precision * recall / both.clamp(min=1e-12), torch.zeros_like(both)).numpy()
