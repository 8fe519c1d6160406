"""Weight formats of the GLM loader (``loader.py`` / ``weights.py``): every projection is the shared
linear layer, so ``--weight-format`` bf16 / int8 / int4 load and stay close to transformers (the
oracle ``exact`` matches to 1e-4); ``auto`` loads ``exact``; a format the layer cannot run on the
requested device, or one no layer knows, is a ``ConfigError`` naming it."""

from __future__ import annotations

import glm_harness as H
import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.errors import ConfigError
from metrale_core.layers import WEIGHT_FORMAT_ENV, DenseLinear
from metrale_core.layers import WEIGHT_FORMATS as SHARED
from metrale_core.layers.formats.linear_kinds import Bf16Linear
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.forward_spy import ForwardSpy
from metrale_core.weights import open_weights
from metrale_glm_kda import WEIGHT_FORMATS

NEW_TOKENS = 8
#: format -> max |logits - transformers| as a share of the largest reference logit (measured:
#: bf16 0.7%, int8 / int4 1.5% on these tiny random checkpoints; exact is held to 1e-4 absolute).
REL_TOL = {"bf16": 0.02, "int8": 0.04, "int4": 0.04}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm_formats")
    hf = H.save_checkpoint("hc2", path, seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, H.VOCAB, (n,), generator=g).tolist() for n in (24, 9)]
    return path, hf, prompts


def _load(path, **options):
    store = open_weights(path)
    return load_registry().find_model_loader(store.config).factory(store, LoadOptions(**options))


def _greedy_rows(model, prompts) -> tuple[list[list[int]], list[tuple[tuple[int, ...], torch.Tensor]]]:
    """Greedy continuations of ``prompts`` through the engine, and every logits row it computed."""
    spy = ForwardSpy(model)
    engine = LLMEngine(spy, EngineConfig(block_size=4, num_kv_blocks=64), registry=load_registry())
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    out: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return [p + out[f"r{i}"] for i, p in enumerate(prompts)], spy.rows


def _worst_against_transformers(hf, full, rows) -> tuple[float, float]:
    """(max |row - transformers| over the rows, max |transformers logit|) on each row's own history."""
    ref = [H.hf_logits(hf, seq[:-1]) for seq in full]
    worst = scale = 0.0
    for history, row in rows:
        i = next(i for i, seq in enumerate(full) if tuple(seq[: len(history)]) == history)
        want = ref[i][len(history) - 1]
        worst, scale = max(worst, (row - want).abs().max().item()), max(scale, want.abs().max().item())
    return worst, scale


def test_declared_formats_are_the_shared_layers():
    assert set(WEIGHT_FORMATS) <= set(SHARED) and "exact" in WEIGHT_FORMATS
    spec = load_registry().model_loaders["glm5_next"]
    assert spec.weight_formats == WEIGHT_FORMATS


def test_exact_and_auto_keep_dense_model_dtype_projections(checkpoint):
    path, hf, prompts = checkpoint
    for fmt in ("exact", "auto", None):
        weights = _load(path, weight_format=fmt).weights
        assert weights.weight_format == "exact"
        assert isinstance(weights.layers[0].attn.qkv, DenseLinear) and isinstance(weights.lm_head, DenseLinear)
    full, rows = _greedy_rows(_load(path), prompts)
    worst, _ = _worst_against_transformers(hf, full, rows)
    assert worst <= 1e-4


@pytest.mark.parametrize("fmt", sorted(REL_TOL))
def test_lossy_formats_load_and_stay_close_to_transformers(checkpoint, fmt):
    path, hf, prompts = checkpoint
    model = _load(path, weight_format=fmt)
    w = model.weights
    assert w.weight_format == fmt
    kda, mla, dense_mlp = w.layers[0].attn, w.layers[1].attn, w.layers[0].mlp
    projections = [kda.qkv, kda.f_a, kda.o_proj, mla.q_a, mla.o_proj, dense_mlp.gate_up, w.layers[1].mlp.shared.down]
    if fmt == "bf16":  # the C kernel's bfloat16 matrix, or torch's bfloat16 tensor where it does not run
        assert all(isinstance(p, Bf16Linear) or p.weight.dtype == torch.bfloat16 for p in projections)
    else:
        assert not any(isinstance(p, DenseLinear) for p in projections)  # quantized codes, not a dense copy
    full, rows = _greedy_rows(model, prompts)
    worst, scale = _worst_against_transformers(hf, full, rows)
    assert 0 < worst <= REL_TOL[fmt] * scale, (fmt, worst, scale)


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_environment_format_is_honoured(checkpoint, fmt, monkeypatch):
    monkeypatch.setenv(WEIGHT_FORMAT_ENV, fmt)
    assert _load(checkpoint[0]).weights.weight_format == fmt


def test_formats_the_layer_cannot_run_are_refused(checkpoint):
    """A lossy format runs on CPU only (the layer's refusal, before any projection is built); an
    unknown format is refused by name."""
    path = checkpoint[0]
    with pytest.raises(ConfigError, match=r"weight format 'int8' runs on CPU only.*--weight-format exact"):
        _load(path, weight_format="int8", device="meta")
    assert _load(path, weight_format="exact", device="meta").weights.weight_format == "exact"
    with pytest.raises(ConfigError, match=r"weight format 'int3' is not supported"):
        _load(path, weight_format="int3")
