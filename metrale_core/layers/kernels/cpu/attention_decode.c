/* Split-K (flash-decoding) paged decode attention in float32 for x86 CPUs: one query row per
 * sequence over its paged K/V cache, the context cut into chunks of DECODE_CHUNK positions that
 * run in parallel, then one merge per (sequence, query head).  Written over metrale_cpu_math.h's
 * vectors, so the same source builds the AVX512F and the AVX2 + FMA variant of the library.
 *
 * Owner: metrale_core.layers.ops (PagedAttentionDecode.forward_cpu; attention.py's
 * decode_attention is the oracle it is tested against).
 *
 * Work items are (sequence, KV head, chunk) triples, so one long sequence at batch 1 keeps every
 * thread busy (the (sequence, KV head) pairs of a model with 2-3 KV heads kept 2-3).  A chunk
 * computes, for each of the G query heads of its KV head, the maximum m of its scores, the sum l
 * of exp(score - m) and the unnormalised value accumulator sum exp(score - m) v; the merge then
 * rescales and adds the chunks of a (sequence, head) in chunk order.
 *
 * Invariants:
 * - Batch invariance: chunks are fixed runs of DECODE_CHUNK absolute positions (chunk c holds
 *   positions [c * DECODE_CHUNK, (c + 1) * DECODE_CHUNK) of the visible range), never derived from
 *   the batch, the thread count or the schedule, and the merge visits them in chunk order; so a
 *   row's output has the same bits alone, in any batch and on any number of threads.
 * - K/V are read in the cache dtype (float32, bfloat16 widened exactly, or q8_0 codes times their
 *   float16 group scale, exact: dop_paged_decode_q8 gives the bits dop_paged_decode gives on the
 *   float32 cache of the dequantized values); head_dim is a multiple of 16 up to 256 (of 32 for
 *   q8_0); softmax in float32 (exp: metrale_cpu_math.h's in a chunk, expf in the merge).
 * - window > 0 limits a row at position p (context p + 1) to the positions p - window + 1 .. p;
 *   sinks (NULL: none) are per-query-head logits in every softmax with no value (gpt-oss);
 *   softcap > 0 caps every score at softcap * tanh(score / softcap) before the softmax (Gemma 2).
 * - A sequence with no visible position gets a zero row.  Returns 0, or -1 for arguments it
 *   cannot take or when scratch cannot be allocated.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_decode.h"
#include "metrale_cpu_math.h"
#include "metrale_paged_kv.h"

/* Positions per chunk: a fixed constant (see the batch-invariance invariant).  256 positions of
 * a 64..128-wide head are 64-128 KiB of float32 K, re-read from L2 by each of the G query heads. */
#define DECODE_CHUNK 256

int dop_decode_chunk_len(void) { return DECODE_CHUNK; }

/* The partial softmax of query heads qh [g, D] of KV head h over positions [lo, hi) (hi - lo <=
 * DECODE_CHUNK) into part [g, D + 2]: per head the accumulator [D], then m and l. */
static inline __attribute__((always_inline)) void chunk_partial(
        float *part, const float *qh, const void *k_cache, const void *v_cache, const int64_t *table,
        int64_t lo, int64_t hi, int g, int hk, int h, const int D, const int KIND, int block_size, float scale,
        float softcap) {
    float s[DECODE_CHUNK];
    for (int j = 0; j < g; j++) {
        mt_vf qv[256 / MT_LANES], acc[256 / MT_LANES];
        for (int i = 0; i < D / MT_LANES; i++) {
            qv[i] = mt_mul(mt_load(qh + j * D + i * MT_LANES), mt_set1(scale));
            acc[i] = mt_zero();
        }
        kv_scores(s, qv, k_cache, table, lo, hi, block_size, hk, h, D, KIND);
        if (softcap > 0.0f) kv_softcap(s, hi - lo, softcap);
        float *rec = part + (int64_t)j * (D + 2);
        rec[D] = kv_exp_scores(s, hi - lo, &rec[D + 1]);
        kv_accumulate(acc, s, v_cache, table, lo, hi, block_size, hk, h, D, KIND);
        for (int i = 0; i < D / MT_LANES; i++) mt_store(rec + i * MT_LANES, acc[i]);
    }
}

/* chunk_partial over a q8_0 cache: the chunk's K / V rows of head h dequantized once (exactly)
 * into float32 scratch that reads as a one-block, one-head float32 cache, then the float32
 * loops -- the same values in the same order, so the same bits as reading the codes in the loops,
 * with the dequantization done once per chunk instead of once per query head. */
