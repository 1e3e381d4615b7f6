"""A procedural grid place, deterministic from a seed: occupancy, landmark towers, materials and sky.

Frames and units (world units ≈ metres; one video frame of W moves 0.10):
- The world frame is the start camera's OpenCV frame: x right, y DOWN, z forward. The camera's eye
  is at y = 0, the floor is the plane y = +eye_height_m, wall tops are at y = eye_height_m − wall_height_m.
- The grid has `size_cells` × `size_cells` cells of `cell_m`. Cell (row, col) covers
  x ∈ [x0 + col·cell_m, x0 + (col+1)·cell_m) and z ∈ [z0 + row·cell_m, z0 + (row+1)·cell_m): rows
  grow along +z, columns along +x. (x0, z0) put the start cell's centre at the origin, and the grid
  is rotated (by quarter turns) so that the start heading (+z) looks down a long free run.
- Cell codes: FREE, WALL (a full-height block), TOWER (a free cell holding a thin, tall landmark
  pillar, drawn as its own box and blocking walkers by that box only).
"""

from __future__ import annotations

import colorsys
from collections import deque
from dataclasses import dataclass

import numpy as np

FREE, WALL, TOWER = 0, 1, 2

# Wall texture kinds (see render.py).
BRICKS, PANELS, CHECKS, WINDOWS = 0, 1, 2, 3
NUM_TEXTURES = 4


@dataclass(frozen=True)
class MapConfig:
    size_cells: int = 32
    cell_m: float = 1.0
    wall_height_m: float = 1.8
    eye_height_m: float = 0.8
    num_buildings: int = 22
    num_towers: int = 5
    tower_half_width_m: float = 0.3
    min_tower_height_m: float = 4.0
    max_tower_height_m: float = 6.5

    def __post_init__(self) -> None:
        if self.size_cells < 12:
            raise ValueError(f"size_cells must be >= 12, got {self.size_cells}")
        if not 0 < self.eye_height_m < self.wall_height_m:
            raise ValueError("need 0 < eye_height_m < wall_height_m so walls hide what is behind them")
        if not self.wall_height_m < self.min_tower_height_m <= self.max_tower_height_m:
            raise ValueError("towers must be taller than walls: wall_height_m < min_tower_height_m <= max")
        if not 0 < self.tower_half_width_m < self.cell_m / 2:
            raise ValueError("tower_half_width_m must be in (0, cell_m / 2)")


@dataclass(frozen=True)
class Sky:
    sun_dir: np.ndarray  # [3] unit vector towards the sun (world frame, so y < 0 is up)
    zenith_rgb: np.ndarray  # [3] float in [0, 1]
    horizon_rgb: np.ndarray  # [3]; also the fog colour
    mountain_rgb: np.ndarray  # [3]
    mountain_harmonics: np.ndarray  # [K, 3] (frequency, amplitude, phase) of the ridge over azimuth
    cloud_noise: np.ndarray  # [P, P] float32 in [0, 1], tiled value noise


