// Write each row's K and V into the paged cache at its flat slot (block * block_size + offset).
//
// k, v: [T, Hk, d] with dense [Hk, d] heads and tokens k_stride / v_stride elements apart.
// k_cache, v_cache: [num_blocks, block_size, Hk, d] contiguous, i.e. [num_slots, Hk * d].
// slot_mapping: [T] int64; a negative slot (padding) is skipped.
// Launch: grid (T), block (any multiple of 32); row_elems = Hk * d.
#include "common.cuh"

template <typename T>
__device__ void kv_cache_write_impl(const T* __restrict__ k, const T* __restrict__ v,
                                    T* __restrict__ k_cache, T* __restrict__ v_cache,
                                    const long long* __restrict__ slot_mapping, int num_tokens,
                                    int row_elems, long long k_stride, long long v_stride) {
    const long long t = blockIdx.x;
    if (t >= num_tokens) return;
    const long long slot = slot_mapping[t];
    if (slot < 0) return;
    const T* kr = k + t * k_stride;
    const T* vr = v + t * v_stride;
    T* kc = k_cache + slot * row_elems;
    T* vc = v_cache + slot * row_elems;
    for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {
        kc[i] = kr[i];
        vc[i] = vr[i];
    }
}

extern "C" __global__ void kv_cache_write_f32(const float* k, const float* v, float* k_cache,
                                              float* v_cache, const long long* slot_mapping,
                                              int num_tokens, int row_elems, long long k_stride,
                                              long long v_stride) {
    kv_cache_write_impl<float>(k, v, k_cache, v_cache, slot_mapping, num_tokens, row_elems,
                               k_stride, v_stride);
}

extern "C" __global__ void kv_cache_write_bf16(const bf16* k, const bf16* v, bf16* k_cache,
                                               bf16* v_cache, const long long* slot_mapping,
                                               int num_tokens, int row_elems, long long k_stride,
                                               long long v_stride) {
    kv_cache_write_impl<bf16>(k, v, k_cache, v_cache, slot_mapping, num_tokens, row_elems,
                              k_stride, v_stride);
}
