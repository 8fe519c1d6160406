"""Model dtype names (``--dtype``, ``LoadOptions.dtype``) -> torch dtypes.

Owner: ``metrale_core.layers``; every model loader resolves its dtype here (one table).

Invariants: the names are exactly ``float32``, ``bfloat16`` and ``float16``; any other is a
``ConfigError`` naming the supported ones.
"""

from __future__ import annotations

import torch

from metrale_core.errors import ConfigError

__all__ = ["DTYPES", "torch_dtype"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name``; a ``ConfigError`` for names not in :data:`DTYPES`."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"dtype {name!r} is not supported; use one of {sorted(DTYPES)}") from None
