/* Tiled (flash-attention style) prefill attention over the paged KV cache, float32 maths over
 * float32, bfloat16 or q8_0 caches (ap_paged_prefill_q8: each tile dequantized exactly as it
 * loads, so the bits of ap_paged_prefill over the dequantized float32 cache); the same source builds the AVX512F and the AVX2 + FMA variant over
 * metrale_cpu_math.h's vectors (MT_LANES = 16 or 8 float lanes).
 *
 * Owner: metrale_core.layers.ops.PagedAttentionPrefill (its forward_cpu; attention.py's
 * attend_prefill is the oracle it is tested against, to float32 rounding).
 *
 * Work items are (segment, KV head, tile of query rows).  An item holds its rows' G query heads
 * as "queries" m = row * G + g, transposed so one vector holds MT_LANES queries, and walks the
 * key tiles [t * KT, (t + 1) * KT) that any of its rows can see, loading each K / V tile once
 * from the paged cache (widened to float32) for all of its queries.  Per query it keeps the
 * running maximum, sum and accumulator of an online softmax: no score matrix larger than
 * KT x queries, no [T, T] matrix.  A row at absolute position p sees positions
 * max(0, p - W + 1) .. p (window W; W = 0: 0 .. p).  softcap > 0 caps each score at
 * softcap * tanh(score / softcap) before the softmax (Gemma 2); sinks [Hq] (NULL: none) add one
 * logit with no value to each query head's softmax (gpt-oss).
 *
 * Invariants:
 * - Batch invariance: a query's result depends only on its own query vector, its position, the
 *   window and the cache -- not on the other rows of the call, its segment's length, the query
 *   tile it falls in or the thread count.  Key tiles have absolute boundaries; every score is one
 *   fixed-order sum over d; a query's state is updated only for the tiles it sees (rows that see
 *   none of a tile are skipped, and a lane whose row sees none of it keeps its state bit for bit:
 *   alpha is exactly 1, or 0 over a zero state), with the same operations in every blocking of
 *   the loops.  A tile's loops cover the keys some row of the item sees (so a row may meet more
 *   or fewer keys it does not see in another call), and keys a row does not see enter its sums
 *   as exact zeros (probability 0, max -inf, 0 * v): they can change the sign of an exact zero
 *   in the accumulator, nothing else.
 * - Positions at or past a segment's context, and positions before the window of an item's first
 *   row, are never read (the tile buffers hold zeros there): their blocks may be padding or
 *   released (the block manager's windowed groups).
 * - head_dim is a multiple of 16 up to 256, Hq a multiple of Hk, contexts below 2^24 positions
 *   (positions are compared as exact floats); the entry point returns 0, or -1 for arguments it
 *   cannot take (the Python side checks first and routes such calls to the torch path).  The
 *   signature is attention_prefill.h's.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_prefill.h"
#include "metrale_cpu_math.h"
#include "metrale_paged_kv.h"

#define KT 64                            /* key positions per tile (tiles start at multiples of KT) */
#define TARGET_QUERIES 128               /* queries (rows x G) per work item, about */
#define MIN_ROWS 8                       /* fewest query rows per work item */
#define MAX_ROWS 64                      /* most query rows per work item */
#define KR (MT_LANES == 16 ? 4 : 2)      /* keys per score block */
#define QB 4                             /* query vectors per score block */
#define MR (MT_LANES == 16 ? 4 : 2)      /* queries per P @ V block */
#define DB 4                             /* head-dim vectors per P @ V block */
#define MAX_POSITION (1 << 24)           /* positions are exact as floats below this */

