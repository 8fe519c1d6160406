// Shared device helpers for the metrale_glm_kda kernels (no system headers, so NVRTC compiles it).
//
// Owner: metrale_glm_kda/kernels.  Invariants: bf16 and its round-to-nearest-even conversions
// come from the core's metrale_bf16.cuh, and neg_inf / warp_sum from the core's
// metrale_reduce.cuh (both in metrale_core/kernels/include), never a copy here; every reduction
// accumulates in float32; block reductions need blockDim.x to be a multiple of 32 and at most
// 1024.
#ifndef METRALE_GLM_COMMON_CUH
#define METRALE_GLM_COMMON_CUH

#include "metrale_bf16.cuh"
#include "metrale_reduce.cuh"

// Sum of v over the block; every thread gets the total.  `slot` picks one of two scratch areas
// so two sums may run back to back without an extra barrier.
__device__ __forceinline__ float block_sum(float v, int slot) {
    __shared__ float partial[2][32];
    __shared__ float total[2];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[slot][warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int num_warps = blockDim.x >> 5;
        float w = lane < num_warps ? partial[slot][lane] : 0.0f;
        w = warp_sum(w);
        if (lane == 0) total[slot] = w;
    }
    __syncthreads();
    return total[slot];
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

#endif  // METRALE_GLM_COMMON_CUH
