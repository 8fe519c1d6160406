// Dequantizing paged attention for decode rows: the core's shared decode kernel
// (metrale_paged_attention.cuh) instantiated with an E4M3 loader -- K/V codes dequantized as
// code * scale[kv_head] on load.  Only the loader lives here; the maths is the plain kernel's.
//
// q, out: [B, Hq, d] contiguous; k_cache, v_cache: [num_blocks, block_size, Hk, d] uint8;
// k_scale, v_scale: [Hk] float32; block_tables: [B, max_blocks] int64; context_lens: [B] int64.
// Launch: grid (Hq, B), block 128 threads; head_dim <= 256.
#include "fp8_common.cuh"
#include "metrale_paged_attention.cuh"

struct Fp8KVLoader {
    typedef unsigned char elem;
    const float* k_scale;
    const float* v_scale;
    float ks;
    float vs;
    __device__ __forceinline__ Fp8KVLoader head(int kv_head) const {
        Fp8KVLoader r = *this;
        r.ks = k_scale[kv_head];
        r.vs = v_scale[kv_head];
        return r;
    }
    __device__ __forceinline__ float k(const unsigned char* c, long long i) const {
        return e4m3_to_float(c[i]) * ks;
    }
    __device__ __forceinline__ float v(const unsigned char* c, long long i) const {
        return e4m3_to_float(c[i]) * vs;
    }
};

extern "C" __global__ void fp8_paged_attention_decode_f32(
    float* out, const float* q, const unsigned char* k_cache, const unsigned char* v_cache,
    const float* k_scale, const float* v_scale, const long long* block_tables,
    const long long* context_lens, float scale, int num_heads, int num_kv_heads, int head_dim,
    int block_size, int max_blocks) {
    const Fp8KVLoader loader = {k_scale, v_scale, 1.0f, 1.0f};
    paged_attention_decode_impl<float>(out, q, k_cache, v_cache, loader, block_tables, context_lens,
                                       scale, num_heads, num_kv_heads, head_dim, block_size,
                                       max_blocks);
}

extern "C" __global__ void fp8_paged_attention_decode_bf16(
    bf16* out, const bf16* q, const unsigned char* k_cache, const unsigned char* v_cache,
    const float* k_scale, const float* v_scale, const long long* block_tables,
    const long long* context_lens, float scale, int num_heads, int num_kv_heads, int head_dim,
    int block_size, int max_blocks) {
    const Fp8KVLoader loader = {k_scale, v_scale, 1.0f, 1.0f};
    paged_attention_decode_impl<bf16>(out, q, k_cache, v_cache, loader, block_tables, context_lens,
                                      scale, num_heads, num_kv_heads, head_dim, block_size,
                                      max_blocks);
}
