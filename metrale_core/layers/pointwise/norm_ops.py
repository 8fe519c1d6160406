"""The per-token decoder ops as ``CustomOp``s: RMSNorm, the fused per-head QK-norm + RoPE and the
SwiGLU gate; a torch oracle, a CuPy kernel and a C CPU kernel each.

Owner: ``metrale_core.layers``; :class:`~metrale_core.layers.decoder_ops.DecoderOps` builds them
once per model.

Invariants:
- ``forward_native`` delegates to :mod:`~metrale_core.layers.pointwise.functional` (the oracles);
  ``forward_cuda`` checks its inputs and launches the matching ``kernels/*.cu`` entry point
  (``<name>_f32`` or ``<name>_bf16``); dtypes without a kernel (float16) route to ``forward_native``.
- ``forward_cpu`` calls the ``dop_*`` entry point of ``kernels/cpu/decoder_ops.c`` for float32
  activations with dense rows and routes everything else to ``forward_native``.
- ``QKNormRope`` may work in place: callers use the returned tensors.
- All kernels run on torch's current CUDA stream.
"""

from __future__ import annotations

import torch

from metrale_core.kernels import CustomOp, check_dtype, check_tensor
from metrale_core.kernels.cuda import f32, i32, i64, ptr, torch_stream
from metrale_core.layers.op_support import (
    KERNEL_PACKAGE,
    SUFFIX,
    THREADS,
    adjacent_heads,
    all_f32,
    check_heads,
    cpu_call,
    dense_heads,
    round_up_32,
)
from metrale_core.layers.pointwise import functional as layers

__all__ = ["QKNormRope", "RMSNorm", "SwiGLU"]


