// Quantize-on-write: store each row's K and V as E4M3 codes of x / scale[head] at its flat slot.
//
// k: [T, Hk, dk], v: [T, Hk, dv] with dense heads and tokens k_stride / v_stride elements apart.
// k_cache: [num_blocks, block_size, Hk, dk] uint8 (E4M3 codes), v_cache likewise with dv.
// k_scale, v_scale: [Hk] float32 dequant scales.  slot_mapping: [T] int64; negative = skip.
// Launch: grid (T), block (any multiple of 32).
#include "fp8_common.cuh"

template <typename T>
__device__ void fp8_kv_write_impl(const T* __restrict__ k, const T* __restrict__ v,
                                  unsigned char* __restrict__ k_cache,
                                  unsigned char* __restrict__ v_cache,
                                  const long long* __restrict__ slot_mapping,
                                  const float* __restrict__ k_scale,
                                  const float* __restrict__ v_scale, int num_tokens,
                                  int num_kv_heads, int k_dim, int v_dim, long long k_stride,
                                  long long v_stride) {
    const long long t = blockIdx.x;
    if (t >= num_tokens) return;
    const long long slot = slot_mapping[t];
    if (slot < 0) return;
    const int k_row = num_kv_heads * k_dim;
    const int v_row = num_kv_heads * v_dim;
    const T* kr = k + t * k_stride;
    const T* vr = v + t * v_stride;
    unsigned char* kc = k_cache + slot * k_row;
    unsigned char* vc = v_cache + slot * v_row;
    for (int i = threadIdx.x; i < k_row; i += blockDim.x)
        kc[i] = e4m3_from_float(to_float(kr[i]) / k_scale[i / k_dim]);
    for (int i = threadIdx.x; i < v_row; i += blockDim.x)
        vc[i] = e4m3_from_float(to_float(vr[i]) / v_scale[i / v_dim]);
}

extern "C" __global__ void fp8_kv_write_f32(const float* k, const float* v, unsigned char* k_cache,
                                            unsigned char* v_cache, const long long* slot_mapping,
                                            const float* k_scale, const float* v_scale,
                                            int num_tokens, int num_kv_heads, int k_dim, int v_dim,
                                            long long k_stride, long long v_stride) {
    fp8_kv_write_impl<float>(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, num_tokens,
                             num_kv_heads, k_dim, v_dim, k_stride, v_stride);
}

extern "C" __global__ void fp8_kv_write_bf16(const bf16* k, const bf16* v, unsigned char* k_cache,
                                             unsigned char* v_cache, const long long* slot_mapping,
                                             const float* k_scale, const float* v_scale,
                                             int num_tokens, int num_kv_heads, int k_dim, int v_dim,
                                             long long k_stride, long long v_stride) {
    fp8_kv_write_impl<bf16>(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, num_tokens,
                            num_kv_heads, k_dim, v_dim, k_stride, v_stride);
}
