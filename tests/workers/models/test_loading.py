"""Strict checkpoint loading: the released layout round-trips bit-exactly; every mismatch is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from workers.controls import ChunkControl
from workers.models import components, loading
from workers.models.presets import TINY
from workers.serial_engine import SerialEngine

CPU = torch.device("cpu")
SHARD_2 = "model-00002-of-00002.safetensors"


def _assert_state_equal(module: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = module.state_dict()
    assert set(got) == set(expected)
    for key, want in expected.items():
        assert got[key].shape == want.shape, key
        assert got[key].dtype == torch.float32, key
        assert torch.equal(got[key], want), f"{key} differs after loading"


def _shard_of(ckpt, key: str) -> str:
    return ckpt.weight_map[key]


# ---- round trips ----


def test_fixture_uses_both_shards(tiny_checkpoint) -> None:
    shards = set(tiny_checkpoint.weight_map.values())
    assert len(shards) == 2
    assert loading.dit_shards(tiny_checkpoint.path) == [
        tiny_checkpoint.path / loading.DIT_SUBDIR / name for name in sorted(shards)
    ]
    assert loading.read_dit_shapes(tiny_checkpoint.path) == {k: tuple(v.shape) for k, v in tiny_checkpoint.dit.items()}


def test_dit_round_trip_is_exact(tiny_checkpoint) -> None:
    dit = components.load_dit(TINY, CPU, tiny_checkpoint.path)
    _assert_state_equal(dit, tiny_checkpoint.dit)


def test_vae_round_trip_is_exact(tiny_checkpoint) -> None:
    vae = components.load_vae(TINY, CPU, tiny_checkpoint.path)
    _assert_state_equal(vae, tiny_checkpoint.vae)


def test_text_encoder_round_trip_is_exact(tiny_checkpoint) -> None:
    encoder = components.load_text_encoder(TINY, CPU, tiny_checkpoint.path)
    _assert_state_equal(encoder.encoder, tiny_checkpoint.t5)
    # The tiny preset's byte tokenizer needs no file in the checkpoint, and the encoder runs.
    (emb,) = encoder.encode(["a walk"])
    assert emb.shape == (len("a walk") + 1, TINY.t5.dim)
    assert torch.isfinite(emb).all()


def test_checkpoint_differs_from_other_seeds(tiny_checkpoint) -> None:
    # Guards the round-trip tests against comparing two copies of some default initialisation.
    other = components.load_dit(TINY, CPU, None, weights_seed=0).state_dict()
    key = "blocks.0.self_attn.q.weight"
    assert not torch.equal(other[key], tiny_checkpoint.dit[key])


def test_loaded_modules_are_materialised_on_target_device_and_dtype(tiny_checkpoint) -> None:
    loaded = {
        "dit": components.load_dit(TINY, CPU, tiny_checkpoint.path),
        "vae": components.load_vae(TINY, CPU, tiny_checkpoint.path),
        "t5": components.load_text_encoder(TINY, CPU, tiny_checkpoint.path).encoder,
    }
    for name, module in loaded.items():
        tensors = list(module.named_parameters()) + list(module.named_buffers())
        assert tensors, name
        for key, t in tensors:
            assert not t.is_meta, f"{name}.{key} left on the meta device"
            assert t.device == CPU, f"{name}.{key} on {t.device}"
            assert t.dtype == torch.float32, f"{name}.{key} is {t.dtype}"
            assert not t.requires_grad, f"{name}.{key} requires grad"
        assert not module.training, name


def test_dit_weights_are_converted_to_the_target_dtype(tmp_path, tiny_checkpoint) -> None:
    half = {k: v.to(torch.bfloat16) for k, v in tiny_checkpoint.dit.items()}
    loading_dir = tmp_path / "bf16"
    (loading_dir / loading.DIT_SUBDIR).mkdir(parents=True)
    save_file(half, str(loading_dir / loading.DIT_SUBDIR / "model.safetensors"))  # single-file layout
    dit = components.load_dit(TINY, CPU, loading_dir)
    for key, value in dit.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, half[key].float()), key


def test_missing_dit_weights_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        components.load_dit(TINY, CPU, tmp_path)


def test_missing_vae_file_is_file_not_found(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    (ckpt / loading.VAE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"Wan2\.1_VAE\.pth"):
        components.load_vae(TINY, CPU, ckpt)


def test_serial_engine_from_checkpoint_matches_random_weights_engine(tiny_checkpoint, single_thread_torch) -> None:
    image = np.random.default_rng(0).integers(0, 256, size=(96, 160, 3), dtype=np.uint8)
    control = ChunkControl.from_keys(["w", "l"])
    results = []
    for engine in (
        SerialEngine.load("tiny", tiny_checkpoint.path),
        SerialEngine.load("tiny", None, weights_seed=tiny_checkpoint.weights_seed),
    ):
        session = engine.create_session(image, prompt="a walk", seed=5, chunk_latent_frames=2)
        results.append(session.step(control))
    from_ckpt, from_seed = results
    assert from_ckpt.frames.shape == (5, TINY.height_px, TINY.width_px, 3)
    assert from_ckpt.frames.dtype == np.uint8
    assert np.array_equal(from_ckpt.frames, from_seed.frames)
    assert torch.equal(from_ckpt.latents, from_seed.latents)
    # Not a constant image: the weights actually shaped the output.
    assert from_ckpt.frames.std() > 1.0


# ---- mismatches ----


def test_missing_dit_key_is_named(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    key = "head.head.weight"
    assert _shard_of(tiny_checkpoint, key) == SHARD_2
    tiny_checkpoint.edit_shard(ckpt, SHARD_2, lambda state: state.pop(key))
    with pytest.raises(loading.CheckpointError) as info:
        components.load_dit(TINY, CPU, ckpt)
    message = str(info.value)
    assert "1 missing key(s): head.head.weight" in message
    assert "unexpected" not in message and "mis-shaped" not in message
    assert isinstance(info.value, ValueError)


def test_misshaped_dit_key_names_key_and_both_shapes(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    key = "blocks.1.self_attn.q.weight"
    assert tuple(tiny_checkpoint.dit[key].shape) == (128, 128)

    def reshape(state: dict[str, torch.Tensor]) -> None:
        state[key] = torch.zeros(128, 64)

    tiny_checkpoint.edit_shard(ckpt, _shard_of(tiny_checkpoint, key), reshape)
    with pytest.raises(loading.CheckpointError) as info:
        components.load_dit(TINY, CPU, ckpt)
    assert f"mis-shaped {key}: expected [128, 128], found [128, 64]" in str(info.value)
    assert "missing" not in str(info.value)


def test_unexpected_dit_key_is_named(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    key = "blocks.0.cam_extra_layer.weight"

    def add(state: dict[str, torch.Tensor]) -> None:
        state[key] = torch.zeros(4, 4)

    tiny_checkpoint.edit_shard(ckpt, "model-00001-of-00002.safetensors", add)
    with pytest.raises(loading.CheckpointError, match=r"1 unexpected key\(s\): blocks\.0\.cam_extra_layer\.weight"):
        components.load_dit(TINY, CPU, ckpt)


def test_all_dit_problems_are_reported_together(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")

    def break_it(state: dict[str, torch.Tensor]) -> None:
        state.pop("head.head.weight")
        state.pop("head.head.bias")
        state["head.head.extra"] = torch.zeros(1)
        state["head.modulation"] = torch.zeros(1, 2, 3)

    assert _shard_of(tiny_checkpoint, "head.modulation") == SHARD_2
    tiny_checkpoint.edit_shard(ckpt, SHARD_2, break_it)
    with pytest.raises(loading.CheckpointError) as info:
        components.load_dit(TINY, CPU, ckpt)
    message = str(info.value)
    assert message.startswith("DiT: checkpoint does not match the preset")
    assert "2 missing key(s): head.head.bias, head.head.weight" in message
    assert "1 unexpected key(s): head.head.extra" in message
    want = list(tiny_checkpoint.dit["head.modulation"].shape)
    assert f"mis-shaped head.modulation: expected {want}, found [1, 2, 3]" in message


def test_missing_vae_key_is_named(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    state = dict(tiny_checkpoint.vae)
    key = sorted(state)[len(state) // 2]
    del state[key]
    torch.save(state, ckpt / loading.VAE_FILE)
    with pytest.raises(loading.CheckpointError) as info:
        components.load_vae(TINY, CPU, ckpt)
    assert str(info.value).startswith("VAE:")
    assert key in str(info.value)


def test_misshaped_t5_key_is_named(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    state = dict(tiny_checkpoint.t5)
    key = "token_embedding.weight"
    assert tuple(state[key].shape) == (TINY.t5.vocab_size, TINY.t5.dim)
    state[key] = torch.zeros(100, TINY.t5.dim)
    torch.save(state, ckpt / loading.T5_FILE)
    with pytest.raises(loading.CheckpointError) as info:
        components.load_text_encoder(TINY, CPU, ckpt)
    assert f"mis-shaped {key}: expected [{TINY.t5.vocab_size}, {TINY.t5.dim}], found [100, {TINY.t5.dim}]" in str(
        info.value
    )


def test_pth_that_is_not_a_state_dict_is_rejected(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    torch.save([torch.zeros(1)], ckpt / loading.VAE_FILE)
    with pytest.raises(loading.CheckpointError, match="does not hold a state dict"):
        components.load_vae(TINY, CPU, ckpt)


# ---- compare_shapes / KeyReport ----


def test_compare_shapes_sorts_missing_unexpected_and_misshaped() -> None:
    expected = {"b": (3,), "a": (1, 2), "c": (4,), "e": (2, 2), "z": (1,)}
    found = {"a": (1, 2), "b": (4,), "e": (2, 3), "d": (5,), "y": (7,)}
    report = loading.compare_shapes(expected, found)
    assert report.missing == ("c", "z")
    assert report.unexpected == ("d", "y")
    assert report.misshaped == (("b", (3,), (4,)), ("e", (2, 2), (2, 3)))
    assert not report.ok


def test_compare_shapes_ok_only_when_identical() -> None:
    shapes = {"w": (2, 3), "b": (3,)}
    assert loading.compare_shapes(shapes, dict(shapes)).ok
    assert loading.compare_shapes({}, {}).ok
    assert not loading.compare_shapes(shapes, {"w": (2, 3)}).ok
    assert not loading.compare_shapes({"w": (2, 3)}, shapes).ok
    # Same element count, different shape: still mis-shaped.
    assert loading.compare_shapes({"w": (2, 3)}, {"w": (3, 2)}).misshaped == (("w", (2, 3), (3, 2)),)
    # Scalars compare by shape too.
    assert loading.compare_shapes({"s": ()}, {"s": (1,)}).misshaped == (("s", (), (1,)),)


def test_key_report_describe_truncates_long_lists() -> None:
    expected = {f"k{i:02d}": (1,) for i in range(25)}
    expected.update({f"m{i:02d}": (2,) for i in range(23)})
    found = {f"m{i:02d}": (3,) for i in range(23)}
    text = loading.compare_shapes(expected, found).describe("DiT", limit=20)
    lines = text.splitlines()
    assert lines[0] == "DiT: checkpoint does not match the preset"
    assert lines[1].startswith("  25 missing key(s): k00, k01,")
    assert lines[1].endswith("k19, … (+5)")
    assert "k20" not in text
    assert sum(line.startswith("  mis-shaped ") for line in lines) == 20
    assert lines[-1] == "  … and 3 more mis-shaped keys"