@dataclass(frozen=True)
class WorldMap:
    config: MapConfig
    seed: int
    cells: np.ndarray  # [S, S] uint8 of FREE / WALL / TOWER
    origin_xz: tuple[float, float]  # world (x, z) of the grid's corner (row 0, col 0)
    wall_rgb: np.ndarray  # [S, S, 3] float32 base colour of each wall cell
    wall_texture: np.ndarray  # [S, S] int8 texture kind of each wall cell
    floor_rgb: np.ndarray  # [S, S, 3] float32 floor tint per cell
    x_faces: np.ndarray  # [Fx, 4] float32 (x, z_lo, z_hi, normal sign along x) wall faces of constant x
    z_faces: np.ndarray  # [Fz, 4] float32 (z, x_lo, x_hi, normal sign along z) wall faces of constant z
    towers: np.ndarray  # [L, 4] float32 (centre x, centre z, half width, height)
    tower_rgb: np.ndarray  # [L, 3] float32
    sky: Sky

    @property
    def floor_y(self) -> float:
        return self.config.eye_height_m

    @property
    def wall_top_y(self) -> float:
        return self.config.eye_height_m - self.config.wall_height_m

    def cell_of(self, x: float, z: float) -> tuple[int, int]:
        """(row, col) of the cell holding world point (x, z); may lie outside the grid."""
        cell = self.config.cell_m
        return int(np.floor((z - self.origin_xz[1]) / cell)), int(np.floor((x - self.origin_xz[0]) / cell))

    def cell_code(self, x: float, z: float) -> int:
        """FREE / WALL / TOWER of the cell holding (x, z); WALL outside the grid."""
        row, col = self.cell_of(x, z)
        n = self.config.size_cells
        return int(self.cells[row, col]) if 0 <= row < n and 0 <= col < n else WALL

    def is_free(self, x: float, z: float, radius_m: float = 0.0) -> bool:
        """True where a walker of this radius (a square of half-size radius_m) at (x, z) touches no wall,
        no tower box and stays inside the grid."""
        for ox in (-radius_m, radius_m):
            for oz in (-radius_m, radius_m):
                if self.cell_code(x + ox, z + oz) == WALL:
                    return False
        towers = self.towers
        inside = (np.abs(x - towers[:, 0]) < towers[:, 2] + radius_m) & (
            np.abs(z - towers[:, 1]) < towers[:, 2] + radius_m
        )
        return not inside.any()


def _flood(free: np.ndarray, start: tuple[int, int]) -> np.ndarray:
    """4-connected component of `free` cells containing `start`."""
    seen = np.zeros_like(free, dtype=bool)
    seen[start] = True
    queue = deque([start])
    n_rows, n_cols = free.shape
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= nr < n_rows and 0 <= nc < n_cols and free[nr, nc] and not seen[nr, nc]:
                seen[nr, nc] = True
                queue.append((nr, nc))
    return seen


