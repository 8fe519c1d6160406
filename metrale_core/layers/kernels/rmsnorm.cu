// RMSNorm over the last dimension: out = w * cast(x * rsqrt(mean(x^2) + eps)) (HF semantics:
// normalise in float32, round to the activation dtype, then multiply by the weight).
//
// Launch: grid (rows), block (multiple of 32, <= 1024).  x, out: [rows, dim] contiguous; w: [dim].
#include "common.cuh"

template <typename T>
__device__ void rmsnorm_impl(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                             int rows, int dim, float eps) {
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const T* xr = x + row * dim;
    T* outr = out + row * dim;
    float sq = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = to_float(xr[i]);
        sq += v * v;
    }
    const float total = block_sum(sq);
    const float r = rsqrtf(total / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float normed = round_to<T>(to_float(xr[i]) * r);
        outr[i] = from_float<T>(to_float(w[i]) * normed);
    }
}

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out, int rows, int dim,
                                       float eps) {
    rmsnorm_impl<float>(x, w, out, rows, dim, eps);
}

extern "C" __global__ void rmsnorm_bf16(const bf16* x, const bf16* w, bf16* out, int rows, int dim,
                                        float eps) {
    rmsnorm_impl<bf16>(x, w, out, rows, dim, eps);
}
