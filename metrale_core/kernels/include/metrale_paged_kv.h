/* metrale_paged_kv.h: reading a paged KV cache from the C attention kernels -- where a position's
 * row lives and how MT_LANES of its elements load as float32 -- the score / softmax / value
 * loops of the decode kernel (attention_decode.c; attention_prefill.c reads the cache through
 * cache_row / load_cache and runs its own tiled loops), and the soft-cap both apply to scores.
 *
 * Owner: metrale_core.layers (its C kernels).  It lives in metrale_core/kernels/include (on every
 * CPU build's include path) rather than next to the kernels, whose headers are parsed for entry
 * points.
 *
 * kv_scores, kv_exp_scores and kv_accumulate are the three steps of softmax attention over a run of
 * cached positions, the one copy the decode and prefill kernels share.
 *
 * Invariants: header-only, static inline, over metrale_cpu_math.h's vectors (include that first);
 * caches are [blocks, block_size, Hk, d] with dense rows, of one of three kinds (the KIND / bf16
 * argument): KV_F32, KV_BF16 (widened exactly) or KV_Q8 (llama.cpp's q8_0: the cache argument
 * points at a kv_q8, int8 codes [blocks, block_size, Hk, d] and one float16 scale per 32
 * consecutive values of a row, [blocks, block_size, Hk, d / 32]; a code times its scale is exact
 * in float32, so a q8_0 cache reads as the float32 cache of its dequantized values, bit for bit);
 * table holds a sequence's block ids.
 */
#ifndef METRALE_PAGED_KV_H
#define METRALE_PAGED_KV_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* Sums of four vectors, as [sum a0, sum a1, sum a2, sum a3]. */
#if MT_LANES == 16
static inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 x01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 x23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 y = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x01), _mm512_castps_pd(x23))),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x01), _mm512_castps_pd(x23))));
    const __m256 z = _mm256_add_ps(_mm512_castps512_ps256(y), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps(z, 1));
}
#else
static inline __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#endif

enum { KV_F32 = 0, KV_BF16 = 1, KV_Q8 = 2 };

/* A q8_0 cache: codes and their float16 scales (one per KV_Q8_GROUP values of a row). */
#define KV_Q8_GROUP 32
typedef struct {
    const int8_t *codes;
    const uint16_t *scales;
} kv_q8;

/* Element offset of position t of KV head h in a [blocks, bs, Hk, d] cache. */
static inline int64_t cache_row(const int64_t *table, int64_t t, int block_size, int hk, int h, int d) {
    return ((table[t / block_size] * block_size + t % block_size) * hk + h) * d;
}

/* MT_LANES cache elements from offset e (a multiple of MT_LANES) as float32: bfloat16 widened
 * exactly, q8_0 codes times their group's scale (exact). */
static inline mt_vf load_cache(const void *cache, int64_t e, const int kind) {
    if (kind == KV_Q8) {
        const kv_q8 *c = (const kv_q8 *)cache;
        const mt_vf scale = mt_set1(_cvtsh_ss(c->scales[e / KV_Q8_GROUP]));
#if MT_LANES == 16
        const __m512i codes = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c->codes + e)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(codes), scale);
#else
        const __m256i codes = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c->codes + e)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(codes), scale);
#endif
    }
    const int bf16 = kind == KV_BF16;
#if MT_LANES == 16
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + e))), 16));
#else
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)cache + e))), 16));
#endif
    return mt_load((const float *)cache + e);
}

/* s[t - lo] = qv . K[t] for the positions t in [lo, hi) of KV head h (qv: the query, D / MT_LANES
 * vectors, already scaled), four positions per reduction.  D and KIND are compile-time constants
 * at every call, so the query stays in registers. */
