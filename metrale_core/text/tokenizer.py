"""``Tokenizer``: text <-> token ids, special ids and the chat template of one checkpoint.

Owner: the frontend (prompts, chat templates) and the engine's output path (decoding, EOS ids).
Built on the ``tokenizers`` library only; ``transformers`` is never imported at runtime.

Sources:
- a Hugging Face directory: ``tokenizer.json`` plus, when present, ``tokenizer_config.json``
  (special tokens, ``add_bos_token``, ``chat_template``), ``chat_template.jinja`` /
  ``chat_template.json`` and ``generation_config.json`` (extra EOS ids);
- a GGUF file's ``tokenizer.*`` metadata: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE from
  the stored tokens and merges; CONTROL tokens become special added tokens, USER_DEFINED tokens
  plain added tokens, matched whole in the text the way llama.cpp does), or ``"llama"``
  (SentencePiece: ``tokenizer_spm``).

Invariants:
- ``encode(text, add_special_tokens=False)`` never adds BOS/EOS; with ``True`` it adds exactly what
  the checkpoint asks for (``add_bos_token`` / ``add_eos_token``, or the tokenizer.json post-processor).
- ``eos_token_ids`` is non-empty-unique and starts with the tokenizer's own EOS id when it has one;
  from a GGUF it adds EOT / EOM and, for gpt-oss's vocabulary, ``<|return|>`` and ``<|call|>``.
- No padding or truncation is ever applied (the engine owns lengths).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen
from loguru import logger
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from metrale_core.errors import InvalidRequest, WeightsError
from metrale_core.text.chat_template import render_chat_template
from metrale_core.text.tokenizer_spm import spm_backend

__all__ = ["Tokenizer", "TokenizerError", "read_gguf_metadata"]

# llama.cpp token types (gguf.TokenType)
_CONTROL = 3
_USER_DEFINED = 4

# Pre-tokenizer split regexes by ``tokenizer.ggml.pre``.  Absent -> the GPT-2 regex of ByteLevel
# (gpt2, smollm, starcoder, ...).  Same table transformers uses for GGUF files.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx", "pixtral"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
# llama.cpp matches whole vocabulary words before merging for these (tokenizer.json ignore_merges).
_IGNORE_MERGES = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx", "pixtral"))


class TokenizerError(WeightsError):
    """A checkpoint whose tokenizer cannot be built (missing files, unsupported GGUF tokenizer)."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the alphabet of byte-level vocabularies)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_CHARS = _bytes_to_unicode()
_BYTE_ALPHABET = frozenset(_BYTE_CHARS.values())


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, a dict with "content", or null."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _int_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The ``general.*`` and ``tokenizer.*`` metadata of a GGUF file as plain python values."""
    from metrale_core.weights.gguf_file import GGUFFile

    try:
        reader = GGUFFile(path)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read GGUF metadata from {path}: {exc}") from exc
    return {key: fld.contents() for key, fld in reader.fields.items() if key.startswith(("tokenizer.", "general."))}


