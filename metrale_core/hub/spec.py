"""Model names on the Hugging Face hub: ``ORG/NAME``, ``ORG/NAME:QUANT``, ``ORG/NAME/FILE.gguf``.

Owner: ``metrale_core.hub.fetch`` and the CLI (``met serve`` / ``met generate`` / ``met pull``).

Invariants:
- A path that exists on disk is never a hub name (a local path always wins).
- GGUF file choice follows llama.cpp's ``-hf``: the quant tag is case-insensitive, the default is
  ``Q4_K_M``, else the first ``.gguf``; split files (``-00001-of-0000N.gguf``) are chosen together.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from metrale_core.errors import ConfigError

__all__ = ["DEFAULT_QUANT", "HubSpec", "choose_gguf_files", "is_hub_name", "parse_spec", "wanted_hf_file"]

DEFAULT_QUANT = "Q4_K_M"
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_HF_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
    "preprocessor_config.json",
}


@attrs.frozen
class HubSpec:
    """A parsed hub name: the repo, and for a GGUF repo the quant tag or the file."""

    repo_id: str
    quant: str | None = None
    filename: str | None = None


def is_hub_name(text: str) -> bool:
    """True when ``text`` looks like ``ORG/NAME[:QUANT]`` or ``ORG/NAME/FILE.gguf`` and no such path exists."""
    if Path(text).expanduser().exists() or text.startswith((".", "/", "~")):
        return False
    try:
        parse_spec(text)
    except ConfigError:
        return False
    return True


def parse_spec(text: str) -> HubSpec:
    """Parse a hub model name; a malformed one is a ``ConfigError``."""
    body, _, quant = text.partition(":")
    parts = body.split("/")
    if len(parts) == 3 and parts[2].lower().endswith(".gguf") and not quant:
        repo = "/".join(parts[:2])
        if _REPO_RE.match(repo):
            return HubSpec(repo, filename=parts[2])
    if len(parts) == 2 and _REPO_RE.match(body) and (not quant or re.fullmatch(r"[\w.-]+", quant)):
        return HubSpec(body, quant=quant or None)
    raise ConfigError(f"not a hub model name: {text!r} (expected ORG/NAME, ORG/NAME:QUANT or ORG/NAME/FILE.gguf)")


def choose_gguf_files(files: list[str], quant: str | None) -> list[str]:
    """The GGUF file(s) to fetch for ``quant`` (default ``Q4_K_M``, else the first .gguf); [] if none."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        return []
    tag = (quant or DEFAULT_QUANT).lower()
    tagged = [f for f in ggufs if re.search(rf"(^|[-_.]){re.escape(tag)}([-_.]|$)", Path(f).name.lower())]
    if not tagged:
        if quant:
            raise ConfigError(f"no GGUF file for quant {quant!r}; the repo has: {', '.join(ggufs)}")
        tagged = ggufs
    first = tagged[0]
    split = _SPLIT_RE.search(first)
    if not split:
        return [first]
    stem = first[: split.start()]
    return sorted(f for f in ggufs if f.startswith(stem) and _SPLIT_RE.search(f))


def wanted_hf_file(path: str) -> bool:
    """Whether an HF (safetensors) repo file is one the engine loads."""
    name = path.rsplit("/", 1)[-1]
    return "/" not in path and (name in _HF_FILES or name.endswith(".safetensors"))