class RMSNorm(CustomOp):
    """``rms_norm(x, weight, eps)`` over the last dimension."""

    kernel_package = KERNEL_PACKAGE
    kernel_file = "rmsnorm.cu"
    cpu_kernels = True

    def forward_cpu(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dim = x.shape[-1]
        if not all_f32(x, weight) or dim == 0 or weight.shape != (dim,) or not weight.is_contiguous():
            return self.forward_native(x, weight, eps)
        rows = x if x.dim() == 2 else x.reshape(-1, dim)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty(rows.shape[0], dim, dtype=torch.float32)
        cpu_call(
            self,
            "dop_rms_norm",
            rows.data_ptr(),
            rows.stride(0),
            weight.data_ptr(),
            out.data_ptr(),
            rows.shape[0],
            dim,
            eps,
            torch.get_num_threads(),
        )
        return out if x.dim() == 2 else out.view(x.shape)

    def forward_native(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return layers.rms_norm(x, weight, eps)

    def forward_cuda(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype not in SUFFIX or x.shape[-1] == 0:
            return self.forward_native(x, weight, eps)
        dim = x.shape[-1]
        x = x.contiguous()
        check_tensor(self.name, "weight", weight, dtypes=(x.dtype,), shape=(dim,))
        out = torch.empty_like(x)
        rows = x.numel() // dim
        if rows:
            with torch_stream(x.device):
                self.kernel(f"rmsnorm_{SUFFIX[x.dtype]}")(
                    (rows,), (THREADS,), (ptr(x), ptr(weight), ptr(out), i32(rows), i32(dim), f32(eps))
                )
        return out


class QKNormRope(CustomOp):
    """Per-head RMSNorm of q and k (skipped when the weights are None) followed by RoPE.

    ``q`` ``[T, Hq, d]``, ``k`` ``[T, Hk, d]``, ``cos``/``sin`` ``[T, d]`` in the activation dtype.
    Returns ``(q, k)``; the CUDA path rotates the inputs in place.
    """

    kernel_package = KERNEL_PACKAGE
    kernel_file = "qk_norm_rope.cu"
    cpu_kernels = True
    #: ``(sin, signed_sin(sin))`` of the last call (the native path's per-forward memo).
    _signed: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward_native(self, q, k, q_weight, k_weight, cos, sin, eps: float):
        if q_weight is not None:
            q = layers.rms_norm(q, q_weight, eps)
            k = layers.rms_norm(k, k_weight, eps)
        qk = adjacent_heads(q, k)
        if qk is None:
            qk = torch.cat((q, k), dim=1)
        # every layer of a forward passes the same sin table: sign it once
        if self._signed is None or self._signed[0] is not sin:
            self._signed = (sin, layers.signed_sin(sin))
        qk = layers.apply_rope(qk, cos, sin, self._signed[1])  # one rotation for all heads
        return qk[:, : q.shape[1]], qk[:, q.shape[1] :]

    def forward_cpu(self, q, k, q_weight, k_weight, cos, sin, eps: float):
        (num_tokens, hq, d), hk = q.shape, k.shape[1]
        if (
            not all_f32(q, k, q_weight, k_weight, cos, sin)
            or d % 2
            or not dense_heads(q, k)
            or cos.shape != (num_tokens, d)
            or not (cos.is_contiguous() and sin.is_contiguous())
            or (q_weight is None) != (k_weight is None)
        ):
            return self.forward_native(q, k, q_weight, k_weight, cos, sin, eps)
        qw = None if q_weight is None else q_weight.contiguous().data_ptr()
        kw = None if k_weight is None else k_weight.contiguous().data_ptr()
        cpu_call(
            self,
            "dop_qk_norm_rope",
            q.data_ptr(),
            q.stride(0),
            hq,
            k.data_ptr(),
            k.stride(0),
            hk,
            num_tokens,
            d,
            qw,
            kw,
            cos.data_ptr(),
            sin.data_ptr(),
            eps,
            torch.get_num_threads(),
        )
        return q, k

    def forward_cuda(self, q, k, q_weight, k_weight, cos, sin, eps: float):
        num_tokens, hq, d = q.shape
        hk = k.shape[1]
        if q.dtype not in SUFFIX or d % 2 or d > 2048 or num_tokens == 0:
            return self.forward_native(q, k, q_weight, k_weight, cos, sin, eps)
        check_heads(self.name, "q", q, hq, d)
        check_heads(self.name, "k", k, hk, d)
        check_dtype(self.name, "k", k, (q.dtype,))
        check_tensor(self.name, "cos", cos, dtypes=(q.dtype,), shape=(num_tokens, d))
        check_tensor(self.name, "sin", sin, dtypes=(q.dtype,), shape=(num_tokens, d))
        use_norm = q_weight is not None
        if use_norm:
            check_tensor(self.name, "q_weight", q_weight, dtypes=(q.dtype,), shape=(d,))
            check_tensor(self.name, "k_weight", k_weight, dtypes=(q.dtype,), shape=(d,))
        qw = q_weight if use_norm else cos  # any valid pointer; not read without the norm
        kw = k_weight if use_norm else cos
        with torch_stream(q.device):
            self.kernel(f"qk_norm_rope_{SUFFIX[q.dtype]}")(
                (num_tokens, hq + hk),
                (round_up_32(d // 2),),
                (
                    ptr(q),
                    ptr(k),
                    ptr(qw),
                    ptr(kw),
                    ptr(cos),
                    ptr(sin),
                    i32(num_tokens),
                    i32(hq),
                    i32(hk),
                    i32(d),
                    i64(q.stride(0)),
                    i64(k.stride(0)),
                    f32(eps),
                    i32(int(use_norm)),
                ),
            )
        return q, k


class SwiGLU(CustomOp):
    """``silu(gate) * up`` on the fused ``[T, 2I]`` gate/up projection; returns ``[T, I]``."""

    kernel_package = KERNEL_PACKAGE
    kernel_file = "swiglu.cu"
    cpu_kernels = True

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        return layers.swiglu(gate_up)

    def forward_cpu(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not all_f32(gate_up) or gate_up.dim() != 2 or gate_up.shape[-1] % 2 or gate_up.shape[-1] == 0:
            return self.forward_native(gate_up)
        gate_up = gate_up.contiguous()
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, inter, dtype=torch.float32)
        cpu_call(self, "dop_swiglu", gate_up.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads())
        return out

    def forward_cuda(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dtype not in SUFFIX or gate_up.shape[-1] % 2:
            return self.forward_native(gate_up)
        gate_up = gate_up.contiguous()
        inter = gate_up.shape[-1] // 2
        rows = gate_up.numel() // max(1, 2 * inter)
        out = torch.empty((*gate_up.shape[:-1], inter), dtype=gate_up.dtype, device=gate_up.device)
        total = rows * inter
        if total:
            blocks = min((total + THREADS - 1) // THREADS, 65535)
            with torch_stream(gate_up.device):
                self.kernel(f"swiglu_{SUFFIX[gate_up.dtype]}")(
                    (blocks,), (THREADS,), (ptr(gate_up), ptr(out), i64(rows), i32(inter))
                )
        return out
