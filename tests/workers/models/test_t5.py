from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from torch import Tensor

from workers.models.presets import TINY, T5Config
from workers.models.t5 import TextEncoder, UMT5Encoder, relative_position_bucket
from workers.models.tokenizer import (
    UMT5_TOKENIZER_RELPATH,
    ByteTokenizer,
    UMT5Tokenizer,
    clean_text,
    load_tokenizer,
)

TINY_T5 = TINY.t5


def _seeded_encoder(config: T5Config = TINY_T5, seed: int = 0) -> UMT5Encoder:
    torch.manual_seed(seed)
    encoder = UMT5Encoder(config).eval()
    # Non-trivial norm and bias weights so those paths are actually exercised.
    with torch.no_grad():
        for name, param in encoder.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")) or name == "norm.weight":
                param.uniform_(0.5, 1.5)
            elif "pos_embedding" in name:
                param.normal_(0.0, 1.0)
    return encoder


def _expected_shapes(c: T5Config) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"token_embedding.weight": (c.vocab_size, c.dim)}
    for n in range(c.num_layers):
        p = f"blocks.{n}."
        shapes[p + "norm1.weight"] = (c.dim,)
        for proj in "qkv":
            shapes[p + f"attn.{proj}.weight"] = (c.dim_attn, c.dim)
        shapes[p + "attn.o.weight"] = (c.dim, c.dim_attn)
        shapes[p + "norm2.weight"] = (c.dim,)
        shapes[p + "ffn.gate.0.weight"] = (c.dim_ffn, c.dim)
        shapes[p + "ffn.fc1.weight"] = (c.dim_ffn, c.dim)
        shapes[p + "ffn.fc2.weight"] = (c.dim, c.dim_ffn)
        shapes[p + "pos_embedding.embedding.weight"] = (c.num_buckets, c.num_heads)
    shapes["norm.weight"] = (c.dim,)
    return shapes


# --- checkpoint layout -------------------------------------------------------------------------


def test_umt5_xxl_state_dict_matches_checkpoint_layout() -> None:
    config = T5Config()
    with torch.device("meta"):
        encoder = UMT5Encoder(config)
    state = encoder.state_dict()
    expected = _expected_shapes(config)
    assert list(state) == list(expected)
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    assert not list(encoder.buffers())

    expected_params = sum(math.prod(s) for s in expected.values())
    total = sum(p.numel() for p in encoder.parameters())
    print(f"umT5-xxl encoder parameters: {total:,}")
    assert total == expected_params == 5_680_910_336


def test_state_dict_round_trip_strict() -> None:
    source = _seeded_encoder(seed=1)
    with torch.device("meta"):
        target = UMT5Encoder(TINY_T5)
    target.load_state_dict(source.state_dict(), strict=True, assign=True)
    ids = torch.randint(3, TINY_T5.vocab_size, (2, 9))
    torch.testing.assert_close(target(ids), source(ids), rtol=0, atol=0)


# --- relative position buckets -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "bucket"),
    [
        (0, 0),
        (1, 17),
        (-1, 1),
        (7, 23),  # last exact bucket on the positive side: 16 + 7
        (-7, 7),
        (8, 24),  # first log bucket: 16 + 8 + floor(log(1) ...) = 24
        (-12, 9),  # 8 + floor(log(1.5) / log(16) * 8) = 8 + 1
        (-20, 10),  # 8 + floor(log(2.5) / log(16) * 8) = 8 + 2
        (100, 31),  # 16 + 8 + floor(log(12.5) / log(16) * 8) = 16 + 8 + 7
        (127, 31),
        (128, 31),  # saturates at the last bucket of the half
        (-128, 15),
        (10_000, 31),
        (-10_000, 15),
    ],
)
def test_relative_position_bucket_values(rel: int, bucket: int) -> None:
    assert relative_position_bucket(torch.tensor([rel]), num_buckets=32).item() == bucket


def test_relative_position_bucket_monotone_and_in_range() -> None:
    rel = torch.arange(-600, 601)
    buckets = relative_position_bucket(rel, num_buckets=32)
    assert buckets.min() == 0
    assert buckets.max() == 31
    pos, neg = buckets[rel > 0], buckets[rel < 0].flip(0)
    assert (pos.diff() >= 0).all()
    assert (neg.diff() >= 0).all()
    assert pos.min() == 17
    assert neg.min() == 1


# --- reference forward -------------------------------------------------------------------------


