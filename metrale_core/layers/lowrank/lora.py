"""LoRA on any ``Linear``: per-row adapters, batched by adapter, added to the base projection.

Owner: ``metrale_core.layers``.  The adapter bank (``metrale_core.engine.adapters``) wraps a
model's projections with :class:`LoRALinear` after loading (:func:`attach_lora`), writes adapter
weights into their slots, and the runner makes each step's row -> slot map visible to every
wrapper for the duration of one forward (:func:`active_rows`).  The model declares what may be
wrapped (``lora_targets()``, :mod:`metrale_core.layers.lowrank.lora_targets`): per projection its path
from the model and the checkpoint module paths it fuses, which is how a wrapper knows which PEFT
modules (``q_proj``, ``k_proj`` ...) it holds and where each one's rows sit in the fused output.

The maths (per adapter ``a`` and projection part ``p``): ``y[t] += scale_a * (x[t] @ A_ap.T) @
B_ap.T`` for every row ``t`` of adapter ``a``; the scale is folded into ``B`` when a slot is
written.  A fused projection keeps, per slot, ``A = [A_q; A_k; A_v]`` ``[R, in]`` and ``B``
``[out, R]`` block-placed at each part's output rows (zeros elsewhere), so one shrink and one
expand matmul serve every part.

Invariants:
- Without an active row map, or with no adapter row in it, a wrapper returns exactly the base
  projection's output (same tensor).
- Rows are grouped by slot (:class:`LoRARows`), so a row's delta is computed from that row and
  its adapter only; rows of other adapters or the base never change it.
- Only the declared targets are wrapped, each by its path (no search of the model's objects);
  a model that declares none is a ``ConfigError`` naming it.  The output head is never declared.
- Paths over one storage (slot-stacked ``A`` ``[S, R, in]``, ``B`` ``[S, out, R]``): on CPU the
  C kernel (``kernels/cpu/lora_apply.c``, float32: every slot in one call, reading only the
  parts' own blocks of the weights, which bound the work at a few rows per adapter); where it does
  not run (``METRALE_KERNELS=native``, no compiler, other dtypes) torch batched products
  (``LoRALinear._batched``: the rows gathered per slot, two ``bmm``) or grouped matmuls
  (``LoRAApply.forward_native``: four small products per adapter group; one adapter in the step,
  or rows too unevenly spread over the slots); on GPU a CuPy kernel (``kernels/lora.cu``, per-row
  shrink then expand).  All give each row ``x[t] @ A_s.T @ B_s.T`` of its own slot only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import torch
from attrs import field, frozen

from metrale_core.errors import ConfigError
from metrale_core.kernels import CustomOp
from metrale_core.kernels.cuda import i32, i64, ptr, torch_stream
from metrale_core.kernels.custom_op import cpu_layer_library
from metrale_core.layers.formats.cpu_qmatmul import PACKAGE  # the C library of metrale_core.layers
from metrale_core.layers.lowrank.lora_targets import LoRAPart, replace, resolve

__all__ = [
    "LoRAApply",
    "LoRALinear",
    "LoRAPart",
    "LoRARows",
    "SlotBatches",
    "active_rows",
    "attach_lora",
]

_ROWS: ContextVar[LoRARows | None] = ContextVar("metrale_lora_rows", default=None)


@frozen
class LoRARows:
    """The row -> slot map of one forward: ``slots[t]`` (-1 = base) and the rows of each slot."""

    #: ``[T]`` int32 slot per row, on the model's device.
    slots: torch.Tensor
    #: ``(slot, rows)`` per adapter slot present; ``rows`` a slice when contiguous, else ``[n]`` int64.
    groups: tuple[tuple[int, Any], ...]
    #: slot -> its rows, in row order (the source of ``groups`` and of the layouts below).
    members: dict[int, tuple[int, ...]] = field(eq=False, repr=False)
    #: The step's layouts for the CPU paths, built once per step on first use.
    _layouts: dict = field(factory=dict, eq=False, repr=False)

    def slot_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(order, starts)`` int64: the adapter rows sorted by slot (stable) and, per slot ``s``,
        ``order[starts[s]:starts[s + 1]]`` its rows (the C kernel's input)."""
        csr = self._layouts.get("csr")
        if csr is None:
            order: list[int] = []
            starts = [0]
            for slot in range(max(self.members) + 1):
                order.extend(self.members.get(slot, ()))
                starts.append(len(order))
            csr = self._layouts["csr"] = (
                torch.tensor(order, dtype=torch.int64),
                torch.tensor(starts, dtype=torch.int64),
            )
        return csr

    def slot_batches(self) -> SlotBatches:
        """The step's rows laid out as equal-sized batches per slot (see :class:`SlotBatches`)."""
        batches = self._layouts.get("batches")
        if batches is None:
            batches = self._layouts["batches"] = SlotBatches.build(self)
        return batches

    @classmethod
    def from_slots(cls, slots: Sequence[int], device: torch.device | str = "cpu") -> LoRARows | None:
        """The map of per-row ``slots``; None when no row uses an adapter."""
        by_slot: dict[int, list[int]] = {}
        for t, s in enumerate(slots):
            if s >= 0:
                by_slot.setdefault(int(s), []).append(t)
        if not by_slot:
            return None
        groups: list[tuple[int, slice | torch.Tensor]] = []
        for s, rows in by_slot.items():
            if rows[-1] - rows[0] + 1 == len(rows):
                groups.append((s, slice(rows[0], rows[-1] + 1)))
            else:
                groups.append((s, torch.tensor(rows, dtype=torch.int64, device=device)))
        members = {s: tuple(rows) for s, rows in by_slot.items()}
        return cls(torch.tensor(list(slots), dtype=torch.int32, device=device), tuple(groups), members)


