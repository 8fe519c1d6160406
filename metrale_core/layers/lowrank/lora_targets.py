"""The LoRA targets a model declares: each projection's checkpoint module paths and where it sits.

Owner: ``metrale_core.layers``.  A loader declares, as it builds each projection an adapter may
adapt, a :class:`LoRATarget`: the *path* from its weights record to the projection (attribute
names and tuple / list indices, ``("layers", 0, "qkv")``) and the :class:`LoRAPart` s the
projection fuses (checkpoint module path, output rows: ``model.layers.0.self_attn.q_proj``
rows ``0 .. q``, ``k_proj`` next ...).  A model returns them, rooted at itself, from the optional
``lora_targets()`` (:class:`LoRATargetsLM`, documented in ``metrale_core.model_api``);
``lora.attach_lora`` wraps exactly these.  The decoder definition declares them for every family
(``metrale_core.decoder.weights``), so a model on the definition declares nothing of its own.

Invariants:
- Targets are found by path, never by object identity: nothing here is process-global, so two
  models loaded in one process never see each other's targets.
- A part's ``offset`` is the sum of the rows of the parts before it (the fused order).
- :func:`replace` sets the last step of a path in place (a list / dict item, or an attribute,
  through ``object.__setattr__`` so frozen records work) and rebuilds a tuple on the way (the
  new tuple is set on its own owner), so a projection in a tuple deep inside is replaced too.
- What is not declared is never wrapped: the output head, and the routed experts of an MoE
  layer (an expert sees a subset of the batch's rows, which the LoRA row map does not follow).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from attrs import frozen

from metrale_core.model_api import CausalLM

__all__ = ["LoRAPart", "LoRATarget", "LoRATargets", "LoRATargetsLM", "Step", "replace", "resolve"]

#: One step of a path: an attribute name, or an index into a tuple / list (a key into a dict).
Step = str | int


@frozen
class LoRAPart:
    """One checkpoint projection inside a (fused) ``Linear``: its module name and output rows."""

    #: Module name without ``.weight`` (``model.layers.0.self_attn.q_proj``).
    module: str
    offset: int
    out_features: int
    in_features: int


def _module_name(tensor_name: str) -> str:
    return tensor_name[: -len(".weight")] if tensor_name.endswith(".weight") else tensor_name


@frozen
class LoRATarget:
    """A projection LoRA may wrap: where it sits (``path``) and the checkpoint parts it fuses."""

    path: tuple[Step, ...]
    parts: tuple[LoRAPart, ...]

    @classmethod
    def of(cls, path: Sequence[Step], names: Sequence[str], shapes: Sequence[tuple[int, int]]) -> LoRATarget:
        """The target at ``path`` of a projection fusing tensors ``names`` (``[out, in]`` each,
        as passed to ``build_linear``), stacked in that order."""
        parts, offset = [], 0
        for name, (out_f, in_f) in zip(names, shapes, strict=True):
            parts.append(LoRAPart(_module_name(name), offset, int(out_f), int(in_f)))
            offset += int(out_f)
        return cls(tuple(path), tuple(parts))

    @property
    def dotted(self) -> str:
        """The path as one string (``layers.0.qkv``), for messages."""
        return ".".join(str(step) for step in self.path)


@frozen
class LoRATargets:
    """Every target of one model (or one weights record: paths relative to it)."""

    targets: tuple[LoRATarget, ...] = ()

    def __iter__(self) -> Iterator[LoRATarget]:
        return iter(self.targets)

    def __len__(self) -> int:
        return len(self.targets)

    def under(self, *prefix: Step) -> LoRATargets:
        """The same targets seen from the owner of this record (its attribute ``prefix``)."""
        return LoRATargets(tuple(LoRATarget((*prefix, *t.path), t.parts) for t in self.targets))


class LoRATargetsLM(CausalLM, Protocol):
    """A ``CausalLM`` with the optional ``lora_targets`` (see ``metrale_core.model_api``)."""

    def lora_targets(self) -> LoRATargets: ...


def _get(owner: Any, step: Step) -> Any:
    if isinstance(owner, (tuple, list, dict)):
        return owner[step]  # type: ignore[index]
    return getattr(owner, str(step))


def resolve(root: Any, path: Sequence[Step]) -> Any:
    """The object at ``path`` from ``root`` (``LookupError`` naming the path when it is not there)."""
    obj = root
    for depth, step in enumerate(path):
        try:
            obj = _get(obj, step)
        except (AttributeError, IndexError, KeyError, TypeError) as exc:
            where = ".".join(str(s) for s in path[: depth + 1])
            raise LookupError(f"{type(root).__name__} has nothing at {where!r}") from exc
    return obj


def replace(root: Any, path: Sequence[Step], value: Any) -> None:
    """Put ``value`` at ``path`` from ``root`` in place (see the module docstring)."""
    if not path:
        raise ValueError("an empty path names the root itself, which cannot be replaced")
    owners = [root]
    for step in path[:-1]:
        owners.append(resolve(owners[-1], [step]))
    new = value
    for owner, step in zip(reversed(owners), reversed(path)):
        if isinstance(owner, tuple):
            items = list(owner)
            items[int(step)] = new
            new = type(owner)(*items) if hasattr(owner, "_fields") else tuple(items)
            continue  # the rebuilt tuple goes to its own owner
        if isinstance(owner, (list, dict)):
            owner[step] = new  # type: ignore[index]
        else:
            object.__setattr__(owner, str(step), new)
        return
    raise TypeError(f"cannot replace {'.'.join(map(str, path))!r}: the root {type(root).__name__} is a tuple")
