"""llama.cpp LoRA adapters (``convert_lora_to_gguf.py`` output) -> ``AdapterWeights``.

Owner: ``metrale_lora``; :func:`metrale_lora.adapter_files.load_adapter` calls
:func:`load_gguf_lora` for a ``.gguf`` path.

The format (llama.cpp ``llama-adapter.cpp``): ``general.type = "adapter"``, ``adapter.type =
"lora"``, ``adapter.lora.alpha``; per targeted weight ``W`` (``blk.N.attn_q.weight``) two
tensors ``W.lora_a`` (numpy ``[r, in]``, PEFT's ``lora_A``) and ``W.lora_b`` (``[out, r]``,
``lora_B``), any float or quantized GGML type.

Invariants:
- Scale is llama.cpp's, per tensor: ``alpha / r``, or 1 when ``alpha`` is 0 or absent (the converter writes
  ``lora_alpha`` as is, so an rsLoRA adapter converted by it is scaled as llama.cpp scales it).
- For architectures whose Q/K rows llama.cpp permutes (``llama``), the converter permuted
  ``lora_b`` of ``attn_q`` / ``attn_k`` the same way; it is un-permuted with the base's head
  size (``head_dim``), so the delta lands on HF-ordered rows like the base weights.
- What the engine cannot apply is refused naming the file: a GGUF that is not a LoRA adapter,
  tensors other than ``lora_a`` / ``lora_b`` of a decoder projection (token embeddings, norms
  from mergekit, the output head), a weight with only one half, ranks that disagree.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from metrale_core.api import AdapterWeights, ConfigError, WeightsError, read_gguf_tensors, unpermute_rows

__all__ = ["load_gguf_lora"]

_PERMUTED = (".attn_q.weight", ".attn_k.weight")


def _refuse(path: Path, what: str) -> ConfigError:
    return ConfigError(f"LoRA adapter {path}: {what}")


def load_gguf_lora(path: str | Path, head_dim: int | None) -> AdapterWeights:
    """Read the llama.cpp LoRA adapter at ``path``; ``head_dim`` is the base's attention head
    size (needed to un-permute Q/K of ``llama`` adapters; None refuses such an adapter)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise _refuse(path, "no such file")
    try:
        gguf = read_gguf_tensors(path)
    except WeightsError as exc:
        raise _refuse(path, str(exc)) from None
    kind = (gguf.metadata.get("general.type"), gguf.metadata.get("adapter.type"))
    if kind != ("adapter", "lora"):
        raise _refuse(
            path,
            f"is not a LoRA adapter GGUF (general.type={kind[0]!r}, adapter.type={kind[1]!r}); "
            "convert PEFT adapters with llama.cpp's convert_lora_to_gguf.py",
        )
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, values in gguf.tensors.items():
        weight, _, half = name.rpartition(".")
        hf = gguf.hf_name(weight)
        if half not in ("lora_a", "lora_b") or hf is None or not hf.endswith("_proj.weight"):
            raise _refuse(
                path,
                f"tensor {name!r} is not the lora_a/lora_b of a decoder projection "
                "(embedding, norm and output-head tensors are not supported)",
            )
        pairs.setdefault(weight, {})[half] = values
    raw_alpha = gguf.metadata.get("adapter.lora.alpha") or 0.0
    if not isinstance(raw_alpha, (int, float, str)):
        raise _refuse(path, f"adapter.lora.alpha is {raw_alpha!r}, not a number")
    alpha = float(raw_alpha)
    modules = {}
    for weight, halves in pairs.items():
        if set(halves) != {"lora_a", "lora_b"}:
            raise _refuse(path, f"{weight} has {', '.join(sorted(halves))} but not both lora_a and lora_b")
        a_rows, b_rows = halves["lora_a"], halves["lora_b"]
        if a_rows.ndim != 2 or b_rows.ndim != 2 or a_rows.shape[0] != b_rows.shape[1]:
            raise _refuse(
                path, f"{weight}: lora_a {list(a_rows.shape)} and lora_b {list(b_rows.shape)} do not share a rank"
            )
        if gguf.rows_permuted and weight.endswith(_PERMUTED):
            out = int(b_rows.shape[0])
            if not head_dim or out % (2 * head_dim):
                raise _refuse(
                    path, f"{weight}: cannot restore the Q/K row order of {out} rows with head size {head_dim}"
                )
            b_rows = unpermute_rows(b_rows, out // head_dim)
        r = int(a_rows.shape[0])
        module = str(gguf.hf_name(weight)).removesuffix(".weight")
        modules[module] = (
            torch.from_numpy(np.ascontiguousarray(a_rows, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(b_rows, dtype=np.float32)),
            alpha / r if alpha else 1.0,
        )
    return AdapterWeights(str(path), modules)