@frozen
class SlotBatches:
    """The adapter rows of one step as ``span`` equal batches of ``depth`` rows, one per slot of
    ``first .. first + span - 1`` (slots without rows of this step get an empty, all-padding batch):
    ``rows[i * depth + j]`` is the ``j``-th row of slot ``first + i``; padding entries point at
    row 0 and are listed in ``padding`` (their inputs are zeroed, so they add exactly zero)."""

    first: int
    span: int
    depth: int
    #: ``[span * depth]`` int64 row index per batch entry.
    rows: torch.Tensor
    #: ``[P]`` int64 positions of the padding entries in ``rows`` (None: no padding).
    padding: torch.Tensor | None
    #: Rows in the batches (padding included) / adapter rows of the step.
    fill: float

    @classmethod
    def build(cls, rows: LoRARows) -> SlotBatches:
        by_slot = rows.members
        first, last = min(by_slot), max(by_slot)
        span, depth = last - first + 1, max(len(r) for r in by_slot.values())
        index: list[int] = []
        padding: list[int] = []
        for s in range(first, last + 1):
            own = list(by_slot.get(s, ()))
            padding.extend(range(len(index) + len(own), len(index) + depth))
            index.extend(own + [0] * (depth - len(own)))
        device = rows.slots.device
        return cls(
            first,
            span,
            depth,
            torch.tensor(index, dtype=torch.int64, device=device),
            torch.tensor(padding, dtype=torch.int64, device=device) if padding else None,
            len(index) / sum(len(r) for r in by_slot.values()),
        )


@contextlib.contextmanager
def active_rows(rows: LoRARows | None) -> Iterator[None]:
    """Make ``rows`` the row -> adapter map every :class:`LoRALinear` reads during the block."""
    token = _ROWS.set(rows)
    try:
        yield
    finally:
        _ROWS.reset(token)


_THREADS = 128


def lora_kernel() -> Any:
    """The package's C library when the CPU path is chosen for LoRA, else None (torch paths)."""
    return cpu_layer_library("LoRALinear", PACKAGE)


#: Most padding rows per adapter row for which a CPU projection runs all slots in two batched
#: products (``LoRALinear._batched``) rather than four small products per adapter group.
BATCHED_MAX_FILL = 2.0