def _reference_forward(encoder: UMT5Encoder, ids: Tensor, mask: Tensor) -> Tensor:
    """Straight transcription of the umT5 equations with per-head loops, for one float32 sequence."""
    c = encoder.config
    sd = {k: v.double() for k, v in encoder.state_dict().items()}
    head = c.dim_attn // c.num_heads

    def rms(x: Tensor, w: Tensor) -> Tensor:
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def gelu_tanh(x: Tensor) -> Tensor:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    length = ids.shape[0]
    rel = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    buckets = relative_position_bucket(rel, c.num_buckets)
    x = sd["token_embedding.weight"][ids]
    for n in range(c.num_layers):
        p = f"blocks.{n}."
        h = rms(x, sd[p + "norm1.weight"])
        q, k, v = (h @ sd[p + f"attn.{s}.weight"].T for s in "qkv")
        heads = []
        for i in range(c.num_heads):
            sl = slice(i * head, (i + 1) * head)
            scores = q[:, sl] @ k[:, sl].T + sd[p + "pos_embedding.embedding.weight"][buckets, i]
            scores = scores.masked_fill(mask[None, :] == 0, float("-inf"))
            heads.append(torch.softmax(scores, -1) @ v[:, sl])
        x = x + torch.cat(heads, -1) @ sd[p + "attn.o.weight"].T
        h = rms(x, sd[p + "norm2.weight"])
        gated = (h @ sd[p + "ffn.fc1.weight"].T) * gelu_tanh(h @ sd[p + "ffn.gate.0.weight"].T)
        x = x + gated @ sd[p + "ffn.fc2.weight"].T
    return rms(x, sd["norm.weight"])