def _label(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """4-connected component labels (-1 outside `mask`)."""
    labels = np.full(mask.shape, -1, dtype=np.int32)
    count = 0
    for r, c in zip(*np.nonzero(mask)):
        if labels[r, c] < 0:
            labels[_flood(mask & (labels < 0), (int(r), int(c)))] = count
            count += 1
    return labels, count


def _place_buildings(rng: np.random.Generator, cfg: MapConfig) -> np.ndarray:
    n = cfg.size_cells
    cells = np.zeros((n, n), dtype=np.uint8)
    cells[0, :] = cells[-1, :] = cells[:, 0] = cells[:, -1] = WALL
    interior = np.zeros((n, n), dtype=bool)  # buildings only; the border does not count for gaps
    placed = 0
    for _ in range(40 * cfg.num_buildings):
        if placed >= cfg.num_buildings:
            break
        if rng.random() < 0.25:  # a free-standing wall segment
            h, w = 1, int(rng.integers(3, 8))
            if rng.random() < 0.5:
                h, w = w, h
        else:
            h, w = int(rng.integers(2, 6)), int(rng.integers(2, 6))
        r, c = int(rng.integers(1, n - h)), int(rng.integers(1, n - w))
        gap = 1 if rng.random() < 0.3 else 2  # streets are mostly 2 cells wide, some alleys 1
        if interior[max(r - gap, 0) : r + h + gap, max(c - gap, 0) : c + w + gap].any():
            continue
        interior[r : r + h, c : c + w] = True
        cells[r : r + h, c : c + w] = WALL
        placed += 1
    return cells


def _forward_run(cells: np.ndarray, r: int, c: int) -> int:
    """Free cells straight ahead (+row) of (r, c) in a 3-cell wide band."""
    run = 0
    while r + run + 1 < cells.shape[0] - 1 and (cells[r + run + 1, c - 1 : c + 2] == FREE).all():
        run += 1
    return run


def _choose_start(rng: np.random.Generator, cells: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """Rotate the grid by quarter turns and pick an open start cell looking (+row) down a long free run."""
    n = cells.shape[0]
    best: list[tuple[int, int, int, int]] = []  # (score, k, r, c)
    for k in range(4):
        rot = np.rot90(cells, k)
        for r in range(1, n - 1):
            for c in range(1, n - 1):
                if (rot[r - 1 : r + 2, c - 1 : c + 2] == FREE).all():
                    centre = abs(r - n / 2) + abs(c - n / 2)
                    score = 4 * min(_forward_run(rot, r, c), 8) - int(centre)
                    best.append((score, k, r, c))
    if not best:
        raise ValueError("map has no open 3×3 area to start in; lower num_buildings")
    best.sort(reverse=True)
    top = best[: max(1, min(8, len(best)))]
    _, k, r, c = top[int(rng.integers(len(top)))]
    return np.ascontiguousarray(np.rot90(cells, k)), (r, c)


def _place_towers(rng: np.random.Generator, cells: np.ndarray, start: tuple[int, int], count: int) -> list[tuple]:
    n = cells.shape[0]
    candidates = [
        (r, c)
        for r in range(2, n - 2)
        for c in range(2, n - 2)
        if (cells[r - 1 : r + 2, c - 1 : c + 2] == FREE).all() and max(abs(r - start[0]), abs(c - start[1])) > 3
    ]
    rng.shuffle(candidates)
    chosen: list[tuple[int, int]] = []
    for cand in candidates:  # greedy spread: at least 6 cells between towers
        if len(chosen) >= count:
            break
        if all(max(abs(cand[0] - r), abs(cand[1] - c)) >= 6 for r, c in chosen):
            chosen.append(cand)
    return chosen


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(h % 1.0, s, v), dtype=np.float32)


def _extract_faces(solid: np.ndarray, origin: tuple[float, float], cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Merged wall faces between solid and non-solid cells, normals pointing into the open cell."""

    def faces_along(grid: np.ndarray, origin_across: float, origin_along: float) -> np.ndarray:
        # Boundaries between column b-1 and b of `grid`; runs merged along its rows.
        out = []
        for b in range(1, grid.shape[1]):
            left, right = grid[:, b - 1], grid[:, b]
            sign = np.where(left & ~right, 1, np.where(right & ~left, -1, 0))
            r = 0
            while r < len(sign):
                if sign[r] == 0:
                    r += 1
                    continue
                end = r
                while end + 1 < len(sign) and sign[end + 1] == sign[r]:
                    end += 1
                out.append(
                    (origin_across + b * cell, origin_along + r * cell, origin_along + (end + 1) * cell, sign[r])
                )
                r = end + 1
        return np.array(out, dtype=np.float32).reshape(-1, 4)

    x0, z0 = origin
    return faces_along(solid, x0, z0), faces_along(solid.T, z0, x0)


def _make_sky(rng: np.random.Generator) -> Sky:
    sun_az = rng.uniform(0, 2 * np.pi)
    sun_el = np.radians(rng.uniform(20, 45))
    sun = np.array([np.cos(sun_el) * np.sin(sun_az), -np.sin(sun_el), np.cos(sun_el) * np.cos(sun_az)])
    hue = rng.uniform(0.55, 0.64)
    freqs = np.array([1, 2, 3, 5, 7, 11], dtype=np.float64)
    harmonics = np.stack([freqs, rng.uniform(0.4, 1.0, 6) / freqs**0.7, rng.uniform(0, 2 * np.pi, 6)], axis=1)
    # Tileable value noise for clouds: coarse random lattice, bilinearly upsampled at render time.
    return Sky(
        sun_dir=sun.astype(np.float32),
        zenith_rgb=_hsv(hue, rng.uniform(0.55, 0.75), rng.uniform(0.7, 0.85)),
        horizon_rgb=_hsv(hue - 0.02, rng.uniform(0.12, 0.25), 0.93),
        mountain_rgb=_hsv(hue + rng.uniform(-0.12, 0.05), rng.uniform(0.2, 0.4), rng.uniform(0.5, 0.65)),
        mountain_harmonics=harmonics.astype(np.float32),
        cloud_noise=rng.random((32, 32)).astype(np.float32),
    )


def generate_map(seed: int, config: MapConfig | None = None) -> WorldMap:
    """A walkable, connected place: buildings and wall segments on streets, landmark towers, a sky."""
    cfg = config or MapConfig()
    rng = np.random.default_rng(seed)
    n, cell = cfg.size_cells, cfg.cell_m

    cells = _place_buildings(rng, cfg)
    cells, start = _choose_start(rng, cells)
    reachable = _flood(cells == FREE, start)
    cells[(cells == FREE) & ~reachable] = WALL  # no sealed pockets: every open cell can be walked to
    origin = (-(start[1] + 0.5) * cell, -(start[0] + 0.5) * cell)

    towers, tower_rgb = [], []
    hue0 = rng.random()
    for i, (r, c) in enumerate(_place_towers(rng, cells, start, cfg.num_towers)):
        cells[r, c] = TOWER
        height = rng.uniform(cfg.min_tower_height_m, cfg.max_tower_height_m)
        towers.append((origin[0] + (c + 0.5) * cell, origin[1] + (r + 0.5) * cell, cfg.tower_half_width_m, height))
        tower_rgb.append(_hsv(hue0 + i / max(cfg.num_towers, 1), 0.85, 1.0))

    # Materials: each building (wall component) its own colour and texture; the four border walls
    # each a distinct colour, so a glimpse of the boundary tells the heading.
    wall_rgb = np.zeros((n, n, 3), dtype=np.float32)
    wall_texture = np.zeros((n, n), dtype=np.int8)
    inner = cells == WALL
    inner[0, :] = inner[-1, :] = inner[:, 0] = inner[:, -1] = False
    labels, count = _label(inner)
    golden = 0.618033988749895
    h = rng.random()
    for i in range(count):
        h += golden
        wall_rgb[labels == i] = _hsv(h, rng.uniform(0.3, 0.65), rng.uniform(0.6, 0.9))
        wall_texture[labels == i] = rng.integers(NUM_TEXTURES)
    side_hue = rng.random()
    edge = slice(None)
    sides: list[tuple[int | slice, int | slice]] = [(0, edge), (n - 1, edge), (edge, 0), (edge, n - 1)]
    for i, (rows, cols) in enumerate(sides):
        wall_rgb[rows, cols] = _hsv(side_hue + i / 4, 0.55, 0.75)
        wall_texture[rows, cols] = BRICKS if i % 2 == 0 else PANELS

    # Floor: a base tone, smooth large-scale gradients across the map and a little per-cell variation.
    base = _hsv(rng.random(), rng.uniform(0.08, 0.25), rng.uniform(0.55, 0.68))
    grad_x = _hsv(rng.random(), 0.6, 1.0) - 0.5
    grad_z = _hsv(rng.random(), 0.6, 1.0) - 0.5
    rr, cc = np.meshgrid(np.linspace(-1, 1, n), np.linspace(-1, 1, n), indexing="ij")
    floor_rgb = base + 0.12 * (cc[..., None] * grad_x + rr[..., None] * grad_z)
    floor_rgb = floor_rgb * (0.93 + 0.14 * rng.random((n, n, 1)))
    floor_rgb = np.clip(floor_rgb, 0.05, 1.0).astype(np.float32)

    x_faces, z_faces = _extract_faces(cells == WALL, origin, cell)
    return WorldMap(
        config=cfg,
        seed=seed,
        cells=cells,
        origin_xz=origin,
        wall_rgb=wall_rgb,
        wall_texture=wall_texture,
        floor_rgb=floor_rgb,
        x_faces=x_faces,
        z_faces=z_faces,
        towers=np.array(towers, dtype=np.float32).reshape(-1, 4),
        tower_rgb=np.array(tower_rgb, dtype=np.float32).reshape(-1, 3),
        sky=_make_sky(rng),
    )
