// Paged attention for decode rows over a plain (float32 / bf16) cache: the shared template of
// metrale_paged_attention.cuh instantiated with PlainKVLoader (see that header for the maths,
// layouts and launch shape).
#include "metrale_paged_attention.cuh"

extern "C" __global__ void paged_attention_decode_f32(
    float* out, const float* q, const float* k_cache, const float* v_cache,
    const long long* block_tables, const long long* context_lens, float scale, int num_heads,
    int num_kv_heads, int head_dim, int block_size, int max_blocks) {
    paged_attention_decode_impl<float>(out, q, k_cache, v_cache, PlainKVLoader<float>(), block_tables,
                                       context_lens, scale, num_heads, num_kv_heads, head_dim,
                                       block_size, max_blocks);
}

extern "C" __global__ void paged_attention_decode_bf16(
    bf16* out, const bf16* q, const bf16* k_cache, const bf16* v_cache,
    const long long* block_tables, const long long* context_lens, float scale, int num_heads,
    int num_kv_heads, int head_dim, int block_size, int max_blocks) {
    paged_attention_decode_impl<bf16>(out, q, k_cache, v_cache, PlainKVLoader<bf16>(), block_tables,
                                      context_lens, scale, num_heads, num_kv_heads, head_dim,
                                      block_size, max_blocks);
}
