// Sinkhorn normalisation of the mHC stream-mixing matrices, in place (one thread per row).
//
// Per row t, with m = comb[t] (hc x hc, float32, already softmax + eps):
//   m[:, j] /= sum_i m[i, j] + eps                      (columns first)
//   repeat iters - 1 times: rows, then columns, each    x / (sum + eps)
// (oracle: metrale_glm_kda.hc.sinkhorn_, transformers' Glm5NextTextHyperConnection).  The whole
// matrix lives in registers: hc <= 8.  On the GPU this replaces ~6 * iters tiny launches per
// hyper-connection with one.
//
// Launch: grid ceil(rows / 128), block 128.  comb: [rows, hc, hc] f32 contiguous.
#include "glm_common.cuh"

#define HC_MAX 8

__device__ __forceinline__ void normalise_columns(float* m, int hc, float eps) {
    for (int j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int i = 0; i < hc; ++i) s += m[i * HC_MAX + j];
        const float d = s + eps;
        for (int i = 0; i < hc; ++i) m[i * HC_MAX + j] = m[i * HC_MAX + j] / d;
    }
}

__device__ __forceinline__ void normalise_rows(float* m, int hc, float eps) {
    for (int i = 0; i < hc; ++i) {
        float s = 0.0f;
        for (int j = 0; j < hc; ++j) s += m[i * HC_MAX + j];
        const float d = s + eps;
        for (int j = 0; j < hc; ++j) m[i * HC_MAX + j] = m[i * HC_MAX + j] / d;
    }
}

extern "C" __global__ void hc_sinkhorn_f32(float* comb, int rows, int hc, int iters, float eps) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows) return;
    float m[HC_MAX * HC_MAX];
    float* p = comb + (long long)t * hc * hc;
    for (int i = 0; i < hc; ++i)
        for (int j = 0; j < hc; ++j) m[i * HC_MAX + j] = p[i * hc + j];
    normalise_columns(m, hc, eps);
    for (int it = 1; it < iters; ++it) {
        normalise_rows(m, hc, eps);
        normalise_columns(m, hc, eps);
    }
    for (int i = 0; i < hc; ++i)
        for (int j = 0; j < hc; ++j) p[i * hc + j] = m[i * HC_MAX + j];
}
