// Short causal depthwise conv + SiLU, decode update: one new input per sequence.
//
// Per (sequence b, channel c), with the conv state st = pool[slots[b], c] holding the previous
// W-1 raw inputs (oldest first):
//   y = silu(sum_{j<W-1} w[c, j] * st[j] + w[c, W-1] * x[b, c]);  st <- (st[1:], x[b, c])
// (oracle: metrale_glm_kda.kda.conv_decode).  Accumulates in float32 with float32 weights.
//
// Launch: grid (ceil(C / 256), B), block 256.  x, y: [B, C] (T); pool: [S, C, W-1] (T);
// weight: [C, W] f32; slots: [B] int64; W <= 8.  All contiguous.
#include "glm_common.cuh"

template <typename T>
__device__ void short_conv_update_impl(const T* __restrict__ x, T* __restrict__ pool,
                                       const float* __restrict__ weight, const long long* __restrict__ slots,
                                       T* __restrict__ y, int channels, int width) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int b = blockIdx.y;
    if (c >= channels) return;
    T* st = pool + (slots[b] * channels + c) * (long long)(width - 1);
    const float* w = weight + (long long)c * width;
    const T xin = x[(long long)b * channels + c];
    float acc = w[width - 1] * to_float(xin);
    for (int j = 0; j < width - 1; ++j) acc += w[j] * to_float(st[j]);
    for (int j = 0; j + 1 < width - 1; ++j) st[j] = st[j + 1];
    st[width - 2] = xin;
    y[(long long)b * channels + c] = from_float<T>(silu(acc));
}

extern "C" __global__ void short_conv_update_f32(const float* x, float* pool, const float* weight,
                                                 const long long* slots, float* y, int channels, int width) {
    short_conv_update_impl<float>(x, pool, weight, slots, y, channels, width);
}

extern "C" __global__ void short_conv_update_bf16(const bf16* x, bf16* pool, const float* weight,
                                                  const long long* slots, bf16* y, int channels, int width) {
    short_conv_update_impl<bf16>(x, pool, weight, slots, y, channels, width);
}
