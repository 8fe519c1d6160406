"""Models by Hugging Face hub name: parse ``ORG/NAME[:QUANT]``, fetch into the HF cache, list, remove.

Owner: the CLI (``met serve ORG/NAME``, ``met pull``, ``met models``, ``met rm``).

Invariants:
- Importing this package does not import ``huggingface_hub`` until a hub name is used.
"""

from metrale_core.hub.fetch import fetch_model, resolve_model_arg
from metrale_core.hub.spec import HubSpec, is_hub_name, parse_spec

__all__ = ["HubSpec", "fetch_model", "is_hub_name", "parse_spec", "resolve_model_arg"]
