"""Per-pixel ray casting of a WorldMap in numpy: walls, landmark towers, floor and sky.

Conventions: `c2w` is a 4×4 OpenCV camera-to-world matrix (x right, y down, z forward) in the world
frame of map.py (the start camera's frame); pixel (row, col) looks along
R · ((col + 0.5 − cx) / fx, (row + 0.5 − cy) / fy, 1), exactly as `plucker_rays` in
workers/models/camera.py, so the rendered frames and the DiT's Plücker maps describe the same rays.

How it stays fast with pitch (rays are not confined to image columns): every wall is a vertical
face of height wall_height_m standing on the floor and the eye is below the wall tops, so along any
ray only the FIRST wall face met horizontally can be hit — a ray that clears it is climbing and
clears every wall behind it too. The first face depends only on the ray's horizontal direction, so
it is found once per azimuth bin (bins ≈ 2 per pixel of horizontal angle, vectorised over bins ×
faces), and every pixel then intersects its own ray with its bin's face plane exactly. Towers are
taller than walls, so they are cast separately (nearest tower per bin) and compete by depth. The
floor is an analytic plane, the sky a function of direction. Textures are box-filtered by the
pixel's footprint to limit aliasing (geometry edges are not antialiased).

Known approximations: wall and tower edges are placed to within one azimuth bin (≈ half a pixel);
only the nearest tower per bin is drawn, so a tall tower seen over a shorter one in the same
direction is missed (towers stand at least 6 cells apart, so this is rare).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from workers.models.camera import Intrinsics
from workers.world.map import BRICKS, CHECKS, NUM_TEXTURES, PANELS, WINDOWS, WorldMap

SKY, FLOOR, WALL_HIT, TOWER_HIT = 0, 1, 2, 3
BINS_PER_PIXEL = 2.0
FOG_DISTANCE_M = 28.0

_F = np.float32


@dataclass(frozen=True)
class RenderLayers:
    rgb: np.ndarray  # [H, W, 3] uint8
    depth_m: np.ndarray  # [H, W] float32 distance along the ray to the hit (inf for sky)
    kind: np.ndarray  # [H, W] uint8: SKY, FLOOR, WALL_HIT, TOWER_HIT
    tower_id: np.ndarray  # [H, W] int8 index into WorldMap.towers, -1 elsewhere


@functools.lru_cache(maxsize=16)
def _camera_rays(intrinsics: Intrinsics, height_px: int, width_px: int) -> np.ndarray:
    """[3, H·W] float32 unnormalised camera-frame ray directions (z = 1)."""
    rows, cols = np.meshgrid(np.arange(height_px) + 0.5, np.arange(width_px) + 0.5, indexing="ij")
    u = (cols - intrinsics.cx) / intrinsics.fx
    v = (rows - intrinsics.cy) / intrinsics.fy
    rays = np.stack([u.ravel(), v.ravel(), np.ones(height_px * width_px)]).astype(_F)
    rays.flags.writeable = False
    return rays


def _cast_faces(faces: np.ndarray, pa: float, pb: float, ha: np.ndarray, hb: np.ndarray):
    """Nearest hit per bin of horizontal rays (direction (ha, hb) in (across, along) axes) with faces
    of constant `across`; returns (t [K], plane [K], normal sign [K]); t = inf where nothing is hit."""
    faces = faces[faces[:, 3] * (pa - faces[:, 0]) > 0]  # back faces cannot be the first hit
    k = ha.shape[0]
    if faces.shape[0] == 0:
        return np.full(k, np.inf, _F), np.zeros(k, _F), np.zeros(k, _F)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (faces[None, :, 0] - pa) / ha[:, None]  # [K, F]
        b = pb + t * hb[:, None]
        ok = (t > 0) & (b >= faces[None, :, 1]) & (b <= faces[None, :, 2])
    t = np.where(ok, t, np.inf)
    j = t.argmin(axis=1)
    return t[np.arange(k), j], faces[j, 0], faces[j, 3]


def _cast_towers(towers: np.ndarray, px: float, pz: float, hx: np.ndarray, hz: np.ndarray):
    """Nearest tower box per bin: (index [K] or -1, entering-face axis [K] (0 x / 1 z), plane [K])."""
    k = hx.shape[0]
    if towers.shape[0] == 0:
        return np.full(k, -1, np.int64), np.zeros(k, np.int8), np.zeros(k, _F)
    cx, cz, hw = towers[None, :, 0], towers[None, :, 1], towers[None, :, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        tx1, tx2 = (cx - hw - px) / hx[:, None], (cx + hw - px) / hx[:, None]
        tz1, tz2 = (cz - hw - pz) / hz[:, None], (cz + hw - pz) / hz[:, None]
        txn, tzn = np.minimum(tx1, tx2), np.minimum(tz1, tz2)
        t_near = np.maximum(txn, tzn)
        t_far = np.minimum(np.maximum(tx1, tx2), np.maximum(tz1, tz2))
        hit = (t_far >= t_near) & (t_near > 0)
    t_near = np.where(hit, t_near, np.inf)
    j = t_near.argmin(axis=1)
    rows = np.arange(k)
    idx = np.where(np.isfinite(t_near[rows, j]), j, -1)
    axis = (tzn[rows, j] > txn[rows, j]).astype(np.int8)
    plane_x = np.where(hx > 0, cx[0, j] - hw[0, j], cx[0, j] + hw[0, j])
    plane_z = np.where(hz > 0, cz[0, j] - hw[0, j], cz[0, j] + hw[0, j])
    return idx, axis, np.where(axis == 0, plane_x, plane_z).astype(_F)


def _fract(x: np.ndarray) -> np.ndarray:
    return x - np.floor(x)


def _square_wave(x: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Box-filtered square wave of period 2 in [-1, 1] (+1 on [0, 1)); `width` is the filter size."""
    w = np.maximum(width, _F(1e-3))
    tri = np.abs(_fract((x - 0.5 * w) * 0.5) - 0.5) - np.abs(_fract((x + 0.5 * w) * 0.5) - 0.5)
    return np.clip(2.0 * tri / w, -1.0, 1.0)