def test_forward_matches_reference_equations() -> None:
    encoder = _seeded_encoder(seed=2)
    ids = torch.randint(3, TINY_T5.vocab_size, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        out = encoder(ids, mask)
    assert out.shape == (2, 12, TINY_T5.dim)
    assert out.dtype == torch.float32
    for b, n in ((0, 12), (1, 7)):
        ref = _reference_forward(encoder, ids[b], mask[b]).float()
        torch.testing.assert_close(out[b, :n], ref[:n], rtol=1e-4, atol=1e-4)


# --- masking, determinism, dtype ---------------------------------------------------------------


def test_padding_does_not_change_real_tokens() -> None:
    encoder = _seeded_encoder(seed=3)
    real = torch.randint(3, TINY_T5.vocab_size, (1, 6))
    short_ids = torch.cat([real, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    long_ids = torch.cat([real, torch.randint(3, TINY_T5.vocab_size, (1, 26))], dim=1)  # junk, masked
    with torch.no_grad():
        short = encoder(short_ids, (torch.arange(10) < 6).long()[None])
        long = encoder(long_ids, (torch.arange(32) < 6).long()[None])
        unpadded = encoder(real, torch.ones_like(real))
    torch.testing.assert_close(short[:, :6], unpadded, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(long[:, :6], unpadded, rtol=1e-5, atol=1e-5)
    # Without the mask, the padding must leak in; otherwise the test above proves nothing.
    with torch.no_grad():
        unmasked = encoder(long_ids)
    assert not torch.allclose(unmasked[:, :6], unpadded, atol=1e-3)


def test_forward_is_deterministic() -> None:
    ids = torch.randint(3, TINY_T5.vocab_size, (3, TINY_T5.text_len))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a = _seeded_encoder(seed=4)(ids, mask)
        b = _seeded_encoder(seed=4)(ids, mask)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_forward_tracks_float32(dtype: torch.dtype) -> None:
    encoder = _seeded_encoder(seed=5)
    ids = torch.randint(3, TINY_T5.vocab_size, (2, 10))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    with torch.no_grad():
        ref = encoder(ids, mask)
        out = encoder.to(dtype)(ids, mask)
    assert out.dtype == dtype
    assert torch.isfinite(out[0, :6]).all()
    assert torch.isfinite(out[1]).all()
    torch.testing.assert_close(out[0, :6].float(), ref[0, :6], rtol=0.1, atol=0.1)
    torch.testing.assert_close(out[1].float(), ref[1], rtol=0.1, atol=0.1)


# --- TextEncoder -------------------------------------------------------------------------------


def test_text_encoder_truncates_to_token_count() -> None:
    text_encoder = TextEncoder(_seeded_encoder(seed=6), load_tokenizer(TINY_T5, None))
    prompts = ["a red   car", "", "x" * 100]
    out = text_encoder.encode(prompts)
    assert [tuple(e.shape) for e in out] == [(10, TINY_T5.dim), (1, TINY_T5.dim), (32, TINY_T5.dim)]
    assert not any(e.requires_grad for e in out)
    # Batched and single-prompt encoding agree, since padding is masked out.
    torch.testing.assert_close(text_encoder.encode(["a red car"])[0], out[0], rtol=1e-5, atol=1e-5)
    assert text_encoder.encode([]) == []


def test_text_encoder_rejects_mismatched_text_len() -> None:
    with pytest.raises(ValueError, match="text_len"):
        TextEncoder(_seeded_encoder(), ByteTokenizer(text_len=TINY_T5.text_len + 1))


# --- byte tokenizer ----------------------------------------------------------------------------


def test_clean_text() -> None:
    assert clean_text("  a\t\tb \n\n c  ") == "a b c"
    assert clean_text("fish &amp;amp; chips") == "fish & chips"


def test_byte_tokenizer_eos_padding_and_mask() -> None:
    tok = ByteTokenizer(text_len=8)
    ids, mask = tok(["  hi\n there ", "é"])
    assert ids.shape == mask.shape == (2, 8)
    assert ids.dtype == mask.dtype == torch.long
    # "hi there" cleaned is 8 bytes; truncation keeps 7 of them and EOS as the last token.
    assert ids[0].tolist() == [b + 3 for b in b"hi ther"] + [1]
    assert mask[0].tolist() == [1] * 8
    # "é" is two UTF-8 bytes.
    assert ids[1].tolist() == [0xC3 + 3, 0xA9 + 3, 1, 0, 0, 0, 0, 0]
    assert mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert (ids == 1).sum(dim=1).tolist() == [1, 1]


def test_byte_tokenizer_empty_prompt_is_just_eos() -> None:
    ids, mask = ByteTokenizer(text_len=4)(["   "])
    assert ids.tolist() == [[1, 0, 0, 0]]
    assert mask.tolist() == [[1, 0, 0, 0]]


def test_tokenizer_rejects_bare_string() -> None:
    with pytest.raises(TypeError):
        ByteTokenizer(text_len=4)("abc")  # type: ignore[arg-type]


def test_load_tokenizer_bytes_checks_vocab() -> None:
    assert isinstance(load_tokenizer(TINY_T5, None), ByteTokenizer)
    with pytest.raises(ValueError, match="vocab_size"):
        load_tokenizer(T5Config(vocab_size=100, dim_attn=64, num_heads=4, tokenizer="bytes"), None)


# --- umt5 tokenizer file -----------------------------------------------------------------------


def _write_word_level_umt5(root: Path) -> Path:
    """Tiny stand-in for google/umt5-xxl/tokenizer.json; like the real one, it appends `</s>` itself."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, "red": 4, "car": 5, "drives": 6, "fast": 7}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    # Settings in the file must not leak into the framing done by the loader.
    tokenizer.enable_truncation(max_length=3)
    tokenizer.enable_padding(length=5, pad_id=0, pad_token="<pad>")
    path = root / UMT5_TOKENIZER_RELPATH
    path.parent.mkdir(parents=True)
    tokenizer.save(str(path))
    return path


def test_umt5_tokenizer_file_eos_once_padding_and_mask(tmp_path: Path) -> None:
    _write_word_level_umt5(tmp_path)
    config = T5Config(text_len=6)
    tok = load_tokenizer(config, tmp_path)
    assert isinstance(tok, UMT5Tokenizer)
    assert tok.vocab_size == 8
    ids, mask = tok(["a  red\tcar", "a red car drives fast fast fast", "blue car"])
    assert ids.shape == mask.shape == (3, 6)
    assert ids[0].tolist() == [3, 4, 5, 1, 0, 0]
    assert mask[0].tolist() == [1, 1, 1, 1, 0, 0]
    # Truncated: EOS survives as the final token.
    assert ids[1].tolist() == [3, 4, 5, 6, 7, 1]
    assert mask[1].tolist() == [1] * 6
    assert ids[2].tolist() == [2, 5, 1, 0, 0, 0]
    assert (ids == 1).sum(dim=1).tolist() == [1, 1, 1]


def test_umt5_tokenizer_missing_file_names_path(tmp_path: Path) -> None:
    expected = re.escape(str(tmp_path / "google" / "umt5-xxl" / "tokenizer.json"))
    with pytest.raises(FileNotFoundError, match=expected):
        load_tokenizer(T5Config(), tmp_path)
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        load_tokenizer(T5Config(), None)