/* Per-lane selections; the only ISA-specific code here. */
#if MT_LANES == 16
/* Lanes where lo <= kp <= hi. */
static inline mt_mask visible(mt_vf kp, mt_vf lo, mt_vf hi) {
    return _mm512_cmp_ps_mask(lo, kp, _CMP_LE_OQ) & _mm512_cmp_ps_mask(kp, hi, _CMP_LE_OQ);
}
/* m ? a : b per lane. */
static inline mt_vf select(mt_mask m, mt_vf a, mt_vf b) { return _mm512_mask_mov_ps(b, m, a); }
static inline mt_mask is_neg_inf(mt_vf x) { return _mm512_cmp_ps_mask(x, mt_set1(-INFINITY), _CMP_EQ_OQ); }
#else
static inline mt_mask visible(mt_vf kp, mt_vf lo, mt_vf hi) {
    return _mm256_castps_si256(_mm256_and_ps(_mm256_cmp_ps(lo, kp, _CMP_LE_OQ), _mm256_cmp_ps(kp, hi, _CMP_LE_OQ)));
}
static inline mt_vf select(mt_mask m, mt_vf a, mt_vf b) { return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m)); }
static inline mt_mask is_neg_inf(mt_vf x) {
    return _mm256_castps_si256(_mm256_cmp_ps(x, mt_set1(-INFINITY), _CMP_EQ_OQ));
}
#endif

/* Scores of keys j0 .. j0 + KR against nq query vectors: st[k][b] = sum_i kb[k][i] * qt[i][b],
 * the sum over i in order from 0 (one fused multiply-add per step) whatever nq is.  st and qt have
 * row stride ms floats, kb row stride d. */
static inline __attribute__((always_inline)) void score_block(float *st, int64_t ms, const float *qt,
                                                              const float *kb, int d, const int nq) {
    mt_vf acc[KR][QB];
    for (int k = 0; k < KR; k++)
        for (int b = 0; b < nq; b++) acc[k][b] = mt_zero();
    for (int i = 0; i < d; i++) {
        mt_vf qv[QB];
        for (int b = 0; b < nq; b++) qv[b] = mt_load(qt + i * ms + b * MT_LANES);
        for (int k = 0; k < KR; k++) {
            const mt_vf kv = mt_set1(kb[k * d + i]);
            for (int b = 0; b < nq; b++) acc[k][b] = mt_fmadd(kv, qv[b], acc[k][b]);
        }
    }
    for (int k = 0; k < KR; k++)
        for (int b = 0; b < nq; b++) mt_store(st + k * ms + b * MT_LANES, acc[k][b]);
}

/* st[j][v * L ..] for the keys j in [js, je) of the tile (multiples of KR) and query vectors
 * [va, vb). */
static void scores(float *st, int64_t ms, const float *qt, const float *kb, int d, int js, int je, int va, int vb) {
    for (int v = va; v < vb; v += QB) {
        const int nq = vb - v < QB ? vb - v : QB;
        for (int j = js; j < je; j += KR) {
            float *s = st + j * ms + v * MT_LANES;
            const float *qv = qt + v * MT_LANES, *kv = kb + j * d;
            switch (nq) {
                case 1: score_block(s, ms, qv, kv, d, 1); break;
                case 2: score_block(s, ms, qv, kv, d, 2); break;
                case 3: score_block(s, ms, qv, kv, d, 3); break;
                default: score_block(s, ms, qv, kv, d, QB); break;
            }
        }
    }
}

/* Per-query state of one work item (arrays of mpad floats, one lane per query). */
typedef struct {
    float *pos;    /* absolute position of the query's row (-1 on padding lanes: sees nothing) */
    float *lo;     /* first position it sees */
    float *mx;     /* running maximum score (-inf before its first visible key) */
    float *sum;    /* running sum of exp(score - mx) */
    float *alpha;  /* this tile's rescale factor exp(old mx - new mx) */
    float *vmin_pos, *vmax_lo; /* per query vector: the least pos and the greatest lo of its lanes */
} qstate;

/* Online softmax over keys [js, je) of one tile (the others are seen by no query of the item)
 * for query vectors [va, vb): scores in st become probabilities exp(s - mx) (0 where not
 * visible) and each lane's mx / sum / alpha advance.  A tile every lane of a vector sees whole
 * skips the masks (same values). */
