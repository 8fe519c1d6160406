/* The decoder's small hot ops in float32 for x86 CPUs (AVX512F), one call per op and step.
 *
 * Owner: metrale_qwen3.ops (the forward_cpu of RMSNorm, QKNormRope, SwiGLU, KVCacheWrite and
 * PagedAttentionDecode; layers.py / attention.py are the oracles they are tested against).
 *
 * Each entry point does in one call what the torch path does in 5-15 small ops, so a decode step
 * spends its time in the matmuls rather than in op dispatch.  The maths follows the torch path
 * (float32 throughout; exp from metrale_cpu_math.h, within about 1 ulp of expf), so results agree
 * to float32 rounding, not bit for bit.
 *
 * Invariants: rows of x / q / k / v are dense (unit stride along the head dimension); head_dim
 * is a multiple of 16 where noted; every entry point returns 0, or -1 for arguments it cannot
 * take (the Python side checks first and routes such calls to the torch path).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "metrale_cpu_math.h"

/* Rows at or above this many float elements in total are split over the OpenMP team. */
#define PARALLEL_ELEMENTS 16384

static inline float sum_squares(const float *x, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(mt_tail_mask(n - i), x + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* out = w * (x * rsqrt(mean(x^2) + eps)); x and out may alias. */
static inline void norm_row(const float *x, const float *w, float *out, int n, float eps) {
    const __m512 inv = _mm512_set1_ps(1.0f / __builtin_sqrtf(sum_squares(x, n) / (float)n + eps));
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = mt_tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
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
    for (int i = 0; i < half; i += 16) {
        const __mmask16 m = mt_tail_mask(half - i);
        __m512 a = _mm512_maskz_loadu_ps(m, x + i), b = _mm512_maskz_loadu_ps(m, x + half + i);
        __m512 ca = _mm512_maskz_loadu_ps(m, cos + i), sa = _mm512_maskz_loadu_ps(m, sin + i);
        __m512 cb = _mm512_maskz_loadu_ps(m, cos + half + i), sb = _mm512_maskz_loadu_ps(m, sin + half + i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_fnmadd_ps(b, sa, _mm512_mul_ps(a, ca)));
        _mm512_mask_storeu_ps(x + half + i, m, _mm512_fmadd_ps(a, sb, _mm512_mul_ps(b, cb)));
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
    const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for num_threads(threads) schedule(static) if ((int64_t)rows * inter >= PARALLEL_ELEMENTS)
    for (int r = 0; r < rows; r++) {
        const float *g = gu + (int64_t)r * 2 * inter, *u = g + inter;
        float *o = out + (int64_t)r * inter;
        for (int i = 0; i < inter; i += 16) {
            const __mmask16 m = mt_tail_mask(inter - i);
            __m512 x = _mm512_maskz_loadu_ps(m, g + i);
            __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, mt_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
            _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
        }
    }
    return 0;
}

/* k_cache / v_cache rows (row = Hk * d floats) at slots[t] = k[t] / v[t]. */
int dop_kv_write(const float *k, int64_t k_stride, const float *v, int64_t v_stride, float *k_cache,
                 float *v_cache, const int64_t *slots, int tokens, int row) {
    if (tokens < 0 || row <= 0) return -1;
    for (int t = 0; t < tokens; t++) {
        memcpy(k_cache + slots[t] * row, k + t * k_stride, sizeof(float) * (size_t)row);
        memcpy(v_cache + slots[t] * row, v + t * v_stride, sizeof(float) * (size_t)row);
    }
    return 0;
}

/* Scores s[0, len) -> softmax probabilities in place (max-subtracted exponentials, normalised). */
static void softmax_row(float *s, int64_t len) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < len; t += 16)
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, mt_tail_mask((int)(len - t)), s + t));
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 16) {
        const __mmask16 m = mt_tail_mask((int)(len - t));
        __m512 e = _mm512_maskz_mov_ps(m, mt_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), top)));
        _mm512_mask_storeu_ps(s + t, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    const float total = _mm512_reduce_add_ps(sum);
    const __m512 inv = _mm512_set1_ps(total > 0.0f ? 1.0f / total : 0.0f);
    for (int64_t t = 0; t < len; t += 16) {
        const __mmask16 m = mt_tail_mask((int)(len - t));
        _mm512_mask_storeu_ps(s + t, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + t), inv));
    }
}

