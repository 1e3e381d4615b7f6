"""The diffusers layout: a checkpoint saved by diffusers' and transformers' own code loads into exactly
the tensors of the released layout; its name table inverts diffusers' conversion; every mismatch is
named in our names and the file's before any weight is read; `verify` names the layout.

The checkpoint is the tiny preset's (tests/conftest.py `tiny_checkpoint`): diffusers' single-file
conversion turns the DiT and VAE state dicts into diffusers names, they are loaded strictly into
diffusers' `WanTransformer3DModel` (plus the camera layers, which diffusers has no names for) and
`AutoencoderKLWan`, the umT5 weights into transformers' `UMT5EncoderModel`, and diffusers'
`WanImageToVideoPipeline.save_pretrained` writes the directory: model_index.json, config files,
safetensors (sharded by its own `max_shard_size`, or single files) and the tokenizer.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tests.parity.hf_configs import umt5_config
from tests.parity.references import reference_module
from tests.workers.models.test_loading import RetainingSource, SpySource
from workers.__main__ import main
from workers.models import checkpoint_files, components, diffusers_layout, loading
from workers.models.dit import WanDiT
from workers.models.presets import LINGBOT_14B, TINY, ModelPreset, T5Config
from workers.models.tokenizer import UMT5Tokenizer, load_tokenizer
from workers.models.vae import WanVAE

pytestmark = pytest.mark.parity

CPU = torch.device("cpu")
# Small enough that every component is split into several shards.
SHARD_SIZE = "300KB"
CAMERA_MARKS = ("patch_embedding_wancamctrl.", "c2ws_hidden_states_layer", ".cam_")
TOKENIZER_PIECES = ("▁", "▁a", "▁red", "▁car", "▁drives", "a", "r", "e", "d", "c")


def _conversions() -> ModuleType:
    return reference_module("diffusers.loaders.single_file_utils")


def _is_camera(key: str) -> bool:
    return any(mark in key for mark in CAMERA_MARKS)


def _diffusers_transformer(preset: ModelPreset) -> nn.Module:
    diffusers = reference_module("diffusers")
    c = preset.dit
    return diffusers.WanTransformer3DModel(
        patch_size=c.patch_size,
        num_attention_heads=c.num_heads,
        attention_head_dim=c.head_dim,
        in_channels=c.in_dim,
        out_channels=c.out_dim,
        text_dim=c.text_dim,
        freq_dim=c.freq_dim,
        ffn_dim=c.ffn_dim,
        num_layers=c.num_layers,
        cross_attn_norm=c.cross_attn_norm,
        qk_norm="rms_norm_across_heads",
        eps=c.eps,
    )


def _diffusers_vae(preset: ModelPreset) -> nn.Module:
    v = preset.vae
    return reference_module("diffusers").AutoencoderKLWan(
        base_dim=v.base_dim,
        z_dim=v.z_dim,
        dim_mult=list(v.dim_mult),
        num_res_blocks=v.num_res_blocks,
        temperal_downsample=list(v.temporal_downsample),
    )


def _transformers_umt5(config: T5Config) -> nn.Module:
    transformers = reference_module("transformers")
    return transformers.UMT5EncoderModel(umt5_config(config)).eval()


def _add_camera_layers(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Give diffusers' transformer the camera Linears, under the names its conversion left them."""
    for key, tensor in state.items():
        path, _, param = key.rpartition(".")
        if param != "weight" or not _is_camera(key):
            continue
        parent, _, child = path.rpartition(".")
        out_features, in_features = tensor.shape
        model.get_submodule(parent).add_module(child, nn.Linear(in_features, out_features))