class LoRAApply(CustomOp):
    """``y[t] += (x[t] @ A[s].T) @ B[s].T`` for every row ``t`` with slot ``s = slots[t] >= 0``
    (``A`` ``[S, R, in]``, ``B`` ``[S, out, R]``, scale folded into ``B``); in place on ``y``."""

    kernel_package = "metrale_core.layers"
    kernel_file = "lora.cu"

    def forward_native(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        rows: LoRARows,
        a: torch.Tensor,
        b: torch.Tensor,
        ranks: Sequence[int],
        packed: Sequence[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    ) -> torch.Tensor:
        """``packed[slot]`` (optional): contiguous ``(A [r, in], B.T [r, out])`` of the slot, which
        small CPU matmuls run much faster on than on strided views of the stacks."""
        for slot, idx in rows.groups:
            r = ranks[slot]
            if r == 0:
                continue
            pair = None if packed is None else packed[slot]
            a_s, bt = pair if pair is not None else (a[slot, :r], b[slot, :, :r].T)
            if isinstance(idx, slice):
                y[idx] += (x[idx] @ a_s.T) @ bt
            else:
                y.index_add_(0, idx, (x.index_select(0, idx) @ a_s.T) @ bt)
        return y

    def forward_cuda(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        rows: LoRARows,
        a: torch.Tensor,
        b: torch.Tensor,
        ranks: Sequence[int],
        packed: Any = None,
    ) -> torch.Tensor:  # pragma: no cover - GPU
        if x.dtype != torch.float32 or y.dtype != torch.float32 or not y.is_contiguous():
            return self.forward_native(y, x, rows, a, b, ranks)
        x = x.contiguous()
        t, k = x.shape
        r = a.shape[1]
        n = y.shape[1]
        tmp = torch.empty(t, r, dtype=torch.float32, device=x.device)
        with torch_stream(x.device):
            self.kernel("lora_shrink_f32")(
                ((t * r + _THREADS - 1) // _THREADS,),
                (_THREADS,),
                (ptr(x), ptr(a), ptr(rows.slots), ptr(tmp), i64(t), i32(k), i32(r)),
            )
            self.kernel("lora_expand_f32")(
                (((t * n) + _THREADS - 1) // _THREADS,),
                (_THREADS,),
                (ptr(tmp), ptr(b), ptr(rows.slots), ptr(y), i64(t), i32(n), i32(r)),
            )
        return y


class LoRALinear:
    """A base ``Linear`` plus per-slot adapter weights (see the module docstring)."""

    def __init__(
        self,
        base: Any,
        parts: Sequence[LoRAPart],
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.base = base
        self.parts = tuple(parts)
        self.in_features = self.parts[0].in_features
        self.out_features = int(base.out_features)
        width = max_rank * len(self.parts)
        #: Slot-stacked weights: ``A`` ``[S, R, in]``, scaled ``B`` ``[S, out, R]`` (zero-padded).
        self.a = torch.zeros(num_slots, width, self.in_features, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, self.out_features, width, dtype=dtype, device=device)
        #: Columns of ``A``/``B`` in use per slot (0: the slot holds nothing for this projection).
        self.ranks = [0] * num_slots
        #: Contiguous ``(A, B.T)`` per slot for the CPU path (None: empty slot).
        self.packed: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_slots
        #: The CPU's batched path: every slot's scaled ``B.T`` ``[S, width, out]``, contiguous.
        self.bt = (
            torch.zeros(num_slots, width, self.out_features, dtype=dtype, device=device)
            if torch.device(device).type == "cpu"
            else None
        )
        #: Per slot and part: ``(first column, rank)`` in ``A`` / ``B.T`` (rank 0: nothing).
        self.part_cols = torch.zeros(num_slots, len(self.parts), 2, dtype=torch.int32)
        #: Per part: ``(first output, outputs)``.
        self.part_out = torch.tensor([[p.offset, p.out_features] for p in self.parts], dtype=torch.int32)
        self.kernel: Any = lora_kernel() if self.bt is not None and dtype == torch.float32 else None
        self._scratch = torch.empty(0, dtype=torch.float32)
        self.op = LoRAApply(device)

    def __getattr__(self, name: str) -> Any:  # bias, weight, dense ... of the base
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"LoRALinear({[p.module for p in self.parts]}, base={type(self.base).__name__})"

    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        """Write adapter ``weights`` (module -> ``(A [r, in], B [out, r], scale)``) into ``slot``;
        parts the adapter does not target get nothing."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.part_cols[slot].zero_()
        col = 0
        for p, part in enumerate(self.parts):
            entry = weights.get(part.module)
            if entry is None:
                continue
            a, b, scale = entry
            r = int(a.shape[0])
            self.part_cols[slot, p, 0], self.part_cols[slot, p, 1] = col, r
            self.a[slot, col : col + r] = a.to(self.a.dtype)
            self.b[slot, part.offset : part.offset + part.out_features, col : col + r] = (b.float() * scale).to(
                self.b.dtype
            )
            col += r
        self.ranks[slot] = col
        self.packed[slot] = (
            None if col == 0 else (self.a[slot, :col].contiguous(), self.b[slot, :, :col].T.contiguous())
        )
        if self.bt is not None:
            self.bt[slot] = self.b[slot].T

    def clear_slot(self, slot: int) -> None:
        self.ranks[slot] = 0
        self.packed[slot] = None
        self.part_cols[slot].zero_()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = _ROWS.get()
        if rows is None or not any(self.ranks[s] for s, _ in rows.groups):
            return y
        if rows.slots.shape[0] != x.shape[0]:
            raise RuntimeError(f"LoRA row map has {rows.slots.shape[0]} rows but the projection got {x.shape[0]}")
        if self.kernel is not None and x.dtype == torch.float32 and y.dtype == torch.float32 and y.is_contiguous():
            return self._native(y, x, rows)
        if self.bt is not None and len(rows.groups) > 1 and x.dtype == self.a.dtype and y.dtype == self.a.dtype:
            batches = rows.slot_batches()
            if batches.fill <= BATCHED_MAX_FILL:
                return self._batched(y, x, batches)
        return self.op(y, x, rows, self.a, self.b, self.ranks, self.packed)  # y: the base call's fresh result

    def _native(self, y: torch.Tensor, x: torch.Tensor, rows: LoRARows) -> torch.Tensor:
        """Every slot in one call of the C kernel (``lora_apply.c``): it reads only the parts' own
        blocks of each adapter's weights, once per group of rows of a slot."""
        order, starts = rows.slot_rows()
        x = x.contiguous()
        num_slots, width, k = self.a.shape
        assert self.bt is not None
        threads = torch.get_num_threads()
        group_rows = self.kernel.mt_lora_rows()  # the kernel's ROWS: one group of shrunk rows per thread
        if self._scratch.numel() < threads * group_rows * width:
            self._scratch = torch.empty(threads * group_rows * width, dtype=torch.float32)
        rc = self.kernel.mt_lora_apply(
            x.data_ptr(),
            k,
            order.data_ptr(),
            starts.data_ptr(),
            min(num_slots, starts.numel() - 1),
            self.a.data_ptr(),
            self.bt.data_ptr(),
            width,
            self.out_features,
            self.part_cols.data_ptr(),
            len(self.parts),
            self.part_out.data_ptr(),
            y.data_ptr(),
            self._scratch.data_ptr(),
            threads,
        )
        if rc != 0:
            raise ValueError(f"mt_lora_apply cannot take x {list(x.shape)} with {self.out_features} outputs")
        return y

    def _batched(self, y: torch.Tensor, x: torch.Tensor, batches: SlotBatches) -> torch.Tensor:
        """Every slot at once: gather each slot's rows into a ``[span, depth, in]`` batch, shrink
        and expand with two batched products against the slots' own ``A`` / ``B.T`` (zero-padded
        ranks add zeros), add the results back to their rows.  Five ops per projection however many
        adapters the step mixes, where the grouped path costs four per adapter; each row multiplies
        only its own slot's columns."""
        lo, hi = batches.first, batches.first + batches.span
        xs = x.index_select(0, batches.rows)
        if batches.padding is not None:
            xs.index_fill_(0, batches.padding, 0.0)
        xs = xs.view(batches.span, batches.depth, -1)
        assert self.bt is not None
        delta = torch.bmm(torch.bmm(xs, self.a[lo:hi].transpose(1, 2)), self.bt[lo:hi])
        return y.index_add_(0, batches.rows, delta.view(-1, y.shape[1]))


def attach_lora(
    model: Any, num_slots: int, max_rank: int, dtype: torch.dtype, device: torch.device | str
) -> dict[str, tuple[LoRALinear, LoRAPart]]:
    """Wrap every projection ``model.lora_targets()`` declares in a :class:`LoRALinear`, in place
    at its path (``lora_targets.replace``); returns module -> (wrapper, part).  A model already
    wrapped returns its existing wrappers; one without ``lora_targets`` is a ``ConfigError``."""
    declared = getattr(model, "lora_targets", None)
    if declared is None:
        raise ConfigError(
            f"the model {type(model).__name__} declares no LoRA targets (it has no lora_targets(); "
            f"a model on the decoder definition declares them itself)"
        )
    found: dict[str, tuple[LoRALinear, LoRAPart]] = {}
    for target in declared():
        current = resolve(model, target.path)
        if isinstance(current, LoRALinear):
            wrapper = current
        else:
            if int(current.out_features) != sum(p.out_features for p in target.parts):
                raise ValueError(
                    f"{type(model).__name__}: the projection at {target.dotted!r} has {current.out_features} "
                    f"outputs, not the {sum(p.out_features for p in target.parts)} its LoRA parts declare"
                )
            wrapper = LoRALinear(current, target.parts, num_slots, max_rank, dtype, device)
            replace(model, target.path, wrapper)
        for part in target.parts:
            found[part.module] = (wrapper, part)
    return found
