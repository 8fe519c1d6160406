// B1 margin observer: the two largest logits of every row, one block per row.
//
// Per row r of logits [B, V] (float32, contiguous):
//   values[r] = (top1, top2), indices[r] = (argmax, index of the runner-up)
// (oracle: metrale_b1.top2.Top2.forward_native = torch.topk(logits, 2, dim=-1)).
// Ties go to the lower index (the seed's scan keeps the first maximum); NaN never ranks; a row
// of -inf gives -inf values with the lowest indices.  logits is only read.
//
// Launch: grid (B), block TOP2_THREADS (a multiple of 32, at most 1024).  values: [B, 2] f32,
// indices: [B, 2] int64.  V >= 2.

#define TOP2_FULL_MASK 0xffffffffu
#define TOP2_NO_INDEX 0x7fffffff

struct Top2 {
    float v1;
    int i1;
    float v2;
    int i2;
};

__device__ __forceinline__ bool top2_better(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

__device__ __forceinline__ Top2 top2_empty() {
    const float neg_inf = __int_as_float(0xff800000);
    Top2 t = {neg_inf, TOP2_NO_INDEX, neg_inf, TOP2_NO_INDEX};
    return t;
}

__device__ __forceinline__ void top2_push(Top2& t, float v, int i) {
    if (v != v) return;  // NaN
    if (top2_better(v, i, t.v1, t.i1)) {
        t.v2 = t.v1;
        t.i2 = t.i1;
        t.v1 = v;
        t.i1 = i;
    } else if (top2_better(v, i, t.v2, t.i2)) {
        t.v2 = v;
        t.i2 = i;
    }
}

__device__ __forceinline__ Top2 top2_merge(const Top2& a, const Top2& b) {
    Top2 r;
    if (top2_better(a.v1, a.i1, b.v1, b.i1)) {
        r.v1 = a.v1;
        r.i1 = a.i1;
        const bool keep_a = top2_better(a.v2, a.i2, b.v1, b.i1);
        r.v2 = keep_a ? a.v2 : b.v1;
        r.i2 = keep_a ? a.i2 : b.i1;
    } else {
        r.v1 = b.v1;
        r.i1 = b.i1;
        const bool keep_a = top2_better(a.v1, a.i1, b.v2, b.i2);
        r.v2 = keep_a ? a.v1 : b.v2;
        r.i2 = keep_a ? a.i1 : b.i2;
    }
    return r;
}

__device__ __forceinline__ Top2 top2_warp_reduce(Top2 t) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        Top2 other;
        other.v1 = __shfl_down_sync(TOP2_FULL_MASK, t.v1, offset);
        other.i1 = __shfl_down_sync(TOP2_FULL_MASK, t.i1, offset);
        other.v2 = __shfl_down_sync(TOP2_FULL_MASK, t.v2, offset);
        other.i2 = __shfl_down_sync(TOP2_FULL_MASK, t.i2, offset);
        t = top2_merge(t, other);
    }
    return t;
}

extern "C" __global__ void top2_rows_f32(const float* __restrict__ logits, float* __restrict__ values,
                                         long long* __restrict__ indices, int vocab) {
    __shared__ Top2 warp_best[32];
    const long long row = blockIdx.x;
    const float* x = logits + row * vocab;
    Top2 t = top2_empty();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) top2_push(t, x[i], i);
    t = top2_warp_reduce(t);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) warp_best[warp] = t;
    __syncthreads();
    if (warp != 0) return;
    const int num_warps = (blockDim.x + 31) >> 5;
    t = lane < num_warps ? warp_best[lane] : top2_empty();
    t = top2_warp_reduce(t);
    if (lane == 0) {
        values[2 * row] = t.v1;
        values[2 * row + 1] = t.v2;
        indices[2 * row] = t.i1;
        indices[2 * row + 1] = t.i2;
    }
}