def _umt5_tokenizer() -> object:
    """A small Unigram vocabulary in transformers' umT5 tokenizer class (pad 0, eos 1, unk 2)."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(piece, -1.0 - i) for i, piece in enumerate(TOKENIZER_PIECES)]
    return reference_module("transformers").T5Tokenizer(vocab=vocab, extra_ids=0)


def _save_pipeline(ckpt, root: Path, max_shard_size: str | None) -> Path:
    """The tiny checkpoint, saved as a diffusers pipeline by the libraries' own code."""
    convert = _conversions()
    diffusers = reference_module("diffusers")

    dit_state = convert.convert_wan_transformer_to_diffusers(dict(ckpt.dit))
    transformer = _diffusers_transformer(TINY)
    _add_camera_layers(transformer, dit_state)
    transformer.load_state_dict(dit_state, strict=True)

    vae = _diffusers_vae(TINY)
    vae.load_state_dict(convert.convert_wan_vae_to_diffusers(dict(ckpt.vae)), strict=True)

    # transformers has no conversion from Wan's umT5 names; the table gives each of its names ours
    # (tests/parity/test_t5_parity.py proves the mapping by running both models).
    text_encoder = _transformers_umt5(TINY.t5)
    text_encoder.load_state_dict(
        {k: ckpt.t5[diffusers_layout.T5_NAMES.to_native(k)] for k in text_encoder.state_dict()}, strict=True
    )

    pipeline = diffusers.WanImageToVideoPipeline(
        tokenizer=_umt5_tokenizer(),
        text_encoder=text_encoder,
        vae=vae,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0),
        transformer=transformer,
    )
    pipeline.save_pretrained(root, max_shard_size=max_shard_size)
    return root


@pytest.fixture(scope="module")
def sharded_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    """Read-only: each component in several shards with an index."""
    return _save_pipeline(tiny_checkpoint, tmp_path_factory.mktemp("diffusers_sharded"), SHARD_SIZE)


@pytest.fixture(scope="module")
def single_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    """Read-only: each component in one file."""
    return _save_pipeline(tiny_checkpoint, tmp_path_factory.mktemp("diffusers_single"), None)


def _shard_holding(root: Path, folder: str, stored_key: str) -> Path:
    index = root / folder / "diffusion_pytorch_model.safetensors.index.json"
    return root / folder / json.loads(index.read_text())["weight_map"][stored_key]


def _edit(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    state = load_file(str(path))
    edit(state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))


@pytest.fixture
def no_weight_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any tensor's data is read: every safetensors read goes through `_read_entry`."""

    def refuse(*args: object) -> torch.Tensor:
        raise AssertionError("a weight was read")

    monkeypatch.setattr(loading, "_read_entry", refuse)


# ---- the name tables against the libraries ----


@pytest.mark.parametrize("preset", [TINY, LINGBOT_14B], ids=["tiny", "14b"])
def test_tables_invert_diffusers_conversion_tensor_for_tensor(preset: ModelPreset) -> None:
    convert = _conversions()
    meta = components.meta_components(preset)
    for component, conversion, table in (
        ("dit", convert.convert_wan_transformer_to_diffusers, diffusers_layout.DIT_NAMES),
        ("vae", convert.convert_wan_vae_to_diffusers, diffusers_layout.vae_names(preset.vae)),
    ):
        native = meta[component].state_dict()
        stored = conversion(dict(native))
        back = {table.to_native(key): key for key in stored}
        assert len(back) == len(stored) == len(native), component
        # Identity, not equality: each stored name maps back to the very tensor it was converted from.
        assert all(stored[back[key]] is tensor for key, tensor in native.items()), component


def test_camera_layers_are_the_only_names_diffusers_does_not_know() -> None:
    convert = _conversions()
    stored = convert.convert_wan_transformer_to_diffusers(dict(components.meta_components(TINY)["dit"].state_dict()))
    diffusers_names = _diffusers_transformer(TINY).state_dict()
    unknown = set(stored) - set(diffusers_names)
    assert unknown and all(_is_camera(k) for k in unknown)
    assert set(diffusers_names) <= set(stored)
    # No shape changes between the layouts: diffusers' own modules hold the converted tensors as they are.
    assert all(tuple(diffusers_names[k].shape) == tuple(stored[k].shape) for k in diffusers_names)
    vae_stored = convert.convert_wan_vae_to_diffusers(dict(components.meta_components(TINY)["vae"].state_dict()))
    assert {k: tuple(v.shape) for k, v in _diffusers_vae(TINY).state_dict().items()} == {
        k: tuple(v.shape) for k, v in vae_stored.items()
    }


def test_umt5_table_maps_transformers_names_onto_ours_shape_for_shape() -> None:
    native = loading.state_shapes(components.meta_components(LINGBOT_14B)["t5"])
    with torch.device("meta"):
        hf = _transformers_umt5(LINGBOT_14B.t5)
    hf_shapes = loading.state_shapes(hf)
    mapped: dict[str, tuple[int, ...]] = {}
    for key, shape in hf_shapes.items():
        if key in diffusers_layout.T5_NAMES.ignored(hf_shapes):
            continue  # the tied copy of shared.weight
        mapped[diffusers_layout.T5_NAMES.to_native(key)] = shape
    assert mapped == native
    assert diffusers_layout.T5_NAMES.ignored(hf_shapes) == {"encoder.embed_tokens.weight"}