static inline __attribute__((always_inline)) void chunk_partial_q8(
        float *part, const float *qh, const void *k_cache, const void *v_cache, const int64_t *table,
        int64_t lo, int64_t hi, int g, int hk, int h, const int D, int block_size, float scale, float softcap) {
    float *kb = aligned_alloc(64, sizeof(float) * 2 * DECODE_CHUNK * (size_t)D);
    if (kb == NULL) {
        chunk_partial(part, qh, k_cache, v_cache, table, lo, hi, g, hk, h, D, KV_Q8, block_size, scale, softcap);
        return;
    }
    float *vb = kb + DECODE_CHUNK * D;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t e = cache_row(table, t, block_size, hk, h, D), r = (t - lo) * D;
        for (int i = 0; i < D; i += MT_LANES) {
            mt_store(kb + r + i, load_cache(k_cache, e + i, KV_Q8));
            mt_store(vb + r + i, load_cache(v_cache, e + i, KV_Q8));
        }
    }
    const int64_t one_block = 0;
    chunk_partial(part, qh, kb, vb, &one_block, 0, hi - lo, g, 1, 0, D, KV_F32, DECODE_CHUNK, scale, softcap);
    free(kb);
}

typedef void (*chunk_fn)(float *, const float *, const void *, const void *, const int64_t *, int64_t, int64_t,
                         int, int, int, int, int, float, float);

#define CHUNK_FN(NAME, D, KIND)                                                                               \
    static void NAME(float *part, const float *qh, const void *kc, const void *vc, const int64_t *table,       \
                     int64_t lo, int64_t hi, int g, int hk, int h, int d, int bs, float scale, float cap) {   \
        (void)d;                                                                                              \
        if (KIND == KV_Q8)                                                                                    \
            chunk_partial_q8(part, qh, kc, vc, table, lo, hi, g, hk, h, D, bs, scale, cap);                  \
        else                                                                                                  \
            chunk_partial(part, qh, kc, vc, table, lo, hi, g, hk, h, D, KIND, bs, scale, cap);               \
    }
CHUNK_FN(chunk_64, 64, KV_F32) CHUNK_FN(chunk_128, 128, KV_F32) CHUNK_FN(chunk_any, d, KV_F32)
CHUNK_FN(chunk_64_bf16, 64, KV_BF16) CHUNK_FN(chunk_128_bf16, 128, KV_BF16) CHUNK_FN(chunk_any_bf16, d, KV_BF16)
CHUNK_FN(chunk_64_q8, 64, KV_Q8) CHUNK_FN(chunk_128_q8, 128, KV_Q8) CHUNK_FN(chunk_any_q8, d, KV_Q8)

/* The specialised loop for head size d over caches of kind (KV_F32, KV_BF16 or KV_Q8). */
static chunk_fn pick_chunk(int d, int kind) {
    static const chunk_fn fns[3][3] = {{chunk_64, chunk_128, chunk_any},
                                       {chunk_64_bf16, chunk_128_bf16, chunk_any_bf16},
                                       {chunk_64_q8, chunk_128_q8, chunk_any_q8}};
    return fns[kind][d == 64 ? 0 : d == 128 ? 1 : 2];
}

/* out [g, d] from the n chunk partials of one (sequence, KV head), the first at part and each next
 * one step floats further ([g, d + 2] records), merged in chunk order; sink: [g] logits or NULL. */
static void merge_chunks(float *out, const float *part, int64_t n, int64_t step, int g, int d, const float *sink) {
    for (int j = 0; j < g; j++) {
        float *o = out + (int64_t)j * d;
        const float *rec = part + (int64_t)j * (d + 2);
        float top = sink != NULL ? sink[j] : -INFINITY;
        for (int64_t c = 0; c < n; c++) top = fmaxf(top, rec[c * step + d]);
        float total = sink != NULL ? expf(sink[j] - top) : 0.0f;
        for (int i = 0; i < d; i += MT_LANES) mt_store(o + i, mt_zero());
        for (int64_t c = 0; c < n; c++) {
            const float *r = rec + c * step;
            const float w = expf(r[d] - top);
            total += r[d + 1] * w;
            const mt_vf wv = mt_set1(w);
            for (int i = 0; i < d; i += MT_LANES) mt_store(o + i, mt_fmadd(wv, mt_load(r + i), mt_load(o + i)));
        }
        const mt_vf inv = mt_set1(total > 0.0f ? 1.0f / total : 0.0f);
        for (int i = 0; i < d; i += MT_LANES) mt_store(o + i, mt_mul(mt_load(o + i), inv));
    }
}

