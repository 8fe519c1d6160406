// Fused per-head QK RMSNorm (optional) + rotate_half RoPE, in place on q [T, Hq, d] and
// k [T, Hk, d] whose heads are contiguous ([H, d] dense) and whose tokens are q_stride /
// k_stride elements apart (they may be column slices of a fused qkv projection).
//
// cos, sin: [T, d] in the activation dtype, halves identical (only the first half is read).
// Launch: grid (T, Hq + Hk), block (round_up(d / 2, 32)); thread i owns the pair (i, i + d/2).
// use_norm = 0 skips the norm (Llama / Qwen2); q_w / k_w are then not read.
#include "common.cuh"

template <typename T>
__device__ void qk_norm_rope_impl(T* q, T* k, const T* __restrict__ q_w, const T* __restrict__ k_w,
                                  const T* __restrict__ cos, const T* __restrict__ sin,
                                  int num_tokens, int num_q_heads, int num_k_heads, int head_dim,
                                  long long q_stride, long long k_stride, float eps, int use_norm) {
    const long long t = blockIdx.x;
    const int head = blockIdx.y;
    if (t >= num_tokens || head >= num_q_heads + num_k_heads) return;
    const bool is_q = head < num_q_heads;
    T* x = is_q ? q + t * q_stride + (long long)head * head_dim
                : k + t * k_stride + (long long)(head - num_q_heads) * head_dim;
    const T* w = is_q ? q_w : k_w;
    const int half = head_dim / 2;
    const int i = threadIdx.x;
    const bool active = i < half;

    float x1 = active ? to_float(x[i]) : 0.0f;
    float x2 = active ? to_float(x[i + half]) : 0.0f;
    if (use_norm) {
        const float total = block_sum(x1 * x1 + x2 * x2);  // every thread takes part
        const float r = rsqrtf(total / (float)head_dim + eps);
        if (active) {
            x1 = round_to<T>(to_float(w[i]) * round_to<T>(x1 * r));
            x2 = round_to<T>(to_float(w[i + half]) * round_to<T>(x2 * r));
        }
    }
    if (!active) return;
    const float c = to_float(cos[t * head_dim + i]);
    const float s = to_float(sin[t * head_dim + i]);
    x[i] = from_float<T>(x1 * c - x2 * s);
    x[i + half] = from_float<T>(x2 * c + x1 * s);
}

extern "C" __global__ void qk_norm_rope_f32(float* q, float* k, const float* q_w, const float* k_w,
                                            const float* cos, const float* sin, int num_tokens,
                                            int num_q_heads, int num_k_heads, int head_dim,
                                            long long q_stride, long long k_stride, float eps,
                                            int use_norm) {
    qk_norm_rope_impl<float>(q, k, q_w, k_w, cos, sin, num_tokens, num_q_heads, num_k_heads,
                             head_dim, q_stride, k_stride, eps, use_norm);
}

extern "C" __global__ void qk_norm_rope_bf16(bf16* q, bf16* k, const bf16* q_w, const bf16* k_w,
                                             const bf16* cos, const bf16* sin, int num_tokens,
                                             int num_q_heads, int num_k_heads, int head_dim,
                                             long long q_stride, long long k_stride, float eps,
                                             int use_norm) {
    qk_norm_rope_impl<bf16>(q, k, q_w, k_w, cos, sin, num_tokens, num_q_heads, num_k_heads,
                            head_dim, q_stride, k_stride, eps, use_norm);
}