# ---- loading ----


def test_saved_pipeline_has_the_diffusers_layout(sharded_dir: Path, single_dir: Path, tiny_checkpoint) -> None:
    index = json.loads((sharded_dir / "model_index.json").read_text())
    assert index["transformer"] == ["diffusers", "WanTransformer3DModel"]
    assert index["vae"] == ["diffusers", "AutoencoderKLWan"]
    assert index["text_encoder"] == ["transformers", "UMT5EncoderModel"]
    for folder, stem in (("transformer", "diffusion_pytorch_model"), ("vae", "diffusion_pytorch_model")):
        assert len(list((sharded_dir / folder).glob(f"{stem}-*-of-*.safetensors"))) > 1
        assert (sharded_dir / folder / f"{stem}.safetensors.index.json").is_file()
        assert (single_dir / folder / f"{stem}.safetensors").is_file()
    assert len(list((sharded_dir / "text_encoder").glob("model-*-of-*.safetensors"))) > 1
    assert (single_dir / "text_encoder" / "model.safetensors").is_file()
    for root in (sharded_dir, single_dir):
        assert checkpoint_files.detect_layout(root) is checkpoint_files.Layout.DIFFUSERS
        assert checkpoint_files.missing_files(TINY, root) == []
    assert checkpoint_files.detect_layout(tiny_checkpoint.path) is checkpoint_files.Layout.RELEASED


@pytest.mark.parametrize("layout", ["sharded_dir", "single_dir"])
def test_components_load_exactly_the_released_tensors(request, tiny_checkpoint, layout: str) -> None:
    root = request.getfixturevalue(layout)
    pairs = (
        (components.load_dit(TINY, CPU, root), components.load_dit(TINY, CPU, tiny_checkpoint.path)),
        (components.load_vae(TINY, CPU, root), components.load_vae(TINY, CPU, tiny_checkpoint.path)),
        (
            components.load_text_encoder(TINY, CPU, root).encoder,
            components.load_text_encoder(TINY, CPU, tiny_checkpoint.path).encoder,
        ),
    )
    for ours, released in pairs:
        got, want = ours.state_dict(), released.state_dict()
        assert set(got) == set(want)
        for key, tensor in want.items():
            assert got[key].dtype == tensor.dtype == torch.float32, key
            assert torch.equal(got[key], tensor), f"{key} differs from the released layout's"
        assert all(not t.is_meta and not t.requires_grad for t in ours.parameters())


def test_read_dit_state_gives_native_names(sharded_dir: Path, tiny_checkpoint) -> None:
    state = loading.read_dit_state(sharded_dir, "cpu")
    assert set(state) == set(tiny_checkpoint.dit)
    assert all(torch.equal(state[k], v) for k, v in tiny_checkpoint.dit.items())
    assert loading.read_dit_shapes(sharded_dir) == {k: tuple(v.shape) for k, v in tiny_checkpoint.dit.items()}


@pytest.mark.parametrize("component", ["dit", "vae"])
def test_renamed_source_streams_one_tensor_at_a_time_into_fresh_memory(sharded_dir: Path, component: str) -> None:
    cls, config, source = {
        "dit": (WanDiT, TINY.dit, loading.dit_source(sharded_dir)),
        "vae": (WanVAE, TINY.vae, loading.vae_source(sharded_dir, TINY.vae)),
    }[component]
    assert isinstance(source, loading.RenamedSource)
    spy = SpySource(source)
    module = loading.load_strict(component, loading.build_on_meta(lambda: cls(config)), spy, torch.bfloat16, CPU)
    assert len(spy.refs) == len(module.state_dict())
    assert spy.alive_before_read == [0] * (len(spy.refs) + 1)
    assert all(ref() is None for ref in spy.refs)

    retaining = RetainingSource(source)
    module = loading.load_strict(component, loading.build_on_meta(lambda: cls(config)), retaining, torch.float32, CPU)
    source_ptrs = {t.untyped_storage().data_ptr() for t in retaining.kept}
    assert source_ptrs.isdisjoint(t.untyped_storage().data_ptr() for t in module.state_dict().values())


