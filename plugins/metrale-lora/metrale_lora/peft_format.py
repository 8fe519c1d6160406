"""PEFT LoRA adapters on disk -> ``AdapterWeights`` (module -> ``A``, ``B``, scale).

Owner: ``metrale_lora``; :func:`load_peft` is the bank's loader (``--lora NAME=PATH`` and
``POST /v1/load_lora_adapter``).

Invariants:
- Only ``adapter_config.json`` + ``adapter_model.safetensors`` are read; a pickled
  ``adapter_model.bin`` is refused naming the file (never unpickled).
- Scale per module: ``lora_alpha / r`` (``alpha / sqrt(r)`` with ``use_rslora``), ``r`` and
  ``alpha`` from ``rank_pattern`` / ``alpha_pattern`` where a pattern names the module.
- What the engine cannot apply exactly is refused with the file named: ``modules_to_save``,
  DoRA, LoRA biases, ``fan_in_fan_out`` and embedding adapters.
- Tensor shapes are checked against the base model by the bank (``AdapterBank.check``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from metrale_core.api import AdapterWeights, ConfigError

__all__ = ["load_peft", "module_of"]

_CONFIG = "adapter_config.json"
_WEIGHTS = "adapter_model.safetensors"
_PICKLE = "adapter_model.bin"
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")


def module_of(key: str) -> tuple[str, str] | None:
    """``(module, "A" | "B")`` of a PEFT tensor name (None for any other tensor)."""
    m = _KEY.match(key)
    return None if m is None else (m.group("module"), m.group("which"))


def _pattern_value(patterns: dict | None, module: str, default: Any) -> Any:
    """PEFT's ``rank_pattern`` / ``alpha_pattern`` lookup: a key matching the module's name or tail."""
    for pattern, value in (patterns or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", module):
            return value
    return default


def _refuse(path: Path, what: str) -> ConfigError:
    return ConfigError(f"LoRA adapter {path}: {what}")


def _read_config(root: Path) -> dict:
    cfg_path = root / _CONFIG
    if not cfg_path.is_file():
        raise _refuse(
            cfg_path, "missing (a PEFT adapter directory has adapter_config.json and adapter_model.safetensors)"
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise _refuse(cfg_path, f"cannot be read as JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise _refuse(cfg_path, "is not a JSON object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise _refuse(cfg_path, f"peft_type {peft_type!r} is not supported (only LORA)")
    if cfg.get("modules_to_save"):
        raise _refuse(
            cfg_path,
            f"modules_to_save {cfg['modules_to_save']!r} is not supported (fully "
            f"fine-tuned modules cannot be switched per request)",
        )
    if cfg.get("use_dora"):
        raise _refuse(cfg_path, "use_dora (DoRA) is not supported")
    if cfg.get("bias", "none") not in ("none", None):
        raise _refuse(cfg_path, f"bias={cfg['bias']!r} is not supported (only 'none')")
    if cfg.get("fan_in_fan_out"):
        raise _refuse(cfg_path, "fan_in_fan_out is not supported")
    for key in ("r", "lora_alpha"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _refuse(cfg_path, f"{key} must be a positive number, got {value!r}")
    return cfg


def load_peft(path: str | Path) -> AdapterWeights:
    """Read the PEFT LoRA adapter at ``path`` (a directory, or its ``adapter_config.json``)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(path)
    if root.is_file() and root.name in (_CONFIG, _WEIGHTS, _PICKLE):
        root = root.parent
    if not root.is_dir():
        raise _refuse(root, "no such directory")
    weights_path = root / _WEIGHTS
    if not weights_path.is_file():
        if (root / _PICKLE).is_file():
            raise _refuse(
                root / _PICKLE,
                "is a pickled checkpoint, which is never loaded; convert it to adapter_model.safetensors",
            )
        raise _refuse(weights_path, "missing")
    cfg = _read_config(root)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise _refuse(weights_path, f"cannot be read ({exc})") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        found = module_of(key)
        if found is None:
            raise _refuse(
                weights_path,
                f"tensor {key!r} is not a LoRA A/B matrix (embedding adapters and saved modules are not supported)",
            )
        pairs.setdefault(found[0], {})[found[1]] = tensor
    modules = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise _refuse(weights_path, f"module {module!r} has lora_{''.join(ab)} but not both A and B")
        a, b = ab["A"].float(), ab["B"].float()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise _refuse(
                weights_path,
                f"module {module!r}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not share a rank",
            )
        r = int(a.shape[0])
        declared = _pattern_value(cfg.get("rank_pattern"), module, cfg["r"])
        if int(declared) != r:
            raise _refuse(weights_path, f"module {module!r} has rank {r} but the config says {declared}")
        alpha = float(_pattern_value(cfg.get("alpha_pattern"), module, cfg["lora_alpha"]))
        scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        modules[module] = (a.contiguous(), b.contiguous(), scale)
    return AdapterWeights(str(root), modules)