/* Sums of four 16-lane vectors, as [sum a0, sum a1, sum a2, sum a3]. */
static inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 x01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 x23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 y = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x01), _mm512_castps_pd(x23))),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x01), _mm512_castps_pd(x23))));
    const __m256 z = _mm256_add_ps(_mm512_castps512_ps256(y), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps(z, 1));
}

static inline const float *cache_row(const float *cache, const int64_t *table, int64_t t, int block_size,
                                     int hk, int h, int d) {
    return cache + ((table[t / block_size] * block_size + t % block_size) * hk + h) * d;
}

/* The g query heads qh [g, D] of KV head h of one sequence over its len cached positions (table:
 * its block ids) into out [g, D]; scores [g, len + 4] is scratch.  D is a compile-time constant at
 * every call, so a head's query and accumulator stay in registers; scores are reduced four
 * positions at a time. */
static inline __attribute__((always_inline)) void attend_kv_head(
        float *out, const float *qh, const float *k_cache, const float *v_cache, const int64_t *table,
        int64_t len, int g, int hk, int h, const int D, int block_size, float scale, float *scores) {
    for (int j = 0; j < g; j++) {
        __m512 qv[16];
        for (int i = 0; i < D / 16; i++) qv[i] = _mm512_mul_ps(_mm512_loadu_ps(qh + j * D + i * 16), _mm512_set1_ps(scale));
        float *s = scores + j * len;
        int64_t t = 0;
        for (; t + 4 <= len; t += 4) {
            __m512 a[4];
            for (int u = 0; u < 4; u++) {
                const float *kr = cache_row(k_cache, table, t + u, block_size, hk, h, D);
                a[u] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
                for (int i = 1; i < D / 16; i++) a[u] = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(kr + i * 16), a[u]);
            }
            _mm_storeu_ps(s + t, reduce4(a[0], a[1], a[2], a[3]));
        }
        for (; t < len; t++) {
            const float *kr = cache_row(k_cache, table, t, block_size, hk, h, D);
            __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
            for (int i = 1; i < D / 16; i++) a = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(kr + i * 16), a);
            s[t] = _mm512_reduce_add_ps(a);
        }
        softmax_row(s, len);
        __m512 acc[16];
        for (int i = 0; i < D / 16; i++) acc[i] = _mm512_setzero_ps();
        for (t = 0; t < len; t++) {
            const float *vr = cache_row(v_cache, table, t, block_size, hk, h, D);
            const __m512 p = _mm512_set1_ps(s[t]);
            for (int i = 0; i < D / 16; i++) acc[i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + i * 16), acc[i]);
        }
        for (int i = 0; i < D / 16; i++) _mm512_storeu_ps(out + j * D + i * 16, acc[i]);
    }
}

static void attend_kv_head_64(float *out, const float *qh, const float *kc, const float *vc, const int64_t *table,
                              int64_t len, int g, int hk, int h, int bs, float scale, float *scores) {
    attend_kv_head(out, qh, kc, vc, table, len, g, hk, h, 64, bs, scale, scores);
}

static void attend_kv_head_128(float *out, const float *qh, const float *kc, const float *vc, const int64_t *table,
                               int64_t len, int g, int hk, int h, int bs, float scale, float *scores) {
    attend_kv_head(out, qh, kc, vc, table, len, g, hk, h, 128, bs, scale, scores);
}