def test_tokenizer_is_read_from_the_tokenizer_folder(sharded_dir: Path) -> None:
    config = T5Config(text_len=6)  # the umt5 tokenizer, from a file
    tokenizer = load_tokenizer(config, sharded_dir)
    assert isinstance(tokenizer, UMT5Tokenizer)
    prompts = ["a red car", "a blue", "a red car drives a red car"]
    ids, mask = tokenizer(prompts)
    reference = reference_module("transformers").AutoTokenizer.from_pretrained(sharded_dir / "tokenizer")
    want = reference(prompts, padding="max_length", max_length=config.text_len, truncation=True)
    assert ids.tolist() == want["input_ids"]
    assert mask.tolist() == want["attention_mask"]


def test_released_names_in_the_transformer_folder_pass_through(
    tmp_path: Path, sharded_dir: Path, tiny_checkpoint
) -> None:
    # Unknown names keep their names, as in diffusers' conversion; the released names are all unknown
    # to the table, so a transformer/ file that keeps them (as FastVideo's LingBot-World 2 DiT does) loads.
    root = tmp_path / "ckpt"
    shutil.copytree(sharded_dir, root)
    shutil.rmtree(root / "transformer")
    (root / "transformer").mkdir()
    save_file(dict(tiny_checkpoint.dit), str(root / "transformer" / "diffusion_pytorch_model.safetensors"))
    state = components.load_dit(TINY, CPU, root).state_dict()
    assert all(torch.equal(state[k], v) for k, v in tiny_checkpoint.dit.items())


# ---- tied umT5 embedding ----


def _single_t5_file(tmp_path: Path, single_dir: Path) -> tuple[Path, Path]:
    root = tmp_path / "ckpt"
    shutil.copytree(single_dir, root)
    return root, root / "text_encoder" / "model.safetensors"


def test_a_tied_embedding_copy_is_neither_read_nor_checked(tmp_path: Path, single_dir: Path, tiny_checkpoint) -> None:
    root, path = _single_t5_file(tmp_path, single_dir)
    # Older transformers saves hold both names; transformers loads `shared` and ties the copy to it.
    _edit(path, lambda state: state.update({"encoder.embed_tokens.weight": torch.zeros(3, 5)}))
    encoder = components.load_text_encoder(TINY, CPU, root).encoder
    assert torch.equal(encoder.token_embedding.weight, tiny_checkpoint.t5["token_embedding.weight"])


def test_the_embedding_copy_stands_in_when_shared_is_absent(tmp_path: Path, single_dir: Path, tiny_checkpoint) -> None:
    root, path = _single_t5_file(tmp_path, single_dir)
    _edit(path, lambda state: state.update({"encoder.embed_tokens.weight": state.pop("shared.weight")}))
    encoder = components.load_text_encoder(TINY, CPU, root).encoder
    assert torch.equal(encoder.token_embedding.weight, tiny_checkpoint.t5["token_embedding.weight"])


# ---- mismatches, named in both names before any weight is read ----


