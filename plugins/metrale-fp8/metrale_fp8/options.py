"""The fp8 plugin's flags and how their values are resolved.

Owner: ``metrale_fp8``; the flags are added through ``metrale_engine_flags`` and arrive in
``EngineConfig.plugin_options`` under their argparse ``dest``.

Invariants:
- Calibration window precedence: ``--fp8-kv-calibration-tokens`` -> ``MODEL.toml``
  ``[behavior].fp8_kv_calibration_tokens`` beside the checkpoint -> 0; clamped to 4096; 1 freezes
  at the first observation; 0 is off.
- A non-zero window from the flag with a KV dtype other than fp8 is a ``ConfigError`` (a
  MODEL.toml window is a model default and is simply not used then).
- ``--fp8-kv-headroom`` defaults to 2.0 and must be a finite number >= 1.0.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomllib
from attrs import frozen
from loguru import logger

from metrale_core.api import ConfigError

__all__ = [
    "CALIBRATION_DEST",
    "DEFAULT_HEADROOM",
    "HEADROOM_DEST",
    "MAX_CALIBRATION_TOKENS",
    "Fp8Options",
    "add_flags",
    "model_toml_path",
    "refuse_without_fp8",
    "resolve_fp8_options",
]

CALIBRATION_DEST = "fp8_kv_calibration_tokens"
HEADROOM_DEST = "fp8_kv_headroom"
MAX_CALIBRATION_TOKENS = 4096
DEFAULT_HEADROOM = 2.0


@frozen
class Fp8Options:
    """The resolved options of one engine."""

    #: Calibration window in tokens (0 = off), after clamping.
    calibration_tokens: int
    #: The window came from MODEL.toml rather than the flag.
    auto_enabled: bool
    #: ``scale = amax * headroom / 448``.
    headroom: float


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 1.0, got {text}")
    return value


def add_flags(parser: Any) -> None:
    """Add ``--fp8-kv-calibration-tokens`` and ``--fp8-kv-headroom`` to the engine flag group."""
    parser.add_argument(
        "--fp8-kv-calibration-tokens",
        dest=CALIBRATION_DEST,
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="with --kv-cache-dtype fp8: calibrate per-layer K/V scales on the first N observed "
        f"tokens, then freeze (0 = off, 1 = first observation, max {MAX_CALIBRATION_TOKENS}; "
        "default: MODEL.toml [behavior].fp8_kv_calibration_tokens beside the checkpoint, "
        "else 0)",
    )
    parser.add_argument(
        "--fp8-kv-headroom",
        dest=HEADROOM_DEST,
        type=_headroom,
        default=DEFAULT_HEADROOM,
        metavar="X",
        help="calibrated scale = amax * X / 448 (>= 1.0; default: 2.0)",
    )


def model_toml_path(model_path: Path | None) -> Path | None:
    """``MODEL.toml`` beside the checkpoint: in its directory, or beside a single-file checkpoint."""
    if model_path is None:
        return None
    model_path = Path(model_path)
    return (model_path if model_path.is_dir() else model_path.parent) / "MODEL.toml"


def _model_toml_tokens(model_path: Path | None) -> int | None:
    path = model_toml_path(model_path)
    if path is None or not path.is_file():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    behavior = data.get("behavior", {})
    value = behavior.get(CALIBRATION_DEST) if isinstance(behavior, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{path}: [behavior].{CALIBRATION_DEST} must be an integer >= 0, got {value!r}")
    return value


def refuse_without_fp8(options: Mapping[str, Any], kv_cache_dtype: str | None) -> None:
    """A non-zero calibration window from the flag needs ``--kv-cache-dtype fp8``."""
    tokens = options.get(CALIBRATION_DEST)
    if tokens:
        raise ConfigError(
            f"--fp8-kv-calibration-tokens {tokens} needs --kv-cache-dtype fp8 (the KV cache is "
            f"{kv_cache_dtype or 'the model dtype'}); pass --kv-cache-dtype fp8 or drop the flag"
        )


def resolve_fp8_options(options: Mapping[str, Any], model_path: Path | None) -> Fp8Options:
    """Apply the precedence, the clamp and the headroom check (see the module docstring)."""
    flag = options.get(CALIBRATION_DEST)
    if flag is not None and (isinstance(flag, bool) or not isinstance(flag, int) or flag < 0):
        raise ConfigError(f"--fp8-kv-calibration-tokens must be an integer >= 0, got {flag!r}")
    from_toml = _model_toml_tokens(model_path) if flag is None else None
    tokens = flag if flag is not None else (from_toml or 0)
    if tokens > MAX_CALIBRATION_TOKENS:
        logger.warning("--fp8-kv-calibration-tokens {} clamped to {}", tokens, MAX_CALIBRATION_TOKENS)
        tokens = MAX_CALIBRATION_TOKENS
    headroom = options.get(HEADROOM_DEST)
    headroom = DEFAULT_HEADROOM if headroom is None else headroom
    if (
        isinstance(headroom, bool)
        or not isinstance(headroom, (int, float))
        or not math.isfinite(headroom)
        or headroom < 1.0
    ):
        raise ConfigError(f"--fp8-kv-headroom must be a finite number >= 1.0, got {headroom!r}")
    return Fp8Options(calibration_tokens=tokens, auto_enabled=flag is None and tokens > 0, headroom=float(headroom))
