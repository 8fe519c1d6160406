// KDA recurrent decode step: one new token per sequence, state updated in place in the pool.
//
// Per (sequence b, head h), with the float32 state S = pool[slots[b], h] of shape [K, V]:
//   q, k <- l2norm(q), l2norm(k) (x / sqrt(sum x^2 + 1e-6)); q <- q * K^-0.5
//   S <- S * exp(g)[:, None]; mem = S^T k; u = beta * (v - mem); S <- S + k u^T; o = S^T q
// (specs §2.1; the oracle is metrale_glm_kda.kda.kda_recurrent).
//
// Launch: grid (H, B), block = V rounded up to a multiple of 32 (<= 1024), K <= 256.
// q, k: [B, H, K] (T), v: [B, H, V] (T), g: [B, H, K] f32, beta: [B, H] f32,
// pool: [S, H, K, V] f32, slots: [B] int64, out: [B, H, V] f32.  All contiguous.
#include "glm_common.cuh"

template <typename T>
__device__ void kda_decode_impl(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                const float* __restrict__ g, const float* __restrict__ beta,
                                float* __restrict__ pool, const long long* __restrict__ slots,
                                float* __restrict__ out, int heads, int dk, int dv) {
    __shared__ float qs[256];
    __shared__ float ks[256];
    __shared__ float decay[256];
    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const long long row = (long long)b * heads + h;
    float q2 = 0.0f, k2 = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float qv = to_float(q[row * dk + i]);
        const float kv = to_float(k[row * dk + i]);
        qs[i] = qv;
        ks[i] = kv;
        decay[i] = expf(g[row * dk + i]);
        q2 += qv * qv;
        k2 += kv * kv;
    }
    const float q_inv = rsqrtf(block_sum(q2, 0) + 1e-6f) * rsqrtf((float)dk);
    const float k_inv = rsqrtf(block_sum(k2, 1) + 1e-6f);
    const int j = threadIdx.x;
    if (j >= dv) return;
    float* s = pool + ((slots[b] * heads + h) * (long long)dk) * dv + j;
    float mem = 0.0f;
    for (int i = 0; i < dk; ++i) {
        const float decayed = s[(long long)i * dv] * decay[i];
        s[(long long)i * dv] = decayed;
        mem += decayed * ks[i] * k_inv;
    }
    const float u = beta[row] * (to_float(v[row * dv + j]) - mem);
    float o = 0.0f;
    for (int i = 0; i < dk; ++i) {
        const float updated = s[(long long)i * dv] + ks[i] * k_inv * u;
        s[(long long)i * dv] = updated;
        o += updated * qs[i] * q_inv;
    }
    out[row * dv + j] = o;
}

extern "C" __global__ void kda_decode_f32(const float* q, const float* k, const float* v, const float* g,
                                          const float* beta, float* pool, const long long* slots, float* out,
                                          int heads, int dk, int dv) {
    kda_decode_impl<float>(q, k, v, g, beta, pool, slots, out, heads, dk, dv);
}

extern "C" __global__ void kda_decode_bf16(const bf16* q, const bf16* k, const bf16* v, const float* g,
                                           const float* beta, float* pool, const long long* slots, float* out,
                                           int heads, int dk, int dv) {
    kda_decode_impl<bf16>(q, k, v, g, beta, pool, slots, out, heads, dk, dv);
}
