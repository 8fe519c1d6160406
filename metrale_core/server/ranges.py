"""The allowed ranges of the numeric request fields, one table for the checks and the document.

Owner: ``decode.parse_body`` calls :func:`check_ranges` on every decoded request body; the
request records annotate their bounded fields with :func:`bounded`, which puts the same bound
into the OpenAPI document (``minimum``, ``exclusiveMaximum``, ...).

Invariants:
- :data:`BOUNDS` is the only place a range is written: the 400 text, the check and the
  document's schema all come from it.
- A bound applies by field name to every API's body (``temperature`` is checked the same on
  chat, completions, Messages, Responses and Ollama bodies).
- :func:`check_ranges` names every offending field (``field: <bound text>, got <value>``), with
  ``param`` the first of them; it also bounds ``logit_bias`` and ``stop`` (sizes from ``guards``).
"""

from __future__ import annotations

from typing import Any

import msgspec
from attrs import frozen

from metrale_core.server.errors import APIError
from metrale_core.server.guards import MAX_LOGIT_BIAS, MAX_STOP, MAX_STOP_CHARS

__all__ = ["BOUNDS", "Bound", "bounded", "check_ranges", "validation_error"]


@frozen
class Bound:
    """The allowed range of a numeric request field (``None``: unbounded on that side)."""

    low: float | None = None
    high: float | None = None
    #: The low end itself is excluded (``top_p`` > 0).
    low_open: bool = False
    #: The high end itself is excluded (``seed`` < 2**64).
    high_open: bool = False
    text: str = ""

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool):
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def json_schema(self) -> dict[str, float]:
        """The bound as JSON Schema keywords."""
        out: dict[str, float] = {}
        if self.low is not None:
            out["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            out["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return out


#: field -> bound, for the numeric fields of every request kind.
BOUNDS: dict[str, Bound] = {
    "temperature": Bound(0, 2, text="must be between 0 and 2"),
    "top_p": Bound(0, 1, low_open=True, text="must be in (0, 1]"),
    "top_k": Bound(-1, None, text="must be >= 0 (0 or -1 disables it)"),
    "min_p": Bound(0, 1, text="must be between 0 and 1"),
    "frequency_penalty": Bound(-2, 2, text="must be between -2 and 2"),
    "presence_penalty": Bound(-2, 2, text="must be between -2 and 2"),
    "repetition_penalty": Bound(0, 10, low_open=True, text="must be in (0, 10]"),
    "max_tokens": Bound(1, None, text="must be >= 1"),
    "max_completion_tokens": Bound(1, None, text="must be >= 1"),
    "n": Bound(1, 128, text="must be between 1 and 128"),
    "best_of": Bound(1, 128, text="must be between 1 and 128"),
    "top_logprobs": Bound(0, 20, text="must be between 0 and 20"),
    "logprobs": Bound(0, 20, text="must be between 0 and 20"),
    "seed": Bound(-(1 << 63), 1 << 64, high_open=True, text="must fit in 64 bits"),
    "thinking_token_budget": Bound(0, None, text="must be >= 0"),
}


def bounded(name: str) -> msgspec.Meta:
    """The ``Annotated`` metadata of field ``name``: its bound, for the OpenAPI document."""
    return msgspec.Meta(extra_json_schema=BOUNDS[name].json_schema())


def validation_error(pairs: list[tuple[str, str]]) -> APIError:
    """One 400 for ``(path, message)`` pairs: the first five shown, ``param`` the first path."""
    shown = [f"{p or 'body'}: {m}" for p, m in pairs[:5]]
    more = f" (and {len(pairs) - 5} more)" if len(pairs) > 5 else ""
    return APIError(400, "; ".join(shown) + more, param=pairs[0][0] or None)


def _stop_problems(stop: Any) -> list[tuple[str, str]]:
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    problems = []
    if len(stops) > MAX_STOP:
        problems.append(("stop", f"at most {MAX_STOP} stop strings, got {len(stops)}"))
    for i, text in enumerate(stops[:MAX_STOP]):
        if len(text) > MAX_STOP_CHARS:
            where = "stop" if isinstance(stop, str) else f"stop[{i}]"
            problems.append((where, f"at most {MAX_STOP_CHARS} characters, got {len(text)}"))
    return problems


def _bias_problems(logit_bias: dict[str, float]) -> list[tuple[str, str]]:
    if len(logit_bias) > MAX_LOGIT_BIAS:
        return [("logit_bias", f"at most {MAX_LOGIT_BIAS} entries, got {len(logit_bias)}")]
    problems = []
    for key, bias in logit_bias.items():
        if not key.lstrip("-").isdigit():
            problems.append((f"logit_bias.{key}", "keys must be token ids (integers as strings)"))
        elif not -100.0 <= bias <= 100.0:
            problems.append((f"logit_bias.{key}", f"must be between -100 and 100, got {bias}"))
    return problems


def check_ranges(request: Any) -> None:
    """Raise a 400 naming every numeric field of ``request`` outside its allowed range."""
    problems = []
    for name in getattr(request, "__struct_fields__", ()):
        bound = BOUNDS.get(name)
        value = getattr(request, name)
        if bound is not None and value is not None and not bound.ok(value):
            problems.append((name, f"{bound.text}, got {value!r}"))
    problems += _bias_problems(getattr(request, "logit_bias", None) or {})
    problems += _stop_problems(getattr(request, "stop", None))
    if problems:
        raise validation_error(problems)
