"""The integer flags every benchmark script takes (``--threads 2``, ``--decode-tokens 64``, ...), as a table.

Owner: the ``bench/*.py`` scripts' ``main()``; each names its integer flags and their defaults in
one call instead of one ``add_argument`` line a flag.

Invariants:
- ``int_flags(parser, decode_tokens=64)`` adds exactly ``parser.add_argument("--decode-tokens",
  type=int, default=64)``: underscores become dashes, the flags are added in keyword order, no help
  text, so a script's ``--help`` and parsed namespace are what the lines it replaces gave.
"""

from __future__ import annotations

import argparse

__all__ = ["int_flags"]


def int_flags(parser: argparse.ArgumentParser, **defaults: int) -> argparse.ArgumentParser:
    """Add one ``--name`` flag of type ``int`` a keyword (``name_with_underscores`` is
    ``--name-with-underscores``), defaulting to its value; return ``parser``."""
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    return parser
