// Paged attention for decode rows: one query token per sequence attends to the first
// context_lens[b] cached positions of its sequence, read through its block table (GQA: query
// head h reads KV head h / (Hq / Hk)).  Softmax is online (flash-decoding within one block),
// accumulated in float32.
//
// q, out: [B, Hq, d] contiguous; k_cache, v_cache: [num_blocks, block_size, Hk, d] contiguous;
// block_tables: [B, max_blocks] int64; context_lens: [B] int64.
// Launch: grid (Hq, B), block (NUM_WARPS * 32) = 128 threads; head_dim <= MAX_HEAD_DIM.
#include "common.cuh"

#define NUM_WARPS 4
#define MAX_HEAD_DIM 256
#define PER_LANE (MAX_HEAD_DIM / 32)

template <typename T>
__device__ void paged_attention_decode_impl(T* __restrict__ out, const T* __restrict__ q,
                                            const T* __restrict__ k_cache,
                                            const T* __restrict__ v_cache,
                                            const long long* __restrict__ block_tables,
                                            const long long* __restrict__ context_lens, float scale,
                                            int num_heads, int num_kv_heads, int head_dim,
                                            int block_size, int max_blocks) {
    __shared__ float q_s[MAX_HEAD_DIM];
    __shared__ float m_s[NUM_WARPS];
    __shared__ float l_s[NUM_WARPS];
    __shared__ float acc_s[NUM_WARPS][MAX_HEAD_DIM];

    const int head = blockIdx.x;
    const long long b = blockIdx.y;
    const int kv_head = head / (num_heads / num_kv_heads);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long ctx = context_lens[b];
    const T* qh = q + (b * num_heads + head) * head_dim;
    T* oh = out + (b * num_heads + head) * head_dim;

    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) q_s[i] = to_float(qh[i]);
    __syncthreads();

    float m = neg_inf();
    float l = 0.0f;
    float acc[PER_LANE];
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) acc[t] = 0.0f;

    const long long* table = block_tables + b * max_blocks;
    const long long row_elems = (long long)num_kv_heads * head_dim;
    for (long long j = warp; j < ctx; j += NUM_WARPS) {
        const long long block = table[j / block_size];
        const long long base = (block * block_size + j % block_size) * row_elems
                               + (long long)kv_head * head_dim;
        float dot = 0.0f;
        for (int i = lane; i < head_dim; i += 32) dot += q_s[i] * to_float(k_cache[base + i]);
        const float s = warp_sum(dot) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int t = 0; t < PER_LANE; ++t) {
            const int i = lane + 32 * t;
            if (i < head_dim) acc[t] = acc[t] * corr + p * to_float(v_cache[base + i]);
        }
        m = m_new;
    }

    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const int i = lane + 32 * t;
        if (i < head_dim) acc_s[warp][i] = acc[t];
    }
    __syncthreads();

    float m_max = neg_inf();
    for (int w = 0; w < NUM_WARPS; ++w) m_max = fmaxf(m_max, m_s[w]);
    float denom = 0.0f;
    for (int w = 0; w < NUM_WARPS; ++w) {
        if (l_s[w] > 0.0f) denom += l_s[w] * expf(m_s[w] - m_max);
    }
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < NUM_WARPS; ++w) {
            if (l_s[w] > 0.0f) o += acc_s[w][i] * expf(m_s[w] - m_max);
        }
        oh[i] = from_float<T>(denom > 0.0f ? o / denom : 0.0f);
    }
}

extern "C" __global__ void paged_attention_decode_f32(
    float* out, const float* q, const float* k_cache, const float* v_cache,
    const long long* block_tables, const long long* context_lens, float scale, int num_heads,
    int num_kv_heads, int head_dim, int block_size, int max_blocks) {
    paged_attention_decode_impl<float>(out, q, k_cache, v_cache, block_tables, context_lens, scale,
                                       num_heads, num_kv_heads, head_dim, block_size, max_blocks);
}

extern "C" __global__ void paged_attention_decode_bf16(
    bf16* out, const bf16* q, const bf16* k_cache, const bf16* v_cache,
    const long long* block_tables, const long long* context_lens, float scale, int num_heads,
    int num_kv_heads, int head_dim, int block_size, int max_blocks) {
    paged_attention_decode_impl<bf16>(out, q, k_cache, v_cache, block_tables, context_lens, scale,
                                      num_heads, num_kv_heads, head_dim, block_size, max_blocks);
}