static void softmax_tile(float *st, int64_t ms, const qstate *qs, int js, int je, int va, int vb, int64_t t0) {
    const mt_vf neg_inf = mt_set1(-INFINITY);
    for (int v = va; v < vb; v++) {
        const int64_t o = (int64_t)v * MT_LANES;
        const mt_vf hi = mt_load(qs->pos + o), lo = mt_load(qs->lo + o);
        const int whole = qs->vmin_pos[v] >= (float)(t0 + KT - 1) && qs->vmax_lo[v] <= (float)t0;
        mt_vf tmax = neg_inf;
        for (int j = js; j < je; j++) {
            const mt_vf s = mt_load(st + j * ms + o);
            tmax = mt_max(tmax, whole ? s : select(visible(mt_set1((float)(t0 + j)), lo, hi), s, neg_inf));
        }
        const mt_vf old = mt_load(qs->mx + o), top = mt_max(old, tmax);
        const mt_vf alpha = select(is_neg_inf(old), mt_zero(), mt_exp(mt_sub(old, top)));
        mt_vf sum = mt_zero();
        for (int j = js; j < je; j++) {
            mt_vf e = mt_exp(mt_sub(mt_load(st + j * ms + o), top));
            if (!whole) e = mt_maskz_mov(visible(mt_set1((float)(t0 + j)), lo, hi), e);
            mt_store(st + j * ms + o, e);
            sum = mt_add(sum, e);
        }
        mt_store(qs->sum + o, mt_add(mt_mul(mt_load(qs->sum + o), alpha), sum));
        mt_store(qs->mx + o, top);
        mt_store(qs->alpha + o, alpha);
    }
}

/* acc[r][c0 ..] = acc[r][c0 ..] * alpha[r] + sum_j p[j][r] v[j][c0 ..] over keys [js, je) for
 * nr queries and nd head-dim vectors from column c0: per element one product, then one fused
 * multiply-add per key in key order, whatever nr and nd are.  acc has row stride d, p (the tile's probabilities) row stride
 * ms, vb (the V tile) row stride d. */
