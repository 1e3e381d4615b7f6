"""Matrix-Game 2.0's DiT: the released key set, shapes, action windows, and the three caches'
staging and commit. (Numbers against FastVideo's implementation: tests/parity/test_matrix_game_parity.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from workers.models.matrix_game.action_module import ActionRope, UnweightedRMSNorm
from workers.models.matrix_game.actions import ChunkActions, action_windows
from workers.models.matrix_game.cache import MatrixGameCache
from workers.models.matrix_game.config import GTA_DRIVE, TEMPLERUN, UNIVERSAL, MatrixGameConfig
from workers.models.matrix_game.dit import MatrixGameDiT, strip_release_prefix
from workers.models.random_init import init_random_weights

TINY = MatrixGameConfig(
    keyboard_dim=4,
    mouse_dim=2,
    local_attn_size_frames=6,
    dim=64,
    ffn_dim=96,
    num_layers=3,
    num_heads=2,
    freq_dim=32,
    image_dim=40,
    image_tokens=9,
    action_blocks=2,
    action_heads=2,
    action_head_dim=16,
    keyboard_embed_dim=8,
)
LAT_H, LAT_W = 4, 6
TOKENS = (LAT_H // 2) * (LAT_W // 2)
CHUNK = TINY.chunk_frames


def released_shapes(keyboard_dim: int, mouse: bool, action_blocks: int = 15) -> dict[str, tuple[int, ...]]:
    """The released `CausalWanModel`'s state dict for the 1.3B shape, written out from its
    constructor (Matrix-Game-2/wan/modules/causal_model.py and action_module.py)."""
    d, ffn, hidden = 1536, 8960, 1024
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (d, 36, 1, 2, 2),
        "patch_embedding.bias": (d,),
        "time_embedding.0.weight": (d, 256),
        "time_embedding.0.bias": (d,),
        "time_embedding.2.weight": (d, d),
        "time_embedding.2.bias": (d,),
        "time_projection.1.weight": (6 * d, d),
        "time_projection.1.bias": (6 * d,),
        "head.head.weight": (64, d),
        "head.head.bias": (64,),
        "head.modulation": (1, 2, d),
        "img_emb.proj.0.weight": (1280,),
        "img_emb.proj.0.bias": (1280,),
        "img_emb.proj.1.weight": (1280, 1280),
        "img_emb.proj.1.bias": (1280,),
        "img_emb.proj.3.weight": (d, 1280),
        "img_emb.proj.3.bias": (d,),
        "img_emb.proj.4.weight": (d,),
        "img_emb.proj.4.bias": (d,),
    }
    for n in range(30):
        block = f"blocks.{n}."
        shapes[block + "modulation"] = (1, 6, d)
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                shapes[f"{block}{attn}.{proj}.weight"] = (d, d)
                shapes[f"{block}{attn}.{proj}.bias"] = (d,)
            shapes[f"{block}{attn}.norm_q.weight"] = (d,)
            shapes[f"{block}{attn}.norm_k.weight"] = (d,)
        shapes[block + "norm3.weight"] = shapes[block + "norm3.bias"] = (d,)
        shapes[block + "ffn.0.weight"], shapes[block + "ffn.0.bias"] = (ffn, d), (ffn,)
        shapes[block + "ffn.2.weight"], shapes[block + "ffn.2.bias"] = (d, ffn), (d,)
        if n >= action_blocks:
            continue
        action = block + "action_model."
        shapes[action + "keyboard_embed.0.weight"] = (128, keyboard_dim)
        shapes[action + "keyboard_embed.0.bias"] = (128,)
        shapes[action + "keyboard_embed.2.weight"] = (128, 128)
        shapes[action + "keyboard_embed.2.bias"] = (128,)
        shapes[action + "key_attn_q_norm.weight"] = shapes[action + "key_attn_k_norm.weight"] = (64,)
        shapes[action + "mouse_attn_q.weight"] = (hidden, d)
        shapes[action + "keyboard_attn_kv.weight"] = (2 * hidden, 128 * 12)
        shapes[action + "proj_keyboard.weight"] = (d, hidden)
        if mouse:
            shapes[action + "mouse_mlp.0.weight"] = (hidden, 2 * 12 + d)
            shapes[action + "mouse_mlp.0.bias"] = (hidden,)
            shapes[action + "mouse_mlp.2.weight"] = (hidden, hidden)
            shapes[action + "mouse_mlp.2.bias"] = (hidden,)
            shapes[action + "mouse_mlp.3.weight"] = shapes[action + "mouse_mlp.3.bias"] = (hidden,)
            shapes[action + "t_qkv.weight"] = (3 * hidden, hidden)
            shapes[action + "img_attn_q_norm.weight"] = shapes[action + "img_attn_k_norm.weight"] = (64,)
            shapes[action + "proj_mouse.weight"] = (d, hidden)
    return shapes


def _on_meta(cfg: MatrixGameConfig) -> MatrixGameDiT:
    with torch.device("meta"):
        return MatrixGameDiT(cfg)


@pytest.mark.parametrize(
    ("cfg", "keyboard_dim", "mouse"),
    [(UNIVERSAL, 4, True), (GTA_DRIVE, 2, True), (TEMPLERUN, 7, False)],
    ids=["universal", "gta_drive", "templerun"],
)
@pytest.mark.heavy
def test_state_dict_is_the_released_one(cfg: MatrixGameConfig, keyboard_dim: int, mouse: bool) -> None:
    dit = _on_meta(cfg)
    expected = released_shapes(keyboard_dim, mouse)
    assert {k: tuple(v.shape) for k, v in dit.state_dict().items()} == expected
    # A strict load of the released names (under the release's `model.` prefix) needs no renaming.
    released = {f"model.{k}": torch.empty(shape, device="meta") for k, shape in expected.items()}
    dit.load_state_dict(strip_release_prefix(released), strict=True, assign=True)


@pytest.mark.heavy
def test_parameter_counts_of_the_released_shapes() -> None:
    counts = {
        "universal": UNIVERSAL,
        "gta_drive": GTA_DRIVE,
        "templerun": TEMPLERUN,
        "action blocks in all 30 layers (the foundation model's config)": replace(UNIVERSAL, action_blocks=30),
    }
    found = {name: sum(p.numel() for p in _on_meta(cfg).parameters()) for name, cfg in counts.items()}
    for name, count in found.items():
        print(f"matrix-game parameters, {name}: {count:,}")
    assert found["universal"] == 1_619_242_304
    assert found["templerun"] == 1_508_715_584  # no mouse path
    # The model card's "1.8B" is the shape with an action module in every block.
    assert round(found["action blocks in all 30 layers (the foundation model's config)"] / 1e9, 1) == 1.8


def test_strip_release_prefix_refuses_other_layouts() -> None:
    with pytest.raises(ValueError, match=r"under 'model\.'"):
        strip_release_prefix({"blocks.0.modulation": torch.zeros(1)})


def test_action_windows_follow_the_release() -> None:
    """Latent frame L reads video frames [4L − 12, 4L), frame 0 standing in before the start."""
    video = torch.arange(40.0)[None, :, None]  # each frame's action is its index
    rows = action_windows(video, start_frame=0, num_frames=5, cfg=TINY)[0, :, :, 0]
    assert rows[0].tolist() == [0.0] * 12
    assert rows[1].tolist() == [0.0] * 9 + [1.0, 2.0, 3.0]
    assert rows[3].tolist() == [float(j) for j in range(0, 12)]
    assert rows[4].tolist() == [float(j) for j in range(4, 16)]
    later = action_windows(video, start_frame=3, num_frames=2, cfg=TINY)[0, :, :, 0]
    torch.testing.assert_close(later, rows[3:5], atol=0, rtol=0)
    with pytest.raises(ValueError, match="video frames up to 15"):
        action_windows(video[:, :15], start_frame=3, num_frames=2, cfg=TINY)


def test_chunk_actions_check_the_model_inputs() -> None:
    keyboard, mouse = torch.zeros(1, 9, 4), torch.zeros(1, 9, 2)
    assert ChunkActions.gather(TINY, keyboard, mouse, 0, CHUNK).keyboard.shape == (1, CHUNK, 12, 4)
    with pytest.raises(ValueError, match="keys"):
        ChunkActions.gather(TINY, torch.zeros(1, 9, 7), mouse, 0, CHUNK)
    with pytest.raises(ValueError, match="mouse"):
        ChunkActions.gather(TINY, keyboard, None, 0, CHUNK)
    with pytest.raises(ValueError, match="mouse"):
        ChunkActions.gather(replace(TINY, mouse_dim=None), keyboard, mouse, 0, CHUNK)


def test_action_norm_leaves_its_weight_out() -> None:
    norm = UnweightedRMSNorm(8, eps=1e-6)
    x = torch.randn(3, 8)
    with torch.no_grad():
        norm.weight.fill_(3.0)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), expected)


def test_action_rope_turns_only_the_time_channels() -> None:
    cos, sin = ActionRope(TINY, torch.device("cpu")).cos_sin(start_frame=5, num_frames=3)
    assert cos.shape == sin.shape == (3, 1, TINY.action_head_dim // 2)
    pairs = TINY.action_rope_time_dim // 2
    assert torch.all(cos[:, :, pairs:] == 1) and torch.all(sin[:, :, pairs:] == 0)
    # The first pair turns by the frame index itself (inverse frequency 1), the next at θ^(−1/4) = 1/4.
    torch.testing.assert_close(cos[:, 0, 0].double(), torch.cos(torch.tensor([5.0, 6.0, 7.0], dtype=torch.float64)))
    torch.testing.assert_close(sin[:, 0, 1].double(), torch.sin(torch.tensor([5.0, 6.0, 7.0]) / 4).double())


def make_dit(cfg: MatrixGameConfig = TINY) -> MatrixGameDiT:
    dit = MatrixGameDiT(cfg)
    init_random_weights(dit, seed=0)
    return dit.eval()


def session_inputs(cfg: MatrixGameConfig, seed: int, chunks: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    frames = chunks * CHUNK
    video = 1 + 4 * (frames - 1)
    return {
        "cond": torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g),
        "clip": torch.randn(1, cfg.image_tokens, cfg.image_dim, generator=g),
        "keyboard": (torch.rand(1, video, cfg.keyboard_dim, generator=g) < 0.5).float(),
        "mouse": torch.randn(1, video, cfg.mouse_dim or 1, generator=g),
        "latents": torch.randn(1, 16, frames, LAT_H, LAT_W, generator=g),
    }


class Session:
    def __init__(self, dit: MatrixGameDiT, data: dict[str, torch.Tensor]) -> None:
        self.dit, self.data = dit, data
        self.cache = MatrixGameCache(dit.cfg, 1, TOKENS, torch.float32, torch.device("cpu"))
        self.image_kv = dit.image_kv(data["clip"])

    @torch.no_grad()
    def forward(self, x: torch.Tensor, t: float, commit: bool, mouse_scale: float = 1.0) -> torch.Tensor:
        start = self.cache.committed_frames
        cfg = self.dit.cfg
        mouse = None if cfg.mouse_dim is None else self.data["mouse"] * mouse_scale
        actions = ChunkActions.gather(cfg, self.data["keyboard"], mouse, start, x.shape[2])
        cond = self.data["cond"][:, :, start : start + x.shape[2]]
        return self.dit(x, cond, torch.tensor([t]), self.image_kv, actions, start, self.cache, commit)

    def clean(self, k: int) -> torch.Tensor:
        return self.data["latents"][:, :, k * CHUNK : (k + 1) * CHUNK]


@pytest.mark.parametrize("cfg", [TINY, replace(TINY, keyboard_dim=7, mouse_dim=None)], ids=["mouse", "keyboard-only"])
def test_forward_shapes_and_cache_lengths(cfg: MatrixGameConfig) -> None:
    session = Session(make_dit(cfg), session_inputs(cfg, seed=1, chunks=4))
    cache = session.cache
    for k in range(4):
        out = session.forward(torch.randn(1, 16, CHUNK, LAT_H, LAT_W), 900.0, commit=False)
        assert out.shape == (1, 16, CHUNK, LAT_H, LAT_W) and out.dtype == torch.float32
        session.forward(session.clean(k), 0.0, commit=True)
        held = min((k + 1) * CHUNK, cfg.local_attn_size_frames)
        assert cache.committed_frames == (k + 1) * CHUNK
        assert all(layer.length == held * TOKENS for layer in cache.self_attn.layers)
        assert all(layer.length == held for layer in cache.keyboard.layers)
        if cache.mouse is None:
            assert cfg.mouse_dim is None
        else:
            assert all(layer.length == held and layer.k.shape[0] == TOKENS for layer in cache.mouse.layers)
    assert len(cache.keyboard.layers) == cfg.action_blocks


def test_staged_forwards_leave_no_trace_in_any_cache() -> None:
    """Sampling forwards write the chunk's K/V after the history without committing it: a session
    that staged several noisy forwards before each commit continues exactly like one that only
    committed."""
    dit, data = make_dit(), session_inputs(TINY, seed=2, chunks=4)
    staged, committed_only = Session(dit, data), Session(dit, data)
    g = torch.Generator().manual_seed(3)
    for k in range(3):
        for t in (1000.0, 700.0):
            staged.forward(torch.randn(1, 16, CHUNK, LAT_H, LAT_W, generator=g), t, commit=False)
            assert staged.cache.committed_frames == k * CHUNK
            assert all(layer.total_committed == k * CHUNK for layer in staged.cache.keyboard.layers)
        staged.forward(staged.clean(k), 0.0, commit=True)
        committed_only.forward(committed_only.clean(k), 0.0, commit=True)
    x = torch.randn(1, 16, CHUNK, LAT_H, LAT_W, generator=g)
    assert torch.equal(staged.forward(x, 500.0, commit=False), committed_only.forward(x, 500.0, commit=False))


def test_history_and_actions_reach_the_output() -> None:
    dit, data = make_dit(), session_inputs(TINY, seed=4, chunks=2)
    x = torch.randn(1, 16, CHUNK, LAT_H, LAT_W)

    with_history = Session(dit, data)
    with_history.forward(with_history.clean(0), 0.0, commit=True)
    other_history = Session(dit, {**data, "latents": data["latents"].flip(2)})
    other_history.forward(other_history.clean(0), 0.0, commit=True)
    base = with_history.forward(x, 800.0, commit=False)
    assert (base - other_history.forward(x, 800.0, commit=False)).abs().max() > 1e-3

    # The mouse path: the same session with the chunk's mouse readings zeroed.
    assert (base - with_history.forward(x, 800.0, commit=False, mouse_scale=0.0)).abs().max() > 1e-3
    # The keyboard path: other keys for the frames this chunk reads.
    flipped = data["keyboard"].clone()
    flipped[:, 8:] = 1 - flipped[:, 8:]  # frames only the second chunk reads (chunk 0 reads up to 7)
    other_keys = Session(dit, {**data, "keyboard": flipped})
    other_keys.forward(other_keys.clean(0), 0.0, commit=True)
    assert (base - other_keys.forward(x, 800.0, commit=False)).abs().max() > 1e-3


def test_actions_after_the_window_do_not_matter() -> None:
    """The chunk at latent frames 0..2 reads video frames up to 7: later actions change nothing."""
    dit, data = make_dit(), session_inputs(TINY, seed=5, chunks=2)
    changed = {**data, "keyboard": data["keyboard"].clone(), "mouse": data["mouse"].clone()}
    changed["keyboard"][:, 8:] = 1 - changed["keyboard"][:, 8:]
    changed["mouse"][:, 8:] += 1.0
    x = torch.randn(1, 16, CHUNK, LAT_H, LAT_W)
    assert torch.equal(Session(dit, data).forward(x, 900.0, False), Session(dit, changed).forward(x, 900.0, False))


def test_a_cache_for_another_grid_is_refused() -> None:
    dit, data = make_dit(), session_inputs(TINY, seed=6, chunks=1)
    session = Session(dit, data)
    session.cache = MatrixGameCache(TINY, 1, TOKENS + 1, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="tokens per frame"):
        session.forward(torch.randn(1, 16, CHUNK, LAT_H, LAT_W), 900.0, commit=False)


def test_config_refuses_a_window_without_history() -> None:
    with pytest.raises(ValueError, match="window"):
        replace(TINY, local_attn_size_frames=3)
    with pytest.raises(ValueError, match="action_blocks"):
        replace(TINY, action_blocks=4)
