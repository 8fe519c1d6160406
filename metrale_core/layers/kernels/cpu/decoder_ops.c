/* The decoder's small hot ops in float32 for x86 CPUs, one call per op and step; written over
 * metrale_cpu_math.h's vectors, so the same source builds the AVX512F and the AVX2 + FMA variant
 * of the library (MT_LANES = 16 or 8 float lanes).
 *
 * Owner: metrale_core.layers.ops (the forward_cpu of RMSNorm, QKNormRope, SwiGLU, KVCacheWrite, and
 * the MoE router's rows_matmul; attention is attention_decode.c's and attention_prefill.c's; the
 * torch paths are the oracles they are tested against).
 *
 * Each entry point does in one call what the torch path does in 5-15 small ops, so a decode step
 * spends its time in the matmuls rather than in op dispatch.  The maths follows the torch path
 * (float32 throughout; exp from metrale_cpu_math.h, within about 1 ulp of expf), so results agree
 * to float32 rounding, not bit for bit.
 *
 * Invariants: rows of x / q / k / v are dense (unit stride along the head dimension); head_dim
 * is a multiple of 16 where noted; every entry point returns 0, or -1 for arguments it cannot
 * take (the Python side checks first and routes such calls to the torch path).  The signatures
 * are those of decoder_ops.h.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_ops.h"
#include "metrale_cpu_math.h"

/* Rows at or above this many float elements in total are split over the OpenMP team. */
#define PARALLEL_ELEMENTS 16384

static inline float sum_squares(const float *x, int n) {
    mt_vf acc = mt_zero();
    for (int i = 0; i < n; i += MT_LANES) {
        mt_vf v = mt_maskz_load(mt_tail_mask(n - i), x + i);
        acc = mt_fmadd(v, v, acc);
    }
    return mt_reduce_add(acc);
}

/* out = w * (x * rsqrt(mean(x^2) + eps)); x and out may alias. */
static inline void norm_row(const float *x, const float *w, float *out, int n, float eps) {
    const mt_vf inv = mt_set1(1.0f / __builtin_sqrtf(sum_squares(x, n) / (float)n + eps));
    for (int i = 0; i < n; i += MT_LANES) {
        const mt_mask m = mt_tail_mask(n - i);
        mt_vf v = mt_mul(mt_maskz_load(m, x + i), inv);
        mt_mask_store(out + i, m, mt_mul(v, mt_maskz_load(m, w + i)));
    }
}

int dop_rms_norm(const float *x, int64_t x_stride, const float *w, float *out, int rows, int dim,
                 float eps, int threads) {
    if (rows < 0 || dim <= 0 || threads <= 0) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) if ((int64_t)rows * dim >= PARALLEL_ELEMENTS)
    for (int r = 0; r < rows; r++) norm_row(x + r * x_stride, w, out + (int64_t)r * dim, dim, eps);
    return 0;
}

/* rotate_half RoPE of one head in place: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. */
static inline void rope_head(float *x, const float *cos, const float *sin, int d) {
    const int half = d / 2;
    for (int i = 0; i < half; i += MT_LANES) {
        const mt_mask m = mt_tail_mask(half - i);
        mt_vf a = mt_maskz_load(m, x + i), b = mt_maskz_load(m, x + half + i);
        mt_vf ca = mt_maskz_load(m, cos + i), sa = mt_maskz_load(m, sin + i);
        mt_vf cb = mt_maskz_load(m, cos + half + i), sb = mt_maskz_load(m, sin + half + i);
        mt_mask_store(x + i, m, mt_fnmadd(b, sa, mt_mul(a, ca)));
        mt_mask_store(x + half + i, m, mt_fmadd(a, sb, mt_mul(b, cb)));
    }
}

/* q [T, Hq, d] and k [T, Hk, d] (token strides q_stride / k_stride) in place: optional per-head
 * RMSNorm (qw / kw, both NULL to skip), then RoPE with cos / sin [T, d]. */
int dop_qk_norm_rope(float *q, int64_t q_stride, int hq, float *k, int64_t k_stride, int hk,
                     int tokens, int d, const float *qw, const float *kw, const float *cos,
                     const float *sin, float eps, int threads) {
    if (tokens < 0 || d <= 0 || d % 2 || threads <= 0 || ((qw == NULL) != (kw == NULL))) return -1;
    const int heads = hq + hk;
#pragma omp parallel for num_threads(threads) schedule(static) if ((int64_t)tokens * heads * d >= PARALLEL_ELEMENTS)
    for (int64_t i = 0; i < (int64_t)tokens * heads; i++) {
        const int t = (int)(i / heads), h = (int)(i % heads);
        float *x = h < hq ? q + t * q_stride + (int64_t)h * d : k + t * k_stride + (int64_t)(h - hq) * d;
        if (qw != NULL) norm_row(x, h < hq ? qw : kw, x, d, eps);
        rope_head(x, cos + (int64_t)t * d, sin + (int64_t)t * d, d);
    }
    return 0;
}