static void attend_kv_head_any(float *out, const float *qh, const float *kc, const float *vc, const int64_t *table,
                               int64_t len, int g, int hk, int h, int d, int bs, float scale, float *scores) {
    attend_kv_head(out, qh, kc, vc, table, len, g, hk, h, d, bs, scale, scores);
}

/* One query row per sequence: q [B, Hq, d] (dense heads, row stride q_stride), out [B, Hq, d]
 * (dense), caches [blocks, bs, Hk, d], tables
 * [B, table_stride] block ids, context [B]; head_dim a multiple of 16 up to 256.  Work items are
 * (sequence, KV head) pairs; the G = Hq / Hk query heads of a KV head read its rows while they are
 * in L1 (two-pass softmax). */
int dop_paged_decode(float *out, const float *q, int64_t q_stride, const float *k_cache,
                     const float *v_cache, const int64_t *tables, int64_t table_stride,
                     const int64_t *context, int batch, int hq, int hk, int d, int block_size,
                     float scale, int threads) {
    if (batch < 0 || hk <= 0 || hq % hk || d % 16 || d > 256 || block_size <= 0 || threads <= 0) return -1;
    int64_t longest = 0;
    for (int b = 0; b < batch; b++) longest = context[b] > longest ? context[b] : longest;
    const int g = hq / hk;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(g * (longest + 16)));
#pragma omp for schedule(static)
        for (int item = 0; item < batch * hk; item++) {
            if (scores == NULL) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            const int b = item / hk, h = item % hk;
            float *o = out + ((int64_t)b * hq + (int64_t)h * g) * d;
            const float *qh = q + b * q_stride + (int64_t)h * g * d;
            const int64_t *table = tables + b * table_stride;
            if (d == 64)
                attend_kv_head_64(o, qh, k_cache, v_cache, table, context[b], g, hk, h, block_size, scale, scores);
            else if (d == 128)
                attend_kv_head_128(o, qh, k_cache, v_cache, table, context[b], g, hk, h, block_size, scale, scores);
            else
                attend_kv_head_any(o, qh, k_cache, v_cache, table, context[b], g, hk, h, d, block_size, scale,
                                   scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}

/* Multi-row (prefill) segments: rows [R, 3] int64 = (row of q / out, sequence, visible
 * positions) -- each query row attends causally to the first `visible` positions of its
 * sequence's cache.  Work items are (row, KV head) pairs; same per-head maths as decode. */
int dop_paged_prefill(float *out, int64_t out_stride, const float *q, int64_t q_stride,
                      const float *k_cache, const float *v_cache, const int64_t *tables,
                      int64_t table_stride, const int64_t *rows, int num_rows, int hq, int hk, int d,
                      int block_size, float scale, int threads) {
    if (num_rows < 0 || hk <= 0 || hq % hk || d % 16 || d > 256 || block_size <= 0 || threads <= 0) return -1;
    int64_t longest = 0;
    for (int r = 0; r < num_rows; r++) longest = rows[3 * r + 2] > longest ? rows[3 * r + 2] : longest;
    const int g = hq / hk;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(g * (longest + 16)));
#pragma omp for schedule(dynamic, 4)
        for (int item = 0; item < num_rows * hk; item++) {
            if (scores == NULL) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            const int64_t *row = rows + 3 * (item / hk);
            const int h = item % hk;
            float *o = out + row[0] * out_stride + (int64_t)h * g * d;
            const float *qh = q + row[0] * q_stride + (int64_t)h * g * d;
            const int64_t *table = tables + row[1] * table_stride;
            if (d == 64)
                attend_kv_head_64(o, qh, k_cache, v_cache, table, row[2], g, hk, h, block_size, scale, scores);
            else if (d == 128)
                attend_kv_head_128(o, qh, k_cache, v_cache, table, row[2], g, hk, h, block_size, scale, scores);
            else
                attend_kv_head_any(o, qh, k_cache, v_cache, table, row[2], g, hk, h, d, block_size, scale,
                                   scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