static inline __attribute__((always_inline)) void pv_block(float *acc, int d, const float *p, int64_t ms,
                                                           const float *alpha, const float *vb, int js, int je,
                                                           int c0, const int nr, const int nd) {
    mt_vf a[MR][DB];
    for (int r = 0; r < nr; r++) {
        const mt_vf al = mt_set1(alpha[r]);
        for (int b = 0; b < nd; b++) a[r][b] = mt_mul(mt_load(acc + r * d + c0 + b * MT_LANES), al);
    }
    for (int j = js; j < je; j++) {
        mt_vf vv[DB];
        for (int b = 0; b < nd; b++) vv[b] = mt_load(vb + j * d + c0 + b * MT_LANES);
        for (int r = 0; r < nr; r++) {
            const mt_vf pj = mt_set1(p[j * ms + r]);
            for (int b = 0; b < nd; b++) a[r][b] = mt_fmadd(pj, vv[b], a[r][b]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nd; b++) mt_store(acc + r * d + c0 + b * MT_LANES, a[r][b]);
}

#define PV_COLUMNS(NR)                                                                             \
    for (int c = 0; c < d; c += DB * MT_LANES) {                                                   \
        const int nd = (d - c) / MT_LANES < DB ? (d - c) / MT_LANES : DB;                          \
        switch (nd) {                                                                              \
            case 1: pv_block(acc + m * d, d, st + m, ms, alpha + m, vb, js, je, c, NR, 1); break;          \
            case 2: pv_block(acc + m * d, d, st + m, ms, alpha + m, vb, js, je, c, NR, 2); break;          \
            case 3: pv_block(acc + m * d, d, st + m, ms, alpha + m, vb, js, je, c, NR, 3); break;          \
            default: pv_block(acc + m * d, d, st + m, ms, alpha + m, vb, js, je, c, NR, DB); break;        \
        }                                                                                          \
    }

/* The tile's P @ V over keys [js, je) into the accumulators of queries [ma, mb). */
static void pv(float *acc, int d, const float *st, int64_t ms, const float *alpha, const float *vb, int js, int je,
               int ma, int mb) {
    int m = ma;
    for (; m + MR <= mb; m += MR) { PV_COLUMNS(MR) }
    for (; m < mb; m++) { PV_COLUMNS(1) }
}

/* Cache rows js .. je of the tile at position t0, KV head h, as float32 [KT, d]: zeros outside
 * [first, context), whose blocks may be gone (past the context, or slid out of every window:
 * NULL_BLOCK table entries). */
static void load_tile(float *dst, const void *cache, int kind, const int64_t *table, int64_t t0, int js, int je,
                      int64_t first, int64_t context, int block_size, int hk, int h, int d) {
    for (int j = js; j < je; j++) {
        float *row = dst + j * d;
        if (t0 + j < first || t0 + j >= context) {
            memset(row, 0, sizeof(float) * (size_t)d);
            continue;
        }
        const int64_t e = cache_row(table, t0 + j, block_size, hk, h, d);
        for (int c = 0; c < d; c += MT_LANES) mt_store(row + c, load_cache(cache, e + c, kind));
    }
}

/* One work item: rows r0 .. r0 + n of the call, at positions p0 .. p0 + n of the sequence whose
 * table is given, KV head h. */
typedef struct {
    int64_t row, pos, context, seq;
    int n, h;
} work_item;

/* The buffers of one thread, sized for the largest item. */
typedef struct {
    float *qt, *acc, *st, *kb, *vb;
    qstate qs;
} workspace;

static float *carve(float **p, size_t n) {
    float *out = *p;
    *p += (n + 15) / 16 * 16;
    return out;
}

static float *workspace_alloc(workspace *w, int mpad, int d) {
    const size_t v = (size_t)mpad / MT_LANES;
    const size_t total = (size_t)(((d * (size_t)mpad + 15) / 16 * 16) * 2 + KT * (size_t)mpad + 2 * KT * (size_t)d +
                                  5 * ((mpad + 15) / 16 * 16) + 2 * ((v + 15) / 16 * 16));
    float *base = aligned_alloc(64, (total * sizeof(float) + 63) / 64 * 64);
    if (base == NULL) return NULL;
    float *p = base;
    w->qt = carve(&p, (size_t)d * mpad);
    w->acc = carve(&p, (size_t)d * mpad);
    w->st = carve(&p, (size_t)KT * mpad);
    w->kb = carve(&p, (size_t)KT * d);
    w->vb = carve(&p, (size_t)KT * d);
    w->qs.pos = carve(&p, mpad);
    w->qs.lo = carve(&p, mpad);
    w->qs.mx = carve(&p, mpad);
    w->qs.sum = carve(&p, mpad);
    w->qs.alpha = carve(&p, mpad);
    w->qs.vmin_pos = carve(&p, v);
    w->qs.vmax_lo = carve(&p, v);
    return base;
}

typedef struct {
    float *out;
    int64_t out_stride;
    const float *q;
    int64_t q_stride;
    const void *k_cache, *v_cache;
    int kind; /* KV_F32, KV_BF16 or KV_Q8 (the caches point at kv_q8 records) */
    const int64_t *tables;
    int64_t table_stride;
    int g, hk, d, block_size;
    int64_t window;
    float scale, softcap;
    const float *sinks;
} call_args;

static void attend_item(const call_args *a, const work_item *it, workspace *w) {
    const int g = a->g, d = a->d, n = it->n, m_count = n * g;
    const int mpad = (m_count + MT_LANES - 1) / MT_LANES * MT_LANES, nv = mpad / MT_LANES;
    const int64_t ms = mpad, p0 = it->pos, W = a->window;
    const int64_t *table = a->tables + it->seq * a->table_stride;
    qstate *qs = &w->qs;
    /* queries m = r * g + j, transposed and scaled; padding lanes are zero and see nothing */
    for (int m = 0; m < mpad; m++) {
        const int r = m / g, j = m % g;
        if (m < m_count) {
            const float *src = a->q + (it->row + r) * a->q_stride + ((int64_t)it->h * g + j) * d;
            for (int i = 0; i < d; i++) w->qt[i * ms + m] = src[i] * a->scale;
            qs->pos[m] = (float)(p0 + r);
            qs->lo[m] = W > 0 ? (float)(p0 + r - W + 1) : 0.0f;
        } else {
            for (int i = 0; i < d; i++) w->qt[i * ms + m] = 0.0f;
            qs->pos[m] = -1.0f;
            qs->lo[m] = 0.0f;
        }
        qs->mx[m] = -INFINITY;
        qs->sum[m] = 0.0f;
    }
    for (int v = 0; v < nv; v++) {
        float least = qs->pos[v * MT_LANES], most = qs->lo[v * MT_LANES];
        for (int l = 1; l < MT_LANES; l++) {
            least = qs->pos[v * MT_LANES + l] < least ? qs->pos[v * MT_LANES + l] : least;
            most = qs->lo[v * MT_LANES + l] > most ? qs->lo[v * MT_LANES + l] : most;
        }
        qs->vmin_pos[v] = least;
        qs->vmax_lo[v] = most;
    }
    memset(w->acc, 0, sizeof(float) * (size_t)mpad * d);
    const int64_t first = W > 0 && p0 - W + 1 > 0 ? p0 - W + 1 : 0, last = p0 + n - 1;
    for (int64_t t0 = first / KT * KT; t0 <= last; t0 += KT) {
        /* rows that see some of the tile: p >= t0 and p - W + 1 <= t0 + KT - 1 */
        const int64_t ra = t0 - p0 > 0 ? t0 - p0 : 0;
        const int64_t rb = W > 0 && t0 + KT + W - 1 - p0 < n ? t0 + KT + W - 1 - p0 : n;
        if (ra >= rb) continue;
        const int ma = (int)ra * g, mb = (int)rb * g;
        const int va = ma / MT_LANES, vb = (mb + MT_LANES - 1) / MT_LANES;
        /* keys some row of the item sees, widened to whole score blocks */
        const int js = first > t0 ? (int)(first - t0) / KR * KR : 0;
        const int je = last + 1 - t0 < KT ? ((int)(last + 1 - t0) + KR - 1) / KR * KR : KT;
        load_tile(w->kb, a->k_cache, a->kind, table, t0, js, je, first, it->context, a->block_size, a->hk, it->h, d);
        load_tile(w->vb, a->v_cache, a->kind, table, t0, js, je, first, it->context, a->block_size, a->hk, it->h, d);
        scores(w->st, ms, w->qt, w->kb, d, js, je, va, vb);
        if (a->softcap > 0.0f)
            for (int j = js; j < je; j++) kv_softcap(w->st + j * ms + va * MT_LANES, (int64_t)(vb - va) * MT_LANES, a->softcap);
        softmax_tile(w->st, ms, qs, js, je, va, vb, t0);
        pv(w->acc, d, w->st, ms, qs->alpha, w->vb, js, je, ma, mb);
    }
    for (int m = 0; m < m_count; m++) {
        const int r = m / g, j = m % g;
        float *dst = a->out + (it->row + r) * a->out_stride + ((int64_t)it->h * g + j) * d;
        const float sink = a->sinks != NULL ? expf(a->sinks[(int64_t)it->h * g + j] - qs->mx[m]) : 0.0f;
        const mt_vf total = mt_set1(qs->sum[m] + sink);
        for (int c = 0; c < d; c += MT_LANES) mt_store(dst + c, mt_div(mt_load(w->acc + m * d + c), total));
    }
}

/* Heaviest items first (the last rows of long contexts), so the dynamic schedule ends evenly. */
static int heavier_first(const void *x, const void *y) {
    const work_item *a = x, *b = y;
    const int64_t wa = a->pos + a->n, wb = b->pos + b->n;
    return wa != wb ? (wa < wb ? 1 : -1) : (a->row != b->row ? (a->row < b->row ? -1 : 1) : a->h - b->h);
}

static int64_t count_items(const int64_t *segments, int num_segments, int rows, int hk) {
    int64_t items = 0;
    for (int s = 0; s < num_segments; s++) items += (segments[4 * s + 1] - segments[4 * s] + rows - 1) / rows * hk;
    return items;
}

static int paged_prefill(float *out, int64_t out_stride, const float *q, int64_t q_stride, const void *k_cache,
                         const void *v_cache, int kind, const int64_t *tables, int64_t table_stride,
                         const int64_t *segments, int num_segments, int hq, int hk, int d, int block_size,
                         int64_t window, float scale, float softcap, const float *sinks, int threads) {
    if (num_segments < 0 || hk <= 0 || hq <= 0 || hq % hk || d <= 0 || d % (kind == KV_Q8 ? KV_Q8_GROUP : 16) ||
        d > 256 || block_size <= 0 || window < 0 || softcap < 0.0f || threads <= 0)
        return -1;
    for (int s = 0; s < num_segments; s++) {
        const int64_t *seg = segments + 4 * s, n = seg[1] - seg[0];
        if (seg[0] < 0 || n < 1 || seg[2] < 0 || seg[3] < n || seg[3] >= MAX_POSITION) return -1;
    }
    const int g = hq / hk;
    int rows = TARGET_QUERIES / g < MIN_ROWS ? MIN_ROWS : (TARGET_QUERIES / g > MAX_ROWS ? MAX_ROWS : TARGET_QUERIES / g);
    while (rows > MIN_ROWS && count_items(segments, num_segments, rows, hk) < 2 * (int64_t)threads)
        rows = rows / 2 < MIN_ROWS ? MIN_ROWS : rows / 2;
    const int64_t count = count_items(segments, num_segments, rows, hk);
    if (count == 0) return 0;
    work_item *items = malloc(sizeof(work_item) * (size_t)count);
    if (items == NULL) return -1;
    int64_t k = 0;
    for (int s = 0; s < num_segments; s++) {
        const int64_t *seg = segments + 4 * s, n = seg[1] - seg[0];
        for (int64_t r = 0; r < n; r += rows)
            for (int h = 0; h < hk; h++)
                items[k++] = (work_item){seg[0] + r, seg[3] - n + r, seg[3], seg[2], (int)(n - r < rows ? n - r : rows), h};
    }
    qsort(items, (size_t)count, sizeof(work_item), heavier_first);
    const call_args args = {out, out_stride, q, q_stride, k_cache, v_cache, kind, tables, table_stride,
                            g, hk, d, block_size, window, scale, softcap, sinks};
    const int mpad = (rows * g + MT_LANES - 1) / MT_LANES * MT_LANES;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        workspace w = {0};
        float *base = workspace_alloc(&w, mpad, d);
        if (base == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < count; i++)
            if (base != NULL) attend_item(&args, &items[i], &w);
        free(base);
    }
    free(items);
    return failed ? -1 : 0;
}

int ap_paged_prefill(float *out, int64_t out_stride, const float *q, int64_t q_stride, const void *k_cache,
                     const void *v_cache, int bf16, const int64_t *tables, int64_t table_stride,
                     const int64_t *segments, int num_segments, int hq, int hk, int d, int block_size,
                     int64_t window, float scale, float softcap, const float *sinks, int threads) {
    if (bf16 != 0 && bf16 != 1) return -1;
    return paged_prefill(out, out_stride, q, q_stride, k_cache, v_cache, bf16 ? KV_BF16 : KV_F32, tables,
                         table_stride, segments, num_segments, hq, hk, d, block_size, window, scale, softcap, sinks,
                         threads);
}

int ap_paged_prefill_q8(float *out, int64_t out_stride, const float *q, int64_t q_stride, const int8_t *k_codes,
                        const uint16_t *k_scales, const int8_t *v_codes, const uint16_t *v_scales,
                        const int64_t *tables, int64_t table_stride, const int64_t *segments, int num_segments,
                        int hq, int hk, int d, int block_size, int64_t window, float scale, float softcap,
                        const float *sinks, int threads) {
    const kv_q8 k = {k_codes, k_scales}, v = {v_codes, v_scales};
    return paged_prefill(out, out_stride, q, q_stride, &k, &v, KV_Q8, tables, table_stride, segments, num_segments,
                         hq, hk, d, block_size, window, scale, softcap, sinks, threads);
}