def test_a_misshaped_tensor_is_named_with_its_file_before_any_weight_is_read(
    tmp_path: Path, sharded_dir: Path, no_weight_reads, capsys
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(sharded_dir, root)
    stored = "blocks.1.attn1.to_q.weight"
    shard = _shard_holding(root, "transformer", stored)
    _edit(shard, lambda state: state.update({stored: torch.zeros(128, 64)}))
    expected = (
        f"mis-shaped blocks.1.self_attn.q.weight (stored as {stored!r} in {shard}): "
        "expected [128, 128], found [128, 64]"
    )
    with pytest.raises(loading.CheckpointError) as info:
        components.load_dit(TINY, CPU, root)
    message = str(info.value)
    assert message.startswith("DiT: checkpoint does not match the preset")
    assert expected in message
    assert "missing" not in message and "unexpected" not in message

    assert main(["verify", "tiny", "--checkpoint", str(root)]) == 1
    out = capsys.readouterr()
    assert expected in out.out
    assert "vae: ok" in out.out and "t5: ok" in out.out
    assert out.out.startswith("layout: diffusers")


def test_missing_and_unexpected_keys_are_named(tmp_path: Path, sharded_dir: Path, no_weight_reads) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(sharded_dir, root)
    shard = _shard_holding(root, "transformer", "proj_out.weight")

    def break_it(state: dict[str, torch.Tensor]) -> None:
        state.pop("proj_out.weight")
        state["blocks.0.attn1.to_extra.weight"] = torch.zeros(2)

    _edit(shard, break_it)
    with pytest.raises(loading.CheckpointError) as info:
        components.load_dit(TINY, CPU, root)
    message = str(info.value)
    assert "1 missing key(s): head.head.weight\n" in message
    assert f"1 unexpected key(s): blocks.0.attn1.to_extra.weight (stored in {shard})" in message
    assert "mis-shaped" not in message


def test_a_tensor_stored_under_both_names_is_refused(
    tmp_path: Path, sharded_dir: Path, tiny_checkpoint, no_weight_reads
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(sharded_dir, root)
    shard = _shard_holding(root, "transformer", "proj_out.bias")
    _edit(shard, lambda state: state.update({"head.head.bias": tiny_checkpoint.dit["head.head.bias"]}))
    with pytest.raises(loading.CheckpointError, match=r"'head\.head\.bias' is stored twice") as info:
        components.load_dit(TINY, CPU, root)
    assert "'proj_out.bias'" in str(info.value) and str(shard) in str(info.value)


def test_a_vae_key_is_reported_in_native_and_diffusers_names(
    tmp_path: Path, sharded_dir: Path, tiny_checkpoint, no_weight_reads
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(sharded_dir, root)
    stored = "decoder.up_blocks.1.resnets.0.conv_shortcut.weight"
    shard = _shard_holding(root, "vae", stored)
    _edit(shard, lambda state: state.update({stored: torch.zeros(1, 1, 1, 1, 1)}))
    results = components.verify_checkpoint(TINY, root)
    report = results["vae"]
    assert isinstance(report, loading.KeyReport)
    want = list(tiny_checkpoint.vae["decoder.upsamples.4.shortcut.weight"].shape)
    assert report.misshaped == (("decoder.upsamples.4.shortcut.weight", tuple(want), (1, 1, 1, 1, 1)),)
    assert f"(stored as {stored!r} in {shard})" in report.describe("vae")


# ---- missing files and verify ----


def test_verify_names_the_layout_and_passes(capsys, sharded_dir: Path, tiny_checkpoint, no_weight_reads) -> None:
    assert main(["verify", "tiny", "--checkpoint", str(sharded_dir)]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == [
        "layout: diffusers (model_index.json found: transformer/, vae/, text_encoder/, tokenizer/)",
        "dit: ok",
        "vae: ok",
        "t5: ok",
        "checkpoint matches the preset",
    ]
    assert main(["verify", "tiny", "--checkpoint", str(tiny_checkpoint.path)]) == 0
    assert capsys.readouterr().out.startswith("layout: released (no model_index.json")


def test_missing_components_are_named(tmp_path: Path, sharded_dir: Path, capsys) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(sharded_dir, root)
    shutil.rmtree(root / "vae")
    shard = _shard_holding(root, "transformer", "proj_out.weight")
    shard.unlink()
    (root / "tokenizer" / "tokenizer.json").unlink()
    assert checkpoint_files.missing_files(TINY, root) == [f"transformer/{shard.name}", "vae/ (the VAE folder)"]
    # A preset with the umT5 tokenizer needs its file too.
    assert checkpoint_files.missing_files(LINGBOT_14B, root)[-1] == "tokenizer/tokenizer.json"
    with pytest.raises(checkpoint_files.CheckpointMissing) as info:
        checkpoint_files.require_checkpoint(TINY, root)
    assert "(diffusers layout: it holds model_index.json)" in str(info.value)
    assert str(info.value).endswith(f"missing: transformer/{shard.name}, vae/ (the VAE folder)")

    assert main(["verify", "tiny", "--checkpoint", str(root)]) == 1
    out = capsys.readouterr().out
    vae = root / "vae"
    assert (
        f"vae: no VAE weights: expected {vae}/*.safetensors.index.json with its shards, or one {vae}/*.safetensors"
        in out
    )
    assert "dit: unreadable DiT weights:" in out and shard.name in out
    assert "t5: ok" in out


def test_a_folder_without_weights_names_both_file_forms(tmp_path: Path, single_dir: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(single_dir, root)
    (root / "text_encoder" / "model.safetensors").unlink()
    assert checkpoint_files.missing_files(TINY, root) == [
        "text_encoder/*.safetensors.index.json and its shards (the umT5)"
    ]
    with pytest.raises(
        FileNotFoundError,
        match=r"no umT5 weights: expected .*text_encoder/\*\.safetensors\.index\.json .*or one .*text_encoder/",
    ):
        components.load_text_encoder(TINY, CPU, root)
