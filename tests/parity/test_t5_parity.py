"""umT5 parity: our encoder (workers/models/t5.py) against transformers' `UMT5EncoderModel` and
FastVideo's LingBot-World 2 umT5, float32, on batches of prompts padded to text_len with a mask.

The weights are transformers' own random initialisation (norm scales and position tables spread so
those paths matter), written by its `save_pretrained` and read by our loader through the diffusers
layout's umT5 table (workers/models/diffusers_layout.py): a name mapped to the wrong weight would
show here as a disagreement, so these cases also prove the table.

Compared are the real tokens only. Our `TextEncoder.encode` returns each prompt's rows up to its
length (EOS included) and drops the padded ones, as the released pipeline does (`[u[:v] for u, v
in zip(context, seq_lens)]`, then the DiT zero-pads to text_len: workers/models/dit.py `text_kv`),
so padded positions never reach the DiT; the cases check that `encode` returns exactly those rows.

Two shapes: the tiny preset's (32 buckets over 32 tokens: offsets past max_exact = 8 take the
logarithmic buckets) and a longer one (64 buckets over 300 tokens: offsets past max_distance = 128
saturate). FastVideo's encoder uses the released names, so it takes our loaded weights as they are.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.parity.compare import assert_agrees
from tests.parity.hf_configs import umt5_config
from tests.parity.references import fastvideo_module, reference_module
from workers.models import diffusers_layout, loading
from workers.models.presets import TINY, T5Config
from workers.models.t5 import MAX_DISTANCE, TextEncoder, UMT5Encoder, relative_position_bucket
from workers.models.tokenizer import ByteTokenizer

pytestmark = pytest.mark.parity

CPU = torch.device("cpu")
LONG_T5 = T5Config(
    vocab_size=300, dim=96, dim_attn=96, dim_ffn=160, num_heads=6, num_layers=3, num_buckets=64, text_len=300
)
CONFIGS = {"tiny": TINY.t5, "long": LONG_T5}
SENTENCE = "a slow walk along the river at dusk, the camera turning left past the old stone bridge. "


def _prompts(text_len: int) -> list[str]:
    """One prompt past text_len (truncated, EOS kept last), one about half of it, one of two bytes."""
    long = SENTENCE * (text_len // len(SENTENCE) + 2)
    return [long, long[: text_len // 2], "go"]


def _transformers_encoder(config: T5Config, attention: str, seed: int) -> nn.Module:
    transformers = reference_module("transformers")
    torch.manual_seed(seed)
    model = transformers.UMT5EncoderModel(umt5_config(config, attention)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.uniform_(0.5, 1.5)
            elif "relative_attention_bias" in name:
                param.normal_(0.0, 1.0)
    return model


def _load_ours(config: T5Config, saved: Path) -> UMT5Encoder:
    """Our encoder from transformers' saved file, through the loader and the diffusers layout's table."""
    source = loading.RenamedSource(loading.SafetensorsSource((saved / "model.safetensors",)), diffusers_layout.T5_NAMES)
    module = loading.build_on_meta(lambda: UMT5Encoder(config))
    loaded = loading.load_strict("umT5", module, source, torch.float32, CPU)
    assert isinstance(loaded, UMT5Encoder)
    return loaded.eval()


def _encode_checked(encoder: UMT5Encoder, tokenizer: ByteTokenizer, prompts: list[str]) -> list[torch.Tensor]:
    """`TextEncoder.encode`, checked to be the encoder's rows over each prompt's real tokens."""
    ids, mask = tokenizer(prompts)
    embeddings = TextEncoder(encoder, tokenizer).encode(prompts)
    lengths = mask.sum(dim=1).tolist()
    assert [e.shape[0] for e in embeddings] == lengths
    assert lengths[0] == tokenizer.text_len and 1 < min(lengths) < max(lengths), "truncated, mid and short prompts"
    with torch.no_grad():
        full = encoder(ids, mask)
    for row, embedding, n in zip(full, embeddings, lengths, strict=True):
        assert torch.equal(embedding, row[:n]), "encode() must return exactly the real tokens' rows"
    return embeddings


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_umt5_agrees_with_transformers_on_padded_prompts(tmp_path: Path, name: str, attention: str) -> None:
    config = CONFIGS[name]
    reference = _transformers_encoder(config, attention, seed=11)
    reference.save_pretrained(tmp_path)
    ours = _load_ours(config, tmp_path)
    tokenizer = ByteTokenizer(config.text_len)
    prompts = _prompts(config.text_len)

    embeddings = _encode_checked(ours, tokenizer, prompts)
    ids, mask = tokenizer(prompts)
    with torch.no_grad():
        hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    real = [row[:n] for row, n in zip(hidden, mask.sum(dim=1).tolist(), strict=True)]
    assert_agrees(f"umt5 {name} vs transformers UMT5EncoderModel ({attention})", torch.cat(embeddings), torch.cat(real))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_umt5_agrees_with_fastvideo_lingbot_world_2(tmp_path: Path, name: str) -> None:
    config = CONFIGS[name]
    _transformers_encoder(config, "eager", seed=12).save_pretrained(tmp_path)
    ours = _load_ours(config, tmp_path)
    fastvideo = _fastvideo_encoder(config)
    fastvideo.load_state_dict(ours.state_dict(), strict=True)  # the released names on both sides
    tokenizer = ByteTokenizer(config.text_len)
    prompts = _prompts(config.text_len)

    embeddings = _encode_checked(ours, tokenizer, prompts)
    ids, mask = tokenizer(prompts)
    with torch.no_grad():
        context = fastvideo(ids, attention_mask=mask).last_hidden_state
    # As FastVideo's LingBot-World 2 generation stage slices the text context for the DiT.
    seq_lens = mask.gt(0).sum(dim=1).long()
    released = [u[:v] for u, v in zip(context, seq_lens, strict=True)]
    assert_agrees(f"umt5 {name} vs FastVideo LingBot-World 2 umT5", torch.cat(embeddings), torch.cat(released))


def _fastvideo_encoder(config: T5Config) -> nn.Module:
    module: types.ModuleType = fastvideo_module("models.encoders.lingbotworld2_t5")
    configs = fastvideo_module("configs.models.encoders.lingbotworld2_t5")
    arch = configs.LingBotWorld2UMT5ArchConfig(
        vocab_size=config.vocab_size,
        dim=config.dim,
        dim_attn=config.dim_attn,
        dim_ffn=config.dim_ffn,
        num_heads=config.num_heads,
        num_layers=config.num_layers,
        num_buckets=config.num_buckets,
        text_len=config.text_len,
        hidden_size=config.dim,
    )
    encoder: nn.Module = module.LingBotWorld2T5EncoderModel(configs.LingBotWorld2UMT5Config(arch_config=arch))
    return encoder.eval()  # its dropout is 0.1


@pytest.mark.parametrize(("num_buckets", "length"), [(32, 32), (64, 300), (32, 512)], ids=["tiny", "long", "xxl"])
def test_relative_position_buckets_match_transformers(num_buckets: int, length: int) -> None:
    transformers = reference_module("transformers")
    config = T5Config(num_buckets=num_buckets, text_len=length, dim=64, dim_attn=64, num_heads=4)
    with torch.device("meta"):
        attention = transformers.models.umt5.modeling_umt5.UMT5Attention(
            umt5_config(config), has_relative_attention_bias=True
        )
    pos = torch.arange(length)
    rel = pos[None, :] - pos[:, None]  # key - query, as both compute it
    ours = relative_position_bucket(rel, num_buckets)
    assert torch.equal(ours, attention._relative_position_bucket(rel))
    # Query 0 sees keys at offsets 1..length-1, in the upper half of the buckets.
    half = num_buckets // 2
    max_exact = half // 2
    assert ours[0, 1:max_exact].tolist() == [half + k for k in range(1, max_exact)], "small offsets: exact buckets"
    assert (ours[0, max_exact:] - half >= max_exact).all(), "offsets past max_exact take the logarithmic buckets"
    if length > MAX_DISTANCE:
        assert (ours[0, MAX_DISTANCE:] == num_buckets - 1).all(), "offsets past max_distance saturate"
