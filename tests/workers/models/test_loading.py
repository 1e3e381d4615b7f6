"""Strict checkpoint loading: the released layout round-trips bit-exactly; every mismatch is named;
weights stream in one source tensor at a time."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workers.controls import ChunkControl
from workers.models import components, loading
from workers.models.dit import WanDiT
from workers.models.presets import TINY
from workers.models.vae import WanVAE
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
    with pytest.raises(
        FileNotFoundError, match=r"no DiT weights: expected .*transformers/\*\.safetensors\.index\.json"
    ):
        components.load_dit(TINY, CPU, tmp_path)


def test_missing_vae_file_is_file_not_found(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    (ckpt / loading.VAE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"Wan2\.1_VAE\.pth"):
        components.load_vae(TINY, CPU, ckpt)


@pytest.mark.heavy
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


# ---- streaming: one source tensor at a time ----


class SpySource:
    """Test double around a real `loading.TensorSource`: passes its tensors through and, each time the
    loader asks for the next one (so before that one is read), counts how many of the tensors passed
    so far are still alive. It holds them by weak reference only and yields without keeping a
    reference in its own frame, so whatever keeps one alive is the loader or the reader."""

    def __init__(self, inner: loading.TensorSource) -> None:
        self.inner = inner
        self.alive_before_read: list[int] = []
        self.refs: list[weakref.ref[torch.Tensor]] = []

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self.inner.shapes()

    def _passed(self, item: tuple[str, torch.Tensor]) -> tuple[str, torch.Tensor]:
        self.refs.append(weakref.ref(item[1]))
        return item

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        inner = self.inner.tensors()
        while True:
            self.alive_before_read.append(sum(ref() is not None for ref in self.refs))
            try:
                yield self._passed(next(inner))
            except StopIteration:
                return


class RetainingSource:
    """Test double around a real `loading.TensorSource` that keeps every tensor it passes on, so that
    a test can check afterwards that no loaded weight shares memory with one."""

    def __init__(self, inner: loading.TensorSource) -> None:
        self.inner = inner
        self.kept: list[torch.Tensor] = []

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self.inner.shapes()

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for key, tensor in self.inner.tensors():
            self.kept.append(tensor)
            yield key, tensor


def _sources(ckpt: Path) -> dict[str, tuple[type[torch.nn.Module], object, loading.TensorSource]]:
    """The tiny DiT (safetensors shards) and VAE (.pth) with their configs and sources."""
    return {
        "dit": (WanDiT, TINY.dit, loading.dit_source(ckpt)),
        "vae": (WanVAE, TINY.vae, loading.component_source(ckpt, loading.VAE_FILE, loading.VAE_SAFETENSORS)),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_streamed_fp32_checkpoint_loads_as_the_saved_tensors_cast(tiny_checkpoint, dtype) -> None:
    dit = components.load_dit(TINY, CPU, tiny_checkpoint.path, dtype=dtype)
    state = dit.state_dict()
    assert set(state) == set(tiny_checkpoint.dit)
    for key, saved in tiny_checkpoint.dit.items():
        assert saved.dtype == torch.float32
        assert state[key].dtype == dtype, key
        assert torch.equal(state[key], saved.to(dtype)), f"{key} differs from the saved tensor cast"
    for key, t in list(dit.named_parameters()) + list(dit.named_buffers()):
        assert t.device == CPU and not t.is_meta and not t.requires_grad, key


@pytest.mark.parametrize("component", ["dit", "vae"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_at_most_one_source_tensor_is_alive_during_the_load(tiny_checkpoint, component, dtype) -> None:
    cls, config, source = _sources(tiny_checkpoint.path)[component]
    spy = SpySource(source)
    module = loading.build_on_meta(lambda: cls(config))
    loading.load_strict(component, module, spy, dtype, CPU)
    assert len(spy.refs) == len(module.state_dict()), "every tensor went through the spy"
    # Whenever a tensor was about to be read, every one read before it was gone: the loader drops a
    # source before asking for the next, the reader keeps none, and the weights are copies.
    assert spy.alive_before_read == [0] * (len(spy.refs) + 1)
    assert all(ref() is None for ref in spy.refs)


@pytest.mark.parametrize("component", ["dit", "vae"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_loaded_weights_share_no_memory_with_the_source_tensors(tiny_checkpoint, component, dtype) -> None:
    cls, config, source = _sources(tiny_checkpoint.path)[component]
    retaining = RetainingSource(source)
    module = loading.load_strict(component, loading.build_on_meta(lambda: cls(config)), retaining, dtype, CPU)
    source_ptrs = {t.untyped_storage().data_ptr() for t in retaining.kept}
    weight_ptrs = [t.untyped_storage().data_ptr() for t in module.state_dict().values()]
    assert len(set(weight_ptrs)) == len(weight_ptrs), "two weights share one buffer"
    assert source_ptrs.isdisjoint(weight_ptrs), "a weight aliases a reader buffer or a file mapping"


def test_a_mismatch_is_reported_whole_before_any_tensor_is_read(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")

    def break_it(state: dict[str, torch.Tensor]) -> None:
        state.pop("head.head.weight")
        state["head.extra"] = torch.zeros(2)
        state["head.modulation"] = torch.zeros(3, 3)

    tiny_checkpoint.edit_shard(ckpt, SHARD_2, break_it)
    spy = SpySource(loading.dit_source(ckpt))
    with pytest.raises(loading.CheckpointError) as info:
        loading.load_strict("DiT", loading.build_on_meta(lambda: WanDiT(TINY.dit)), spy, torch.bfloat16, CPU)
    message = str(info.value)
    assert "1 missing key(s): head.head.weight" in message
    assert "1 unexpected key(s): head.extra" in message
    assert "mis-shaped head.modulation: expected" in message and "found [3, 3]" in message
    assert spy.refs == [] and spy.alive_before_read == [], "the shapes come from the headers: no tensor is read"


def test_header_reader_agrees_with_the_safetensors_library(tiny_checkpoint) -> None:
    for shard in loading.dit_shards(tiny_checkpoint.path):
        entries = loading.read_safetensors_header(shard)
        assert [e.begin for e in entries] == sorted(e.begin for e in entries)
        with safe_open(str(shard), framework="pt") as f:
            assert {e.key for e in entries} == set(f.keys())
            for e in entries:
                want = f.get_tensor(e.key)
                assert (e.shape, e.dtype, e.nbytes) == (tuple(want.shape), want.dtype, want.nbytes)


# ---- unreadable files are named ----


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])  # inside the last tensor's data


def _garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:16] = b"\xff" * 8  # not UTF-8, so not JSON
    path.write_bytes(bytes(data))


def _not_safetensors(path: Path) -> None:
    path.write_bytes(b"not a safetensors file" * 4)


@pytest.mark.parametrize("damage", [_truncate, _garble_header, _not_safetensors])
def test_a_corrupt_dit_shard_is_named(tmp_path, tiny_checkpoint, damage) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    shard = ckpt / loading.DIT_SUBDIR / SHARD_2
    damage(shard)
    with pytest.raises(loading.CheckpointError, match="cannot read") as info:
        components.load_dit(TINY, CPU, ckpt, dtype=torch.bfloat16)
    assert str(shard) in str(info.value)
    assert str(shard) in str(components.verify_checkpoint(TINY, ckpt)["dit"])


def test_a_corrupt_safetensors_component_file_is_named(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    path = ckpt / loading.VAE_SAFETENSORS
    save_file({k: v.contiguous() for k, v in tiny_checkpoint.vae.items()}, str(path))
    _assert_state_equal(components.load_vae(TINY, CPU, ckpt), tiny_checkpoint.vae)  # safetensors is preferred
    _truncate(path)
    with pytest.raises(loading.CheckpointError, match="truncated") as info:
        components.load_vae(TINY, CPU, ckpt)
    assert str(path) in str(info.value)


def test_a_key_stored_in_two_shards_is_named_with_both(tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    key = "head.head.bias"
    assert _shard_of(tiny_checkpoint, key) == SHARD_2
    tiny_checkpoint.edit_shard(
        ckpt, "model-00001-of-00002.safetensors", lambda state: state.update({key: tiny_checkpoint.dit[key]})
    )
    with pytest.raises(loading.CheckpointError, match="stored twice") as info:
        components.load_dit(TINY, CPU, ckpt)
    assert "model-00001-of-00002.safetensors" in str(info.value) and SHARD_2 in str(info.value)


def test_model_events_come_from_the_weights_card(tmp_path: Path) -> None:
    assert loading.model_events(TINY, None) == {}  # random weights: no card, no events
    assert loading.model_events(TINY, tmp_path) == {}  # a directory without a card
    (tmp_path / loading.MODEL_CARD).write_text('{"preset": "tiny"}')
    assert loading.model_events(TINY, tmp_path) == {}
    (tmp_path / loading.MODEL_CARD).write_text('{"events": {"night": "night falls", "day": ""}}')
    assert loading.model_events(TINY, tmp_path) == {"night": "night falls", "day": ""}