def _lines(x: np.ndarray, period: float, line_m: float, footprint: np.ndarray) -> np.ndarray:
    """Coverage in [0, 1] of thin lines at multiples of `period`, widened and dimmed by the footprint."""
    dist = np.abs(_fract(x / period + 0.5) - 0.5) * period
    width = np.maximum(footprint, line_m)
    return np.clip(1.0 - dist / width, 0.0, 1.0) * (line_m / width)


def _hash01(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = (a.astype(np.int64) * 73856093) ^ (b.astype(np.int64) * 19349663)
    return ((h >> 4) & 1023).astype(_F) / _F(1023.0)


def _value_noise(noise: np.ndarray, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    p = noise.shape[0]
    x0, z0 = np.floor(x), np.floor(z)
    fx, fz = x - x0, z - z0
    fx, fz = fx * fx * (3 - 2 * fx), fz * fz * (3 - 2 * fz)
    i0, j0 = x0.astype(np.int64) % p, z0.astype(np.int64) % p
    i1, j1 = (i0 + 1) % p, (j0 + 1) % p
    top = noise[j0, i0] * (1 - fx) + noise[j0, i1] * fx
    bottom = noise[j1, i0] * (1 - fx) + noise[j1, i1] * fx
    return top * (1 - fz) + bottom * fz


def _fog(rgb: np.ndarray, dist: np.ndarray, fog_rgb: np.ndarray, scale: float = 1.0) -> np.ndarray:
    keep = np.exp(-dist * _F(scale / FOG_DISTANCE_M))[:, None]
    return rgb * keep + fog_rgb * (1.0 - keep)


def _shade_sky(wm: WorldMap, dx, dy, dz, azimuth) -> np.ndarray:
    sky = wm.sky
    norm = np.sqrt(dx * dx + dy * dy + dz * dz)
    up = np.clip(-dy / norm, 0.0, 1.0)  # sine of the elevation
    rgb = sky.horizon_rgb + (sky.zenith_rgb - sky.horizon_rgb) * np.sqrt(up)[:, None]
    # Far mountains: a ridge over azimuth, a pure function of direction (a yaw cue with no parallax).
    freq, amp, phase = sky.mountain_harmonics.T
    ridge = (amp[None, :] * np.sin(azimuth[:, None] * freq[None, :] + phase[None, :])).sum(axis=1)
    ridge = 0.035 + 0.05 * (ridge / amp.sum() * 0.5 + 0.5)
    mountain = np.clip((ridge - up) * 400.0, 0.0, 1.0)[:, None]
    shade = sky.mountain_rgb * (0.85 + 2.0 * np.minimum(up, 0.1))[:, None]
    rgb = rgb * (1 - mountain) + (0.6 * shade + 0.4 * sky.horizon_rgb) * mountain
    # Clouds on a plane far above, seen only well above the horizon.
    lift = np.maximum(-dy, 1e-3)
    cx, cz = dx / lift * 1.5 + 7.0, dz / lift * 1.5 + 3.0
    n = 0.65 * _value_noise(sky.cloud_noise, cx, cz) + 0.35 * _value_noise(sky.cloud_noise, cx * 2.3 + 5, cz * 2.3)
    cover = (np.clip((n - 0.52) * 5.0, 0.0, 1.0) * np.clip((up - 0.05) * 8.0, 0.0, 1.0))[:, None]
    rgb = rgb * (1 - 0.85 * cover) + _F(0.85) * 0.97 * cover
    # Sun disc and glow.
    s = np.clip((dx * sky.sun_dir[0] + dy * sky.sun_dir[1] + dz * sky.sun_dir[2]) / norm, 0.0, 1.0)
    glow = s * s
    for _ in range(4):
        glow = glow * glow  # s^32
    disc = np.clip((s - 0.99925) / 0.0003, 0.0, 1.0)
    rgb = rgb + (0.35 * glow)[:, None] * np.array([1.0, 0.9, 0.7], _F)
    return rgb * (1 - disc[:, None]) + disc[:, None] * np.array([1.0, 0.98, 0.88], _F)


def _light(axis: np.ndarray, sign: np.ndarray, sun: np.ndarray) -> np.ndarray:
    """Directional light on a vertical face with normal sign·(x or z axis): ambient + sun (Lambert)."""
    lam = sign * np.where(axis == 0, sun[0], sun[2]) / np.hypot(sun[0], sun[2])
    return 0.62 + 0.38 * np.maximum(lam, 0.0) - 0.1 * np.maximum(-lam, 0.0)


def _shade_walls(wm: WorldMap, hx, hy, hz, axis, sign, footprint) -> np.ndarray:
    cfg = wm.config
    n, cell = cfg.size_cells, cfg.cell_m
    u = np.where(axis == 0, hz, hx)  # along the face
    v = np.maximum(wm.floor_y - hy, 0.0)  # height above the floor
    nudge = 1e-3 * sign  # step just behind the face, into the wall cell
    col = np.floor((hx - wm.origin_xz[0] - np.where(axis == 0, nudge, 0.0)) / cell).astype(np.int64)
    row = np.floor((hz - wm.origin_xz[1] - np.where(axis == 1, nudge, 0.0)) / cell).astype(np.int64)
    flat = np.clip(row, 0, n - 1) * n + np.clip(col, 0, n - 1)
    base = wm.wall_rgb.reshape(-1, 3)[flat]
    tex = wm.wall_texture.reshape(-1)[flat]

    course = np.floor(v / 0.25)
    brick_u = u / 0.5 + 0.5 * (course % 2)
    mortar = np.maximum(_lines(v, 0.25, 0.025, footprint), _lines(brick_u * 0.5, 0.5, 0.025, footprint))
    vary = np.clip(1.0 - footprint / 0.25, 0.0, 1.0)
    bricks = (0.93 + 0.14 * (_hash01(course, np.floor(brick_u)) - 0.5) * vary) * (1.0 - 0.45 * mortar)
    panels = (0.88 + 0.1 * _square_wave(u / 0.3, footprint / 0.3)) * (1.0 - 0.5 * _lines(v, 1.2, 0.06, footprint))
    checks = 0.86 + 0.12 * _square_wave(u / 0.3, footprint / 0.3) * _square_wave(v / 0.3, footprint / 0.3)
    frame = np.maximum(_lines(u, 0.75, 0.08, footprint), _lines(v - 0.35, 0.9, 0.06, footprint))
    windows = np.where((v > 0.35) & (v < 1.55), 0.6 + 0.35 * frame, 1.0 - 0.3 * _lines(v, 0.35, 0.03, footprint))
    patterns = {BRICKS: bricks, PANELS: panels, CHECKS: checks, WINDOWS: windows}
    factor = np.choose(tex, [patterns[k] for k in range(NUM_TEXTURES)])
    glass = (tex == WINDOWS) & (v > 0.35) & (v < 1.55)
    rgb = base * factor[:, None]
    rgb = np.where(glass[:, None], rgb * np.array([0.55, 0.7, 0.95], _F) + 0.05, rgb)
    occlusion = 0.78 + 0.22 * np.clip(v / 0.35, 0.0, 1.0)  # darker where walls meet the floor
    return rgb * (_light(axis, sign, wm.sky.sun_dir) * occlusion)[:, None]


def _shade_towers(wm: WorldMap, tid, hy, axis, sign, footprint) -> np.ndarray:
    v = wm.floor_y - hy
    height = wm.towers[tid, 3]
    bands = 0.85 + 0.15 * _square_wave(v / 0.4, footprint / 0.4)
    cap = np.clip((v - (height - 0.6)) * 8.0, 0.0, 1.0)  # a bright crown near the top
    rgb = wm.tower_rgb[tid] * (bands * _light(axis, sign, wm.sky.sun_dir))[:, None]
    return rgb * (1 - cap[:, None]) + cap[:, None] * (0.5 + 0.5 * wm.tower_rgb[tid])


def _shade_floor(wm: WorldMap, hx, hz, footprint) -> np.ndarray:
    cfg = wm.config
    n, cell = cfg.size_cells, cfg.cell_m
    col = np.clip(np.floor((hx - wm.origin_xz[0]) / cell).astype(np.int64), 0, n - 1)
    row = np.clip(np.floor((hz - wm.origin_xz[1]) / cell).astype(np.int64), 0, n - 1)
    tint = wm.floor_rgb.reshape(-1, 3)[row * n + col]
    tile = cell / 2
    check = _square_wave(hx / tile, footprint / tile) * _square_wave(hz / tile, footprint / tile)
    grout = np.maximum(_lines(hx, cell, 0.03, footprint), _lines(hz, cell, 0.03, footprint))
    return tint * ((0.88 + 0.1 * check) * (1.0 - 0.35 * grout))[:, None]


def render_layers(wm: WorldMap, c2w: np.ndarray, intrinsics: Intrinsics, height_px: int, width_px: int) -> RenderLayers:
    """Ray-cast one view: colour, depth, hit kind and tower id per pixel."""
    pose = np.asarray(c2w, dtype=np.float64)
    if pose.shape != (4, 4):
        raise ValueError(f"c2w must be 4×4, got {pose.shape}")
    rot = pose[:3, :3]
    px, py, pz = (float(v) for v in pose[:3, 3])  # python floats keep the per-pixel math in float32
    d = rot.astype(_F) @ _camera_rays(intrinsics, height_px, width_px)  # [3, N]
    dx, dy, dz = d[0], d[1], d[2]
    fx = max(intrinsics.fx, intrinsics.fy)

    # Azimuth bins, relative to the camera heading so the visible range is contiguous.
    fwd = rot[:, 2] if np.hypot(rot[0, 2], rot[2, 2]) > 1e-6 else -rot[:, 1]
    yaw = float(np.arctan2(fwd[0], fwd[2]))
    rel = np.arctan2(dx, dz) - _F(yaw)
    rel = (rel + _F(np.pi)) % _F(2 * np.pi) - _F(np.pi)
    lo, hi = float(rel.min()), float(rel.max())
    num_bins = int(np.clip(np.ceil((hi - lo) * fx * BINS_PER_PIXEL), 1, 8 * width_px))
    step = max(hi - lo, 1e-9) / num_bins
    bins = np.minimum(((rel - _F(lo)) * _F(1.0 / step)).astype(np.int32), num_bins - 1)
    centres = yaw + lo + (np.arange(num_bins) + 0.5) * step
    bx, bz = np.sin(centres).astype(_F), np.cos(centres).astype(_F)

    # First wall face per bin; each pixel intersects its own ray with that face's plane.
    tx, plane_x, sign_x = _cast_faces(wm.x_faces, px, pz, bx, bz)
    tz, plane_z, sign_z = _cast_faces(wm.z_faces, pz, px, bz, bx)
    face_axis = (tz < tx).astype(np.int8)
    face_num = np.where(face_axis == 0, plane_x - _F(px), plane_z - _F(pz)).astype(_F)
    face_num[~np.isfinite(np.minimum(tx, tz))] = np.nan  # outside the map: no wall in this bin
    face_sign = np.where(face_axis == 0, sign_x, sign_z).astype(_F)
    pix_axis = face_axis[bins]
    with np.errstate(divide="ignore", invalid="ignore"):
        t_wall = face_num[bins] / np.where(pix_axis == 0, dx, dz)
        t_wall = np.where(t_wall > 0, t_wall, np.inf)
        t_wall = np.where(py + t_wall * dy >= wm.wall_top_y, t_wall, np.inf)  # rays over the top miss
        t_floor = np.where(dy > 1e-7, (wm.floor_y - py) / dy, np.inf)

    best = np.minimum(t_floor, t_wall)
    kind = np.where(np.isfinite(t_floor), FLOOR, SKY).astype(np.uint8)
    kind[t_wall < t_floor] = WALL_HIT
    tower_id = np.full(dx.shape, -1, dtype=np.int8)

    t_idx, t_axis, t_plane = _cast_towers(wm.towers, px, pz, bx, bz)
    if (t_idx >= 0).any():
        t_num = np.where(t_axis == 0, t_plane - _F(px), t_plane - _F(pz)).astype(_F)
        pix_tower = t_idx[bins]
        with np.errstate(divide="ignore", invalid="ignore"):
            t_tower = t_num[bins] / np.where(t_axis[bins] == 0, dx, dz)
            top = wm.floor_y - wm.towers[np.maximum(pix_tower, 0), 3]
            ok = (pix_tower >= 0) & (t_tower > 0) & (py + t_tower * dy >= top) & (t_tower < best)
        kind[ok] = TOWER_HIT
        tower_id[ok] = pix_tower[ok]
        best = np.where(ok, t_tower, best)

    norm = np.sqrt(dx * dx + dy * dy + dz * dz)
    depth = (best * norm).astype(_F)
    rgb = np.empty((dx.shape[0], 3), dtype=_F)
    fog = wm.sky.horizon_rgb
    inv_f = _F(1.0 / fx)

    idx = np.nonzero(kind == SKY)[0]
    if idx.size:
        rgb[idx] = _shade_sky(wm, dx[idx], dy[idx], dz[idx], rel[idx] + _F(yaw))
    idx = np.nonzero(kind == FLOOR)[0]
    if idx.size:
        t = best[idx]
        cos_inc = np.maximum(dy[idx] / norm[idx], 0.05)
        rgb[idx] = _fog(
            _shade_floor(wm, px + t * dx[idx], pz + t * dz[idx], depth[idx] * inv_f / cos_inc), depth[idx], fog
        )
    idx = np.nonzero(kind == WALL_HIT)[0]
    if idx.size:
        t, b = best[idx], bins[idx]
        axis = face_axis[b]
        cos_inc = np.maximum(np.abs(np.where(axis == 0, dx[idx], dz[idx])) / norm[idx], 0.1)
        hits = (px + t * dx[idx], py + t * dy[idx], pz + t * dz[idx])
        rgb[idx] = _fog(_shade_walls(wm, *hits, axis, face_sign[b], depth[idx] * inv_f / cos_inc), depth[idx], fog)
    idx = np.nonzero(kind == TOWER_HIT)[0]
    if idx.size:
        axis = t_axis[bins[idx]]
        tid = tower_id[idx].astype(np.int64)
        # Entering face normal points back towards the camera along its axis.
        sign = -np.sign(np.where(axis == 0, dx[idx], dz[idx])).astype(_F)
        shaded = _shade_towers(wm, tid, py + best[idx] * dy[idx], axis, sign, depth[idx] * inv_f)
        rgb[idx] = _fog(shaded, depth[idx], fog, scale=0.4)  # landmarks stay visible from afar

    out = (np.clip(rgb, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    shape = (height_px, width_px)
    return RenderLayers(
        rgb=out.reshape(*shape, 3),
        depth_m=depth.reshape(shape),
        kind=kind.reshape(shape),
        tower_id=tower_id.reshape(shape),
    )


def render_view(wm: WorldMap, c2w: np.ndarray, intrinsics: Intrinsics, height_px: int, width_px: int) -> np.ndarray:
    """[H, W, 3] uint8 colour of one view."""
    return render_layers(wm, c2w, intrinsics, height_px, width_px).rgb
