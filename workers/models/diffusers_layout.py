"""The names a checkpoint in the diffusers layout stores the weights under, mapped to the native names
our modules use (those of the released checkpoint: workers/models/dit.py, vae.py, t5.py).

One table per component (checkpoint_files.py names the folders and files):
- transformer/: diffusers' Wan transformer names, the inverse of diffusers' own conversion from the
  released names (`convert_wan_transformer_to_diffusers` in diffusers/loaders/single_file_utils.py).
- vae/: diffusers' `AutoencoderKLWan` names, the inverse of `convert_wan_vae_to_diffusers`.
- text_encoder/: transformers' `UMT5EncoderModel` names.
tests/workers/models/test_diffusers_layout.py runs those conversions and saves with the libraries'
own code, and tests/parity/test_t5_parity.py runs transformers' umT5 on weights mapped by this table.

Only names change. No tensor needs a reshape or a transpose: diffusers keeps a Linear weight as
[out, in] as Wan does, `blocks.N.scale_shift_table` is the [1, 6, dim] `blocks.N.modulation` and the
top-level `scale_shift_table` the [1, 2, dim] `head.modulation`; transformers' umT5 keeps the
released shapes too (the relative-position table is [buckets, heads] in both).

A stored name no rule matches keeps its name, as diffusers' conversion passes names it does not
know through unchanged. That is how the camera layers arrive: `patch_embedding_wancamctrl`,
`c2ws_hidden_states_layer1/2` and `blocks.N.cam_injector_layer1/2`, `cam_scale_layer`,
`cam_shift_layer` have no diffusers names, and come out of diffusers' conversion as they went in
(so does `patch_embedding`, which diffusers names the same). Any other unknown name is then
reported as an unexpected key under the name it is stored with, by the strict check.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from workers.models.presets import VAEConfig

_PARAM = r"(weight|bias)"


@dataclass(frozen=True)
class Rename:
    """A stored name that fully matches `stored` becomes `native`: a `re` template (`\\1` is the first
    group), or a function of the match where the native name needs arithmetic on an index."""

    stored: re.Pattern[str]
    native: str | Callable[[re.Match[str]], str]

    def apply(self, name: str) -> str | None:
        match = self.stored.fullmatch(name)
        if match is None:
            return None
        return match.expand(self.native) if isinstance(self.native, str) else self.native(match)


def _rename(stored: str, native: str | Callable[[re.Match[str]], str]) -> Rename:
    return Rename(re.compile(stored), native)


@dataclass(frozen=True)
class NameTable:
    """One component's stored names -> native names."""

    component: str
    renames: tuple[Rename, ...]
    # (copy, original) pairs of names a library saves for one tied weight: the copy is not read when
    # the original is stored (as the library itself ignores it), and stands in for it when it is not.
    tied: tuple[tuple[str, str], ...] = ()

    def to_native(self, stored: str) -> str:
        """The native name of a stored one; the first matching rule wins, an unmatched name is kept."""
        for rename in self.renames:
            native = rename.apply(stored)
            if native is not None:
                return native
        return stored

    def ignored(self, stored: Collection[str]) -> frozenset[str]:
        """The stored names not to read, given every name stored."""
        return frozenset(copy for copy, original in self.tied if copy in stored and original in stored)


def _attention(diffusers: str, native: str) -> tuple[Rename, ...]:
    block = r"blocks\.(\d+)\."
    return (
        _rename(rf"{block}{diffusers}\.to_(q|k|v)\.{_PARAM}", rf"blocks.\1.{native}.\2.\3"),
        _rename(rf"{block}{diffusers}\.to_out\.0\.{_PARAM}", rf"blocks.\1.{native}.o.\2"),
        _rename(rf"{block}{diffusers}\.norm_(q|k)\.{_PARAM}", rf"blocks.\1.{native}.norm_\2.\3"),
    )


DIT_NAMES = NameTable(
    "DiT",
    (
        _rename(rf"condition_embedder\.time_embedder\.linear_1\.{_PARAM}", r"time_embedding.0.\1"),
        _rename(rf"condition_embedder\.time_embedder\.linear_2\.{_PARAM}", r"time_embedding.2.\1"),
        _rename(rf"condition_embedder\.text_embedder\.linear_1\.{_PARAM}", r"text_embedding.0.\1"),
        _rename(rf"condition_embedder\.text_embedder\.linear_2\.{_PARAM}", r"text_embedding.2.\1"),
        _rename(rf"condition_embedder\.time_proj\.{_PARAM}", r"time_projection.1.\1"),
        *_attention("attn1", "self_attn"),
        *_attention("attn2", "cross_attn"),
        # diffusers' norm2 is the affine norm before cross-attention, Wan's norm3; the two norms
        # around it hold no weights in either.
        _rename(rf"blocks\.(\d+)\.norm2\.{_PARAM}", r"blocks.\1.norm3.\2"),
        _rename(rf"blocks\.(\d+)\.ffn\.net\.0\.proj\.{_PARAM}", r"blocks.\1.ffn.0.\2"),
        _rename(rf"blocks\.(\d+)\.ffn\.net\.2\.{_PARAM}", r"blocks.\1.ffn.2.\2"),
        _rename(r"blocks\.(\d+)\.scale_shift_table", r"blocks.\1.modulation"),
        _rename(r"scale_shift_table", "head.modulation"),
        _rename(rf"proj_out\.{_PARAM}", r"head.head.\1"),
    ),
)

