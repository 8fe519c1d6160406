"""Error classes: every error a user can cause or meet is one of these, with a message they can act on.

Owner: shared by all layers.  Invariants: the CLI and the HTTP server turn a ``MetraleError`` into a
one-line message (exit code 2 / HTTP 4xx) instead of a traceback.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CorruptWeightsFile",
    "DuplicateComponent",
    "InvalidRequest",
    "KVCacheExhausted",
    "MetraleError",
    "MissingWeightsFile",
    "PluginError",
    "PluginImportError",
    "PromptTooLong",
    "RequestError",
    "ShapeMismatch",
    "UnknownArchitecture",
    "WeightsError",
]


class MetraleError(Exception):
    """Base of every error Metrale raises on purpose."""


class ConfigError(MetraleError):
    """A bad flag, environment variable or configuration value."""


class WeightsError(MetraleError):
    """A checkpoint that cannot be loaded."""


class MissingWeightsFile(WeightsError):
    """A file the checkpoint needs is not there."""


class CorruptWeightsFile(WeightsError):
    """A file is there but cannot be parsed (truncated, bad header, bad index)."""


class UnknownArchitecture(WeightsError, ConfigError):
    """No installed model loader serves the checkpoint's architecture (also a ``ConfigError``:
    what is installed and configured, not the checkpoint's bytes, is what lacks it)."""


class ShapeMismatch(WeightsError):
    """A tensor's shape differs from what the model config implies."""


class PluginError(MetraleError):
    """A plugin problem."""


class DuplicateComponent(PluginError):
    """Two distributions register a component under the same name."""


class PluginImportError(PluginError):
    """A plugin failed to import (raised only in strict mode; otherwise a warning)."""


class RequestError(MetraleError):
    """A request the engine refuses."""


class InvalidRequest(RequestError):
    """A malformed request (empty prompt, bad max_tokens, ...)."""


class PromptTooLong(RequestError):
    """The prompt (plus at least one output token) does not fit the model's context."""


class KVCacheExhausted(RequestError):
    """A single sequence needs more KV blocks than the whole pool holds."""
