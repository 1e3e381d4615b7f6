"""Our component configurations in the reference libraries' own config classes, for building the
references at the same shapes (the weights come from our side or are mapped by name)."""

from __future__ import annotations

from typing import Any

from tests.parity.references import reference_module
from workers.models.presets import T5Config
from workers.models.t5 import MAX_DISTANCE


def umt5_config(config: T5Config, attention: str = "eager") -> Any:
    """transformers' `UMT5Config` for our umT5 shape, `attention` its attention implementation."""
    transformers = reference_module("transformers")
    hf_config = transformers.UMT5Config(
        vocab_size=config.vocab_size,
        d_model=config.dim,
        d_kv=config.dim_attn // config.num_heads,
        num_heads=config.num_heads,
        d_ff=config.dim_ffn,
        num_layers=config.num_layers,
        relative_attention_num_buckets=config.num_buckets,
        relative_attention_max_distance=MAX_DISTANCE,
        feed_forward_proj="gated-gelu",  # umT5's: wo(gelu_tanh(wi_0 x) * wi_1 x)
        dropout_rate=0.0,
    )
    hf_config._attn_implementation = attention
    return hf_config
