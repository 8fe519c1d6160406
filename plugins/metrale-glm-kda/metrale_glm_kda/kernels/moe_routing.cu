// MoE routing (DeepSeek-V3 noaux_tc with one expert group), one block per row:
//   s = sigmoid(logits); choose top_k by s + bias (ties: lower expert id);
//   w = s[chosen]; if norm: w /= sum(w) + 1e-20; w *= scaling
// (oracle: metrale_glm_kda.moe.route).
//
// Launch: grid (rows), block = E rounded up to a multiple of 32 (<= 1024); E <= 1024, top_k <= 32.
// logits: [rows, E] f32, bias: [E] f32, weights: [rows, top_k] f32, index: [rows, top_k] int64.
#include "glm_common.cuh"

extern "C" __global__ void moe_routing_f32(const float* __restrict__ logits, const float* __restrict__ bias,
                                           float* __restrict__ weights, long long* __restrict__ index,
                                           int experts, int top_k, int norm, float scaling) {
    __shared__ float choice[1024];
    __shared__ float score[1024];
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ float picked[32];
    const long long row = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        const float s = 1.0f / (1.0f + expf(-logits[row * experts + e]));
        score[e] = s;
        choice[e] = s + bias[e];
    }
    __syncthreads();
    for (int r = 0; r < top_k; ++r) {
        float v = neg_inf();
        int idx = experts;
        for (int e = threadIdx.x; e < experts; e += blockDim.x) {
            if (choice[e] > v) { v = choice[e]; idx = e; }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, offset);
            if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
        }
        if (lane == 0) { best_v[warp] = v; best_i[warp] = idx; }
        __syncthreads();
        if (threadIdx.x == 0) {
            float bv = best_v[0];
            int bi = best_i[0];
            for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
                if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) { bv = best_v[w]; bi = best_i[w]; }
            }
            index[row * top_k + r] = bi;
            picked[r] = score[bi];
            choice[bi] = neg_inf();
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int r = 0; r < top_k; ++r) total += picked[r];
        const float denom = norm ? total + 1e-20f : 1.0f;
        for (int r = 0; r < top_k; ++r) weights[row * top_k + r] = picked[r] / denom * scaling;
    }
}