/* dop_paged_decode over caches of kind (k_cache / v_cache point at kv_q8 records for KV_Q8). */
static int paged_decode(float *out, const float *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                        int kind, const int64_t *tables, int64_t table_stride, const int64_t *context, int batch,
                        int hq, int hk, int d, int block_size, float scale, int64_t window, const float *sinks,
                        float softcap, int threads) {
    if (batch < 0 || hk <= 0 || hq % hk || d <= 0 || d % (kind == KV_Q8 ? KV_Q8_GROUP : 16) || d > 256 ||
        block_size <= 0 || threads <= 0 || window < 0 || softcap < 0.0f || kind < KV_F32 || kind > KV_Q8)
        return -1;
    const int g = hq / hk;
    /* first[b]: the global index of sequence b's first chunk; first[batch]: the chunk count. */
    int64_t *first = malloc(sizeof(int64_t) * ((size_t)batch + 1));
    if (first == NULL) return -1;
    first[0] = 0;
    for (int b = 0; b < batch; b++) {
        if (context[b] < 0) {
            free(first);
            return -1;
        }
        const int64_t lo = window > 0 && context[b] > window ? context[b] - window : 0;
        first[b + 1] = first[b] + (context[b] > lo ? (context[b] - 1) / DECODE_CHUNK - lo / DECODE_CHUNK + 1 : 0);
    }
    const int64_t chunks = first[batch], record = (int64_t)g * (d + 2);
    int *seq_of = malloc(sizeof(int) * (size_t)(chunks > 0 ? chunks : 1));
    float *parts = malloc(sizeof(float) * (size_t)(chunks > 0 ? chunks * hk * record : 1));
    if (seq_of == NULL || parts == NULL) {
        free(first), free(seq_of), free(parts);
        return -1;
    }
    for (int b = 0; b < batch; b++)
        for (int64_t c = first[b]; c < first[b + 1]; c++) seq_of[c] = b;
    const chunk_fn chunk = pick_chunk(d, kind);
#pragma omp parallel num_threads(threads) if (chunks * hk > 1)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < chunks * hk; item++) {
            const int64_t c = item / hk;
            const int b = seq_of[c], h = (int)(item % hk);
            const int64_t lo = window > 0 && context[b] > window ? context[b] - window : 0;
            const int64_t start = (lo / DECODE_CHUNK + c - first[b]) * DECODE_CHUNK;
            const int64_t end = start + DECODE_CHUNK < context[b] ? start + DECODE_CHUNK : context[b];
            chunk(parts + item * record, q + b * q_stride + (int64_t)h * g * d, k_cache, v_cache,
                  tables + b * table_stride, start > lo ? start : lo, end, g, hk, h, d, block_size, scale, softcap);
        }
#pragma omp for schedule(static)
        for (int item = 0; item < batch * hk; item++) {
            const int b = item / hk, h = item % hk;
            merge_chunks(out + ((int64_t)b * hq + (int64_t)h * g) * d, parts + (first[b] * hk + h) * record,
                         first[b + 1] - first[b], hk * record, g, d, sinks != NULL ? sinks + (int64_t)h * g : NULL);
        }
    }
    free(first), free(seq_of), free(parts);
    return 0;
}

/* One query row per sequence: q [B, Hq, d] (dense heads, row stride q_stride), out [B, Hq, d]
 * (dense), caches [blocks, bs, Hk, d] (float32, or bfloat16 when bf16), tables
 * [B, table_stride] block ids, context [B]; window (0: none), sinks [Hq] (NULL: none) and softcap
 * (0: none) as the file's invariants say. */
int dop_paged_decode(float *out, const float *q, int64_t q_stride, const void *k_cache,
                     const void *v_cache, int bf16, const int64_t *tables, int64_t table_stride,
                     const int64_t *context, int batch, int hq, int hk, int d, int block_size,
                     float scale, int64_t window, const float *sinks, float softcap, int threads) {
    if (bf16 != 0 && bf16 != 1) return -1;
    return paged_decode(out, q, q_stride, k_cache, v_cache, bf16 ? KV_BF16 : KV_F32, tables, table_stride, context,
                        batch, hq, hk, d, block_size, scale, window, sinks, softcap, threads);
}

/* dop_paged_decode over q8_0 caches: int8 codes k_codes / v_codes [blocks, bs, Hk, d] and their
 * float16 scales k_scales / v_scales [blocks, bs, Hk, d / 32] (d a multiple of 32). */
int dop_paged_decode_q8(float *out, const float *q, int64_t q_stride, const int8_t *k_codes,
                        const uint16_t *k_scales, const int8_t *v_codes, const uint16_t *v_scales,
                        const int64_t *tables, int64_t table_stride, const int64_t *context, int batch, int hq,
                        int hk, int d, int block_size, float scale, int64_t window, const float *sinks,
                        float softcap, int threads) {
    const kv_q8 k = {k_codes, k_scales}, v = {v_codes, v_scales};
    return paged_decode(out, q, q_stride, &k, &v, KV_Q8, tables, table_stride, context, batch, hq, hk, d, block_size,
                        scale, window, sinks, softcap, threads);
}