static inline __attribute__((always_inline)) void kv_scores(
        float *s, const mt_vf *qv, const void *k_cache, const int64_t *table, int64_t lo, int64_t hi,
        int block_size, int hk, int h, const int D, const int KIND) {
    int64_t t = lo;
    for (; t + 4 <= hi; t += 4) {
        mt_vf a[4];
        for (int u = 0; u < 4; u++) {
            const int64_t kr = cache_row(table, t + u, block_size, hk, h, D);
            a[u] = mt_mul(qv[0], load_cache(k_cache, kr, KIND));
            for (int i = 1; i < D / MT_LANES; i++) a[u] = mt_fmadd(qv[i], load_cache(k_cache, kr + i * MT_LANES, KIND), a[u]);
        }
        _mm_storeu_ps(s + (t - lo), reduce4(a[0], a[1], a[2], a[3]));
    }
    for (; t < hi; t++) {
        const int64_t kr = cache_row(table, t, block_size, hk, h, D);
        mt_vf a = mt_mul(qv[0], load_cache(k_cache, kr, KIND));
        for (int i = 1; i < D / MT_LANES; i++) a = mt_fmadd(qv[i], load_cache(k_cache, kr + i * MT_LANES, KIND), a);
        s[t - lo] = mt_reduce_add(a);
    }
}

/* s[0, n) -> exp(s - max s) in place; returns max s and stores the sum of the exponentials
 * (lane-wise in order, then the lanes summed) at sum. */
static inline float kv_exp_scores(float *s, int64_t n, float *sum) {
    mt_vf mx = mt_set1(-INFINITY);
    for (int64_t t = 0; t < n; t += MT_LANES) mx = mt_max(mx, mt_mask_load(mx, mt_tail_mask((int)(n - t)), s + t));
    const float top = mt_reduce_max(mx);
    const mt_vf tv = mt_set1(top);
    mt_vf acc = mt_zero();
    for (int64_t t = 0; t < n; t += MT_LANES) {
        const mt_mask m = mt_tail_mask((int)(n - t));
        const mt_vf e = mt_maskz_mov(m, mt_exp(mt_sub(mt_maskz_load(m, s + t), tv)));
        mt_mask_store(s + t, m, e);
        acc = mt_add(acc, e);
    }
    *sum = mt_reduce_add(acc);
    return top;
}

/* acc (D / MT_LANES vectors) += p[t - lo] * V[t] over the positions t in [lo, hi), in order. */
static inline __attribute__((always_inline)) void kv_accumulate(
        mt_vf *acc, const float *p, const void *v_cache, const int64_t *table, int64_t lo, int64_t hi,
        int block_size, int hk, int h, const int D, const int KIND) {
    for (int64_t t = lo; t < hi; t++) {
        const int64_t vr = cache_row(table, t, block_size, hk, h, D);
        const mt_vf w = mt_set1(p[t - lo]);
        for (int i = 0; i < D / MT_LANES; i++) acc[i] = mt_fmadd(w, load_cache(v_cache, vr + i * MT_LANES, KIND), acc[i]);
    }
}

/* s[0, n) -> cap * tanh(s / cap) in place (logit soft-capping, Gemma 2): tanh(x) as
 * (1 - e) / (1 + e) with e = exp(-2x), x clamped to [-9, 9] first (tanh(9) rounds to 1 in float32,
 * and e stays finite); within a few 1e-8 of tanhf absolutely. */
static inline void kv_softcap(float *s, int64_t n, float cap) {
    const mt_vf inv = mt_set1(1.0f / cap), c = mt_set1(cap), one = mt_set1(1.0f);
    for (int64_t t = 0; t < n; t += MT_LANES) {
        const mt_mask m = mt_tail_mask((int)(n - t < MT_LANES ? n - t : MT_LANES));
        const mt_vf x = mt_min(mt_max(mt_mul(mt_maskz_load(m, s + t), inv), mt_set1(-9.0f)), mt_set1(9.0f));
        const mt_vf e = mt_exp(mt_mul(x, mt_set1(-2.0f)));
        mt_mask_store(s + t, m, mt_mul(c, mt_div(mt_sub(one, e), mt_add(one, e))));
    }
}

#endif