@frozen(eq=False)
class Tokenizer:
    """One checkpoint's tokenizer (immutable after construction; safe to share between threads)."""

    backend: _Backend = field(repr=False)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    chat_template: str | None = field(repr=False)
    #: template variables transformers passes: bos_token, eos_token, unk_token, pad_token (strings)
    special_tokens: Mapping[str, str] = field(repr=False)
    source: str = ""

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_store(cls, store) -> Tokenizer:
        """From a :class:`metrale_core.weights.WeightStore` (GGUF metadata or the HF tokenizer dir)."""
        metadata = getattr(store, "gguf_metadata", None)
        if metadata is not None:
            return cls.from_gguf_metadata(metadata, source=str(store.path))
        path = Path(store.path)
        return cls.from_dir(getattr(store, "tokenizer_dir", None) or (path if path.is_dir() else path.parent))

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer:
        """From a ``.gguf`` file or a Hugging Face directory."""
        path = Path(path)
        return cls.from_gguf(path) if path.is_file() and path.suffix == ".gguf" else cls.from_dir(path)

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """From the ``tokenizer.*`` metadata of a GGUF file (standalone: no weight store needed)."""
        return cls.from_gguf_metadata(read_gguf_metadata(path), source=str(path))

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], *, source: str = "<gguf>") -> Tokenizer:
        """From a GGUF metadata dict (key -> value; arrays as lists)."""
        tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or [])
        if not tokens:
            raise TokenizerError(f"{source}: the GGUF metadata has no tokenizer.ggml.tokens; it carries no tokenizer")
        kind = meta.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise TokenizerError(
                f"{source}: GGUF tokenizer type {kind!r} is not supported (only byte-level BPE, "
                f"tokenizer.ggml.model = 'gpt2', and SentencePiece, 'llama'); use the model's Hugging Face "
                f"directory instead"
            )
        types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        backend = (
            spm_backend(meta, tokens, types)
            if kind == "llama"
            else cls._byte_level_backend(meta, tokens, types, source)
        )

        def token_id(key: str) -> int | None:
            value = meta.get(f"tokenizer.ggml.{key}")
            return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

        bos, eos = token_id("bos_token_id"), token_id("eos_token_id")
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        _set_post_processor(backend, tokens, bos if add_bos else None, eos if add_eos else None)
        names = {
            "bos_token": bos,
            "eos_token": eos,
            "unk_token": token_id("unknown_token_id"),
            "pad_token": token_id("padding_token_id"),
        }
        return cls(
            backend=backend,
            bos_token_id=bos,
            eos_token_ids=_unique([eos, token_id("eot_token_id"), token_id("eom_token_id"), *_harmony_stops(tokens)]),
            pad_token_id=names["pad_token"],
            chat_template=meta.get("tokenizer.chat_template"),
            special_tokens={k: tokens[v] for k, v in names.items() if v is not None},
            source=source,
        )

    @staticmethod
    def _byte_level_backend(meta: Mapping[str, Any], tokens: list[str], types: list[int], source: str) -> _Backend:
        """The byte-level BPE backend of a ``gpt2`` GGUF vocabulary."""
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
        pre = meta.get("tokenizer.ggml.pre")

        vocab: dict[str, int] = {}
        added: list[AddedToken] = []
        for index, (token, ttype) in enumerate(zip(tokens, types)):
            if ttype in (_CONTROL, _USER_DEFINED):
                # stored as raw text (llama.cpp emits these verbatim)
                added.append(AddedToken(token, special=ttype == _CONTROL, normalized=False))
            elif not set(token) <= _BYTE_ALPHABET:
                token = "".join(_BYTE_CHARS[b] for b in token.encode("utf-8"))
            if vocab.setdefault(token, index) != index:
                logger.debug("{}: token {} duplicates {!r}; keeping id {}", source, index, token, vocab[token])

        backend = _Backend(
            models.BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                ignore_merges=pre in _IGNORE_MERGES,
            )
        )
        split = _PRE_SPLITS.get(pre) if pre is not None else None
        if split is None:
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(split), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([t for t in added if t.special])
        backend.add_tokens([t for t in added if not t.special])

        return backend

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        """From a Hugging Face directory holding ``tokenizer.json`` (fast tokenizers only)."""
        directory = Path(directory)
        tokenizer_json = directory / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise TokenizerError(
                f"no tokenizer.json in {directory}; Metrale needs a 'fast' tokenizer file "
                f"(save one with transformers: AutoTokenizer.from_pretrained(...).save_pretrained(dir))"
            )
        try:
            backend = _Backend.from_file(str(tokenizer_json))
        except Exception as exc:  # tokenizers raises plain Exception on a bad file
            raise TokenizerError(f"cannot parse {tokenizer_json}: {exc}") from exc
        config = _read_json(directory / "tokenizer_config.json")
        # tokens listed only in tokenizer_config.json's added_tokens_decoder
        for _raw_id, info in sorted((config.get("added_tokens_decoder") or {}).items(), key=lambda kv: int(kv[0])):
            content = info.get("content")
            if content and backend.token_to_id(content) is None:
                token = AddedToken(
                    content,
                    special=bool(info.get("special")),
                    normalized=bool(info.get("normalized", not info.get("special"))),
                )
                (backend.add_special_tokens if token.special else backend.add_tokens)([token])

        names = {
            name: _token_content(config.get(name)) for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        ids = {name: backend.token_to_id(tok) if tok is not None else None for name, tok in names.items()}
        _apply_bos_eos_flags(backend, config, ids["bos_token"], ids["eos_token"])

        generation = _read_json(directory / "generation_config.json")
        return cls(
            backend=backend,
            bos_token_id=ids["bos_token"],
            eos_token_ids=_unique([ids["eos_token"], *_int_list(generation.get("eos_token_id"))]),
            pad_token_id=ids["pad_token"],
            chat_template=_find_chat_template(directory, config),
            special_tokens={k: v for k, v in names.items() if v is not None},
            source=str(directory),
        )

    def __attrs_post_init__(self) -> None:
        self.backend.no_padding()
        self.backend.no_truncation()

    # ---- encoding / decoding ------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (added tokens included)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special (what ``skip_special_tokens`` drops)."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    # ---- chat -------------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation with the checkpoint's chat template (transformers semantics)."""
        if self.chat_template is None:
            raise InvalidRequest(f"the tokenizer of {self.source} has no chat template; send a plain prompt instead")
        variables = {**self.special_tokens, **template_kwargs}
        return render_chat_template(
            self.chat_template, messages, tools=tools, add_generation_prompt=add_generation_prompt, **variables
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Prompt ids of a conversation: the rendered template encoded without adding special tokens
        (the template writes them itself, as in transformers' ``apply_chat_template(tokenize=True)``)."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools, **template_kwargs)
        return self.encode(text, add_special_tokens=False)


#: gpt-oss's (o200k_harmony) ends of a turn: the answer's and a tool call's.  A GGUF names one EOS;
#: llama.cpp ends generation at both by their text, as HF's generation_config lists both.
_HARMONY_STOPS = ("<|return|>", "<|call|>")


def _harmony_stops(tokens: Sequence[str]) -> list[int]:
    """The ids of ``<|return|>`` and ``<|call|>`` when the vocabulary has both (else none)."""
    if not all(stop in tokens for stop in _HARMONY_STOPS):
        return []
    return [tokens.index(stop) for stop in _HARMONY_STOPS]


def _unique(ids: Iterable[int | None]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot parse {path}: {exc}") from exc


def _find_chat_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    """chat_template.jinja, then chat_template.json, then tokenizer_config.json's chat_template
    (a string, or a list of {name, template} of which "default" is taken)."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(directory / "chat_template.json").get("chat_template") or config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _set_post_processor(backend: _Backend, tokens: Sequence[str] | None, bos: int | None, eos: int | None) -> None:
    """BOS / EOS around every encoded text when asked, nothing otherwise."""
    if bos is None and eos is None:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
        return
    name = (lambda i: tokens[i]) if tokens is not None else backend.id_to_token

    def around(piece: str, type_id: int) -> list[str]:
        return (
            ([f"{name(bos)}:{type_id}"] if bos is not None else [])
            + [f"${piece}:{type_id}"]
            + ([f"{name(eos)}:{type_id}"] if eos is not None else [])
        )

    backend.post_processor = processors.TemplateProcessing(
        single=around("A", 0),
        pair=around("A", 0) + around("B", 1),
        special_tokens=[(name(i), i) for i in dict.fromkeys((bos, eos)) if i is not None],
    )


def _apply_bos_eos_flags(backend: _Backend, config: Mapping[str, Any], bos: int | None, eos: int | None) -> None:
    """Honour explicit ``add_bos_token`` / ``add_eos_token`` when the tokenizer.json post-processor
    disagrees (transformers rebuilds the post-processor from these flags too)."""
    want_bos, want_eos = config.get("add_bos_token"), config.get("add_eos_token")
    if want_bos is None and want_eos is None:
        return
    probe = backend.encode("a", add_special_tokens=True).ids
    bare = backend.encode("a", add_special_tokens=False).ids
    has_bos = bos is not None and len(probe) > len(bare) and probe[0] == bos
    has_eos = eos is not None and len(probe) > len(bare) and probe[-1] == eos
    new_bos = has_bos if want_bos is None else bool(want_bos) and bos is not None
    new_eos = has_eos if want_eos is None else bool(want_eos) and eos is not None
    if (new_bos, new_eos) != (has_bos, has_eos):
        _set_post_processor(backend, None, bos if new_bos else None, eos if new_eos else None)
