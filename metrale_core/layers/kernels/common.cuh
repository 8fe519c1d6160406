// Shared device helpers for the metrale_core.layers kernels (no system headers, so NVRTC compiles it).
//
// Owner: metrale_core/layers/kernels.  Invariants: bf16 and its round-to-nearest-even conversions come
// from the core's metrale_bf16.cuh, and neg_inf / warp_sum from the core's metrale_reduce.cuh
// (both in metrale_core/kernels/include), never a copy here; every reduction accumulates in
// float32; block_sum needs blockDim.x to be a multiple of 32 and at most 1024.
#ifndef METRALE_QWEN3_COMMON_CUH
#define METRALE_QWEN3_COMMON_CUH

#include "metrale_bf16.cuh"
#include "metrale_reduce.cuh"

// Round through T: the value an op computing in T would hold.
template <typename T> __device__ __forceinline__ float round_to(float x) {
    return to_float(from_float<T>(x));
}

// Sum of v over the block; every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int num_warps = blockDim.x >> 5;
        float w = lane < num_warps ? partial[lane] : 0.0f;
        w = warp_sum(w);
        if (lane == 0) total = w;
    }
    __syncthreads();
    return total;
}

#endif  // METRALE_QWEN3_COMMON_CUH
