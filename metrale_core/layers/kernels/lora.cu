// Batched LoRA (per-row adapter, BGMV-style): y[t] += (x[t] @ A[s].T) @ B[s].T with s = slots[t].
//
// Owner: metrale_core.layers.lora (LoRAApply.forward_cuda).  Rows with slot -1 are the base model
// and are left untouched.  A: [S, R, K], B: [S, N, R] (the adapter's scale folded in), zero-padded
// beyond each slot's rank, so padded columns add exactly 0.  Every product accumulates in float32.
//
// Launch: lora_shrink_f32 1-D over T * R (tmp[t, r] = x[t] . A[s, r]);
//         lora_expand_f32 1-D over T * N (y[t, n] += tmp[t] . B[s, n]).
#include "common.cuh"

extern "C" __global__ void lora_shrink_f32(const float* __restrict__ x, const float* __restrict__ a,
                                           const int* __restrict__ slots, float* __restrict__ tmp,
                                           long long rows, int k, int r) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * r) return;
    const long long t = idx / r;
    const int j = (int)(idx - t * r);
    const int s = slots[t];
    if (s < 0) {
        tmp[idx] = 0.0f;
        return;
    }
    const float* xr = x + t * k;
    const float* ar = a + ((long long)s * r + j) * k;
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) acc += xr[i] * ar[i];
    tmp[idx] = acc;
}

extern "C" __global__ void lora_expand_f32(const float* __restrict__ tmp, const float* __restrict__ b,
                                           const int* __restrict__ slots, float* __restrict__ y,
                                           long long rows, int n, int r) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * n) return;
    const long long t = idx / n;
    const int o = (int)(idx - t * n);
    const int s = slots[t];
    if (s < 0) return;
    const float* tr = tmp + t * r;
    const float* br = b + ((long long)s * n + o) * r;
    float acc = 0.0f;
    for (int j = 0; j < r; ++j) acc += tr[j] * br[j];
    y[idx] += acc;
}
