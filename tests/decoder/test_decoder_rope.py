"""YaRN RoPE of the decoder definition (``metrale_core.decoder.rope``) against transformers'
``_compute_yarn_parameters`` (gpt-oss's RoPE): inverse frequencies and attention factor, with and
without ``truncate``, the default betas, ``mscale`` / ``mscale_all_dim`` and an
explicit ``attention_factor``; the cos / sin tables carry the factor."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from metrale_core.decoder.dims import DecoderDims
from metrale_core.decoder.rope import RopeTables
from metrale_core.decoder.spec import DecoderSpec

CONFIG = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=4096,
)
CASES = {
    "gpt-oss": dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=128),
    "truncated": dict(factor=4.0, beta_fast=16.0, beta_slow=2.0, original_max_position_embeddings=256),
    "default-betas": dict(factor=16.0, original_max_position_embeddings=1024),
    "mscale": dict(factor=8.0, mscale=0.7, mscale_all_dim=1.0, original_max_position_embeddings=512),
    "attention-factor": dict(factor=8.0, attention_factor=1.3, original_max_position_embeddings=512),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_yarn_is_transformers(case):
    rope = {"rope_type": "yarn", "rope_theta": 50000.0, **{k: v for k, v in CASES[case].items() if v is not None}}
    hf_config = tf.LlamaConfig(**CONFIG, rope_parameters=rope)
    want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    dims = DecoderDims.from_config({**CONFIG, "rope_parameters": rope}, DecoderSpec("mini", "M"))
    tables = RopeTables(dims, torch.device("cpu"))
    assert torch.allclose(tables.inv_freq, want_freq, rtol=1e-6, atol=0) and tables.attention == pytest.approx(
        want_factor, rel=1e-12
    )
    positions = torch.tensor([0, 5, 300, 4000])
    cos, sin = tables.cos_sin(positions, torch.float32)
    angles = positions.float()[:, None] * tables.inv_freq[None, :]
    assert torch.allclose(cos[:, :16], angles.cos() * want_factor, atol=1e-6)
    assert torch.allclose(sin[:, 16:], angles.sin() * want_factor, atol=1e-6)