# A Wan residual block's weights: diffusers names its layers, Wan indexes its Sequential.
_RESNET_PARTS = {
    "norm1.gamma": "residual.0.gamma",
    "conv1.weight": "residual.2.weight",
    "conv1.bias": "residual.2.bias",
    "norm2.gamma": "residual.3.gamma",
    "conv2.weight": "residual.6.weight",
    "conv2.bias": "residual.6.bias",
    "conv_shortcut.weight": "shortcut.weight",
    "conv_shortcut.bias": "shortcut.bias",
}
_RESNET = "(" + "|".join(re.escape(part) for part in _RESNET_PARTS) + ")"


def vae_names(config: VAEConfig) -> NameTable:
    """The VAE's table. diffusers groups the decoder into up blocks of `num_res_blocks + 1` residual
    blocks and one upsampler (none after the last), which Wan keeps in one flat Sequential; so stage
    s, block r is Wan's `decoder.upsamples.{s·(n+2)+r}` and its upsampler `{s·(n+2)+n+1}`."""
    stride = config.num_res_blocks + 2

    def up_resnet(m: re.Match[str]) -> str:
        return f"decoder.upsamples.{int(m[1]) * stride + int(m[2])}.{_RESNET_PARTS[m[3]]}"

    def upsampler(m: re.Match[str]) -> str:
        return f"decoder.upsamples.{int(m[1]) * stride + stride - 1}.{m[2]}"

    def mid_resnet(m: re.Match[str]) -> str:
        # Wan's middle is resnet, attention, resnet: diffusers' resnets 0 and 1 are Wan's 0 and 2.
        return f"{m[1]}.middle.{2 * int(m[2])}.{_RESNET_PARTS[m[3]]}"

    def down_resnet(m: re.Match[str]) -> str:
        return f"encoder.downsamples.{m[1]}.{_RESNET_PARTS[m[2]]}"

    return NameTable(
        "VAE",
        (
            _rename(rf"(encoder|decoder)\.conv_in\.{_PARAM}", r"\1.conv1.\2"),
            _rename(rf"quant_conv\.{_PARAM}", r"conv1.\1"),
            _rename(rf"post_quant_conv\.{_PARAM}", r"conv2.\1"),
            _rename(rf"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.{_RESNET}", mid_resnet),
            _rename(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)", r"\1.middle.1.\2"),
            _rename(r"(encoder|decoder)\.norm_out\.gamma", r"\1.head.0.gamma"),
            _rename(rf"(encoder|decoder)\.conv_out\.{_PARAM}", r"\1.head.2.\2"),
            # The encoder's down blocks are one flat list in both, residual blocks and resamplers.
            _rename(rf"encoder\.down_blocks\.(\d+)\.{_RESNET}", down_resnet),
            _rename(r"encoder\.down_blocks\.(\d+)\.((?:resample|time_conv)\..+)", r"encoder.downsamples.\1.\2"),
            _rename(rf"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.{_RESNET}", up_resnet),
            _rename(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.((?:resample|time_conv)\..+)", upsampler),
        ),
    )


_T5_BLOCK = r"encoder\.block\.(\d+)\.layer\."
_T5_ATTENTION = rf"{_T5_BLOCK}0\.SelfAttention\."

T5_NAMES = NameTable(
    "umT5",
    (
        _rename(r"shared\.weight", "token_embedding.weight"),
        _rename(r"encoder\.embed_tokens\.weight", "token_embedding.weight"),
        _rename(rf"{_T5_BLOCK}0\.layer_norm\.weight", r"blocks.\1.norm1.weight"),
        _rename(rf"{_T5_ATTENTION}(q|k|v|o)\.weight", r"blocks.\1.attn.\2.weight"),
        # umT5 keeps a relative-position table in every layer (T5 only in the first).
        _rename(rf"{_T5_ATTENTION}relative_attention_bias\.weight", r"blocks.\1.pos_embedding.embedding.weight"),
        _rename(rf"{_T5_BLOCK}1\.layer_norm\.weight", r"blocks.\1.norm2.weight"),
        # transformers' gated FFN is wo(act(wi_0 x) · wi_1 x); Wan's is fc2(fc1 x · gelu(gate x)).
        _rename(rf"{_T5_BLOCK}1\.DenseReluDense\.wi_0\.weight", r"blocks.\1.ffn.gate.0.weight"),
        _rename(rf"{_T5_BLOCK}1\.DenseReluDense\.wi_1\.weight", r"blocks.\1.ffn.fc1.weight"),
        _rename(rf"{_T5_BLOCK}1\.DenseReluDense\.wo\.weight", r"blocks.\1.ffn.fc2.weight"),
        _rename(r"encoder\.final_layer_norm\.weight", "norm.weight"),
    ),
    # transformers ties the encoder's embedding to `shared` and saves `shared.weight` alone; older
    # saves hold both.
    tied=(("encoder.embed_tokens.weight", "shared.weight"),),
)
