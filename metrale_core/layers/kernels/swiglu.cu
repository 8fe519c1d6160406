// SwiGLU on a fused [gate | up] projection: out[r, i] = silu(gate[r, i]) * up[r, i].
// silu is rounded to the activation dtype before the product, as torch computes it.
//
// Launch: 1-D grid-stride over rows * inter elements.  gate_up: [rows, 2 * inter] contiguous;
// out: [rows, inter] contiguous.
#include "common.cuh"

template <typename T>
__device__ void swiglu_impl(const T* __restrict__ gate_up, T* __restrict__ out, long long rows,
                            int inter) {
    const long long total = rows * inter;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const long long r = idx / inter;
        const int i = (int)(idx - r * inter);
        const float g = to_float(gate_up[r * 2 * inter + i]);
        const float u = to_float(gate_up[r * 2 * inter + inter + i]);
        const float act = round_to<T>(g / (1.0f + expf(-g)));
        out[idx] = from_float<T>(act * u);
    }
}

extern "C" __global__ void swiglu_f32(const float* gate_up, float* out, long long rows, int inter) {
    swiglu_impl<float>(gate_up, out, rows, inter);
}

extern "C" __global__ void swiglu_bf16(const bf16* gate_up, bf16* out, long long rows, int inter) {
    swiglu_impl<bf16>(gate_up, out, rows, inter);
}