/* out[r, i] = silu(gu[r, i]) * gu[r, inter + i] for gu [rows, 2 * inter]. */
int dop_swiglu(const float *gu, float *out, int rows, int inter, int threads) {
    if (rows < 0 || inter <= 0 || threads <= 0) return -1;
    const mt_vf one = mt_set1(1.0f);
#pragma omp parallel for num_threads(threads) schedule(static) if ((int64_t)rows * inter >= PARALLEL_ELEMENTS)
    for (int r = 0; r < rows; r++) {
        const float *g = gu + (int64_t)r * 2 * inter, *u = g + inter;
        float *o = out + (int64_t)r * inter;
        for (int i = 0; i < inter; i += MT_LANES) {
            const mt_mask m = mt_tail_mask(inter - i);
            mt_vf x = mt_maskz_load(m, g + i);
            mt_vf s = mt_div(x, mt_add(one, mt_exp(mt_sub(mt_zero(), x))));
            mt_mask_store(o + i, m, mt_mul(s, mt_maskz_load(m, u + i)));
        }
    }
    return 0;
}

/* bfloat16 of MT_LANES floats, rounded to nearest even, NaN -> 0xFFFF: bit for bit torch's
 * (vectorised) .to(bfloat16); stored at out. */
#if MT_LANES == 16
static inline void store_bf16(uint16_t *out, __m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32((int)0xFFFF0000u));
    _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}
#else
static inline void store_bf16(uint16_t *out, __m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32((int)0xFFFF0000u), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    r = _mm256_srli_epi32(r, 16);  /* 0..0xFFFF per lane: packus keeps them; fix the lane order */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(packed));
}
#endif

/* Cache rows (row = Hk * d elements; float32, or bfloat16 when bf16) at slots[t] = k[t] / v[t]. */
int dop_kv_write(const float *k, int64_t k_stride, const float *v, int64_t v_stride, void *k_cache,
                 void *v_cache, const int64_t *slots, int tokens, int row, int bf16) {
    if (tokens < 0 || row <= 0 || (bf16 && row % 16)) return -1;
    for (int t = 0; t < tokens; t++) {
        const float *src[2] = {k + t * k_stride, v + t * v_stride};
        void *dst[2] = {k_cache, v_cache};
        for (int kv = 0; kv < 2; kv++) {
            if (!bf16) {
                memcpy((float *)dst[kv] + slots[t] * row, src[kv], sizeof(float) * (size_t)row);
                continue;
            }
            uint16_t *out = (uint16_t *)dst[kv] + slots[t] * row;
            for (int i = 0; i < row; i += MT_LANES) store_bf16(out + i, mt_load(src[kv] + i));
        }
    }
    return 0;
}

/* One column's dot product: lane-wise fused multiply-adds over k in order, then the lanes summed. */
static inline float dot_fixed(const float *a, const float *b, int k) {
    mt_vf acc = mt_zero();
    for (int i = 0; i < k; i += MT_LANES) {
        const mt_mask m = mt_tail_mask(k - i);
        acc = mt_fmadd(mt_maskz_load(m, a + i), mt_maskz_load(m, b + i), acc);
    }
    return mt_reduce_add(acc);
}

/* out[r, j] = x[r] . w[j] for x [rows, k] (row stride x_stride) and a dense w [n, k]: each dot
 * product in one fixed order (dot_fixed's; four columns share the loads of x but keep their own
 * accumulators), whatever rows, n or threads are, so a row's result never depends on the other
 * rows (the router of an MoE layer, batch-invariant as the GGUF kernels). */
int dop_rows_matmul(const float *x, int64_t x_stride, const float *w, float *out, int rows, int n, int k,
                    int threads) {
    if (rows < 0 || n <= 0 || k <= 0 || threads <= 0 || x_stride < k) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) if ((int64_t)rows * n * k >= (1 << 20))
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * x_stride;
        float *o = out + (int64_t)r * n;
        int j = 0;
        for (; j + 4 <= n; j += 4) {
            const float *w0 = w + (int64_t)j * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
            mt_vf a0 = mt_zero(), a1 = mt_zero(), a2 = mt_zero(), a3 = mt_zero();
            for (int i = 0; i < k; i += MT_LANES) {
                const mt_mask m = mt_tail_mask(k - i);
                const mt_vf v = mt_maskz_load(m, xr + i);
                a0 = mt_fmadd(v, mt_maskz_load(m, w0 + i), a0);
                a1 = mt_fmadd(v, mt_maskz_load(m, w1 + i), a1);
                a2 = mt_fmadd(v, mt_maskz_load(m, w2 + i), a2);
                a3 = mt_fmadd(v, mt_maskz_load(m, w3 + i), a3);
            }
            o[j] = mt_reduce_add(a0);
            o[j + 1] = mt_reduce_add(a1);
            o[j + 2] = mt_reduce_add(a2);
            o[j + 3] = mt_reduce_add(a3);
        }
        for (; j < n; j++) o[j] = dot_fixed(xr, w + (int64_t)j * k, k);
    }
    return 0;
}
