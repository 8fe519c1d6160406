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

static inline float dot16(const float *a, const float *b, int d) {
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b));
    for (int i = 16; i < d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    return _mm512_reduce_add_ps(acc);
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

/* The g query heads qh [g, d] of KV head h of one sequence over its len cached positions
 * (table: its block ids); scores [g, len] and acc [g, d] are scratch, out [g, d]. */
static void attend_kv_head(float *out, const float *qh, const float *k_cache, const float *v_cache,
                           const int64_t *table, int64_t len, int g, int hk, int h, int d,
                           int block_size, float scale, float *scores, float *acc) {
    for (int64_t t = 0; t < len; t++) {
        const int64_t slot = table[t / block_size] * block_size + t % block_size;
        const float *kr = k_cache + (slot * hk + h) * d;
        for (int j = 0; j < g; j++) scores[j * len + t] = dot16(qh + (int64_t)j * d, kr, d) * scale;
    }
    for (int j = 0; j < g; j++) softmax_row(scores + j * len, len);
    memset(acc, 0, sizeof(float) * (size_t)(g * d));
    for (int64_t t = 0; t < len; t++) {
        const int64_t slot = table[t / block_size] * block_size + t % block_size;
        const float *vr = v_cache + (slot * hk + h) * d;
        for (int j = 0; j < g; j++) {
            const __m512 p = _mm512_set1_ps(scores[j * len + t]);
            float *a = acc + j * d;
            for (int i = 0; i < d; i += 16)
                _mm512_storeu_ps(a + i, _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + i), _mm512_loadu_ps(a + i)));
        }
    }
    memcpy(out, acc, sizeof(float) * (size_t)(g * d));
}

/* One query row per sequence: out / q [B, Hq, d] (dense), caches [blocks, bs, Hk, d], tables
 * [B, table_stride] block ids, context [B].  The G = Hq / Hk query heads of a KV head share one
 * pass over its keys and values (two-pass softmax); work items are (sequence, KV head) pairs. */
int dop_paged_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                     const int64_t *tables, int64_t table_stride, const int64_t *context, int batch,
                     int hq, int hk, int d, int block_size, float scale, int threads) {
    if (batch < 0 || hk <= 0 || hq % hk || d % 16 || block_size <= 0 || threads <= 0) return -1;
    int64_t longest = 0;
    for (int b = 0; b < batch; b++) longest = context[b] > longest ? context[b] : longest;
    const int g = hq / hk;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(g * (longest + 16)));
        float *acc = malloc(sizeof(float) * (size_t)(g * d));
#pragma omp for schedule(static)
        for (int item = 0; item < batch * hk; item++) {
            if (scores == NULL || acc == NULL) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            const int b = item / hk, h = item % hk;
            const int64_t head = (int64_t)b * hq + (int64_t)h * g;
            attend_kv_head(out + head * d, q + head * d, k_cache, v_cache, tables + b * table_stride,
                           context[b], g, hk, h, d, block_size, scale, scores, acc);
        }
        free(scores);
        free(acc);
    }
    return failed ? -1 : 0;
}
