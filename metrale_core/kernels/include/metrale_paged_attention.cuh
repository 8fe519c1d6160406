// The paged-attention decode kernel, templated on how one K/V element is loaded.
//
// Owner: metrale_core.layers (the plain-cache instantiation, layers/kernels/paged_attention_decode.cu);
// KV codecs instantiate it with their own loader (metrale_fp8: E4M3 codes times a per-head scale).
// One query token per sequence attends to the first context_lens[b] cached positions of its
// sequence, read through its block table (GQA: query head h reads KV head h / (Hq / Hk)).
// Softmax is online (flash-decoding within one block), accumulated in float32.
//
// q, out: [B, Hq, d] contiguous; k_cache, v_cache: [num_blocks, block_size, Hk, d] contiguous
// elements of Loader::elem; block_tables: [B, max_blocks] int64; context_lens: [B] int64.
// Launch: grid (Hq, B), block (PA_NUM_WARPS * 32) = 128 threads; head_dim <= PA_MAX_HEAD_DIM.
//
// A Loader is a small struct passed by value with
//   typedef ... elem;                                    the cache element type
//   __device__ Loader head(int kv_head) const;           the loader for one KV head (scales, ...)
//   __device__ float k(const elem* c, long long i) const; K element i as float
//   __device__ float v(const elem* c, long long i) const; V element i as float
// Invariants: the arithmetic is the same for every loader (only the loads differ), so a codec's
// kernel matches the plain kernel over the decoded cache.
#ifndef METRALE_PAGED_ATTENTION_CUH
#define METRALE_PAGED_ATTENTION_CUH

#include "metrale_bf16.cuh"
#include "metrale_reduce.cuh"

#define PA_NUM_WARPS 4
#define PA_MAX_HEAD_DIM 256
#define PA_PER_LANE (PA_MAX_HEAD_DIM / 32)

// A plain cache of T (float or bf16): elements load as they are.
template <typename T> struct PlainKVLoader {
    typedef T elem;
    __device__ __forceinline__ PlainKVLoader head(int) const { return *this; }
    __device__ __forceinline__ float k(const T* c, long long i) const { return to_float(c[i]); }
    __device__ __forceinline__ float v(const T* c, long long i) const { return to_float(c[i]); }
};

template <typename T, typename Loader>
__device__ void paged_attention_decode_impl(
    T* __restrict__ out, const T* __restrict__ q, const typename Loader::elem* __restrict__ k_cache,
    const typename Loader::elem* __restrict__ v_cache, Loader loader,
    const long long* __restrict__ block_tables, const long long* __restrict__ context_lens,
    float scale, int num_heads, int num_kv_heads, int head_dim, int block_size, int max_blocks) {
    __shared__ float q_s[PA_MAX_HEAD_DIM];
    __shared__ float m_s[PA_NUM_WARPS];
    __shared__ float l_s[PA_NUM_WARPS];
    __shared__ float acc_s[PA_NUM_WARPS][PA_MAX_HEAD_DIM];

    const int head = blockIdx.x;
    const long long b = blockIdx.y;
    const int kv_head = head / (num_heads / num_kv_heads);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long ctx = context_lens[b];
    const T* qh = q + (b * num_heads + head) * head_dim;
    T* oh = out + (b * num_heads + head) * head_dim;
    const Loader load = loader.head(kv_head);

    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) q_s[i] = to_float(qh[i]);
    __syncthreads();

    float m = neg_inf();
    float l = 0.0f;
    float acc[PA_PER_LANE];
#pragma unroll
    for (int t = 0; t < PA_PER_LANE; ++t) acc[t] = 0.0f;

    const long long* table = block_tables + b * max_blocks;
    const long long row_elems = (long long)num_kv_heads * head_dim;
    for (long long j = warp; j < ctx; j += PA_NUM_WARPS) {
        const long long block = table[j / block_size];
        const long long base = (block * block_size + j % block_size) * row_elems
                               + (long long)kv_head * head_dim;
        float dot = 0.0f;
        for (int i = lane; i < head_dim; i += 32) dot += q_s[i] * load.k(k_cache, base + i);
        const float s = warp_sum(dot) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int t = 0; t < PA_PER_LANE; ++t) {
            const int i = lane + 32 * t;
            if (i < head_dim) acc[t] = acc[t] * corr + p * load.v(v_cache, base + i);
        }
        m = m_new;
    }

    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < PA_PER_LANE; ++t) {
        const int i = lane + 32 * t;
        if (i < head_dim) acc_s[warp][i] = acc[t];
    }
    __syncthreads();

    float m_max = neg_inf();
    for (int w = 0; w < PA_NUM_WARPS; ++w) m_max = fmaxf(m_max, m_s[w]);
    float denom = 0.0f;
    for (int w = 0; w < PA_NUM_WARPS; ++w) {
        if (l_s[w] > 0.0f) denom += l_s[w] * expf(m_s[w] - m_max);
    }
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < PA_NUM_WARPS; ++w) {
            if (l_s[w] > 0.0f) o += acc_s[w][i] * expf(m_s[w] - m_max);
        }
        oh[i] = from_float<T>(denom > 0.0f ? o / denom : 0.0f);
    }
}

#endif  // METRALE_PAGED_ATTENTION_CUH
