// Float helpers for reductions (-inf, warp-wide sum), shared by every plugin's kernels.
//
// Owner: metrale_core/kernels/include (the core's shared device headers).  A plugin header or
// kernel includes it by its quoted name, "metrale_reduce.cuh": metrale_core.kernels.cuda's
// expand_includes (what NVRTC compiles at run time) and metrale_core.kernels.ptx's compile_ptx
// (nvcc -I) both resolve it here when no file of that name sits beside the including one.  No
// system headers, so NVRTC compiles it as is.
//
// Invariants: neg_inf() is exactly float -inf (bits 0xff800000); warp_sum(v) accumulates in
// float32 over all 32 lanes of a full warp (mask 0xffffffff, so every lane must call it) and
// every lane gets the same total.  Helpers that differ between plugins (block_sum, ...) stay in
// the plugin headers.  Include-guarded: a translation unit may reach it through several headers
// and gets it once.
#ifndef METRALE_REDUCE_CUH
#define METRALE_REDUCE_CUH

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

#endif  // METRALE_REDUCE_CUH
