/* GGUF block kernels: y[R, N] = x[R, K] @ W[N, K]^T for the GGUF types whose blocks are not
 * qmatmul.c's (Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, IQ4_NL, IQ4_XS, and Q2_K / Q3_K repacked), on AVX2,
 * and in the AVX512 variant of the library with AVX512-VNNI tiles (tile_rows_vnni) over the same
 * records and the same activation quantization, giving the same bits.
 *
 * Owner: metrale_core.layers.gguf_linear (repacks a GGUF tensor into the layout below and calls
 * mq_gguf_linear); metrale_core.kernels.cpu builds it with the package's other C files.
 *
 * Every GGUF type above is, per output channel n and sub-block of S = 32 (or 16) weights along K,
 *     W[n, k] = d[n, s] * q[n, k] + m[n, s]
 * with small integer codes q and float32 d, m that are exact products of the file's fp16 scales
 * and its 4..8-bit sub-block scales (an 11-bit mantissa times an 8-bit integer fits float32's
 * 24).  A kind (see mq_gguf_record_bytes) fixes: CODE = 4 (unsigned nibbles 0..15) or 8 (signed
 * int8), S = 32 or 16, and whether m is present (0 for symmetric types).
 *
 * Activations are quantized per row and block of 32.  Coarse (fine = 0): to int8 as llama.cpp's
 * Q8_0/Q8_1 do (qa = round(x / da), da = max|x| / 127).  Fine (fine = 1, the default of
 * format auto): to 15 bits, qa = 255 * hi + lo with int8 hi, lo and da = max|x| / (127 * 255),
 * so each dot product is two int8 ones, 255 * (q . hi) + (q . lo): twice the integer work, the
 * same weight bytes, and activations 255x finer (close greedy calls no longer flip on them).
 * sa = da * sum(qa) over the sub-block.  Then
 *     y[r, n] = sum_b sum_s  d[n, s] * da[r, b] * (q[n, s, :] . qa[r, s, :])  +  m[n, s] * sa[r, s]
 * with exact int32 dot products (vpmaddubsw / vpmaddwd).
 *
 * Layout: output channels in tiles of 16, each tile a run of K/32 records, one per block of 32:
 *   codes   CODE 4: 256 bytes, byte j*64 + c*4 + i = q[c, 4j + i] | q[c, 4(j+4) + i] << 4 (j < 4)
 *           CODE 8: 512 bytes, byte g*64 + c*4 + i = q[c, 4g + i] as int8                (g < 8)
 *   d       float32 [32 / S][16]   (sub-block s of 16 channels c)
 *   m       float32 [32 / S][16]   (only when the kind has m)
 *
 * Batch invariance: each (row, channel) result is computed by one thread, in one fixed order
 * (blocks ascending, sub-blocks ascending, d-term then m-term by FMA), whatever R is and
 * whichever rows share a call; threads split the channel tiles, never K.
 *
 * Invariants: K % 32 == 0, N % 16 == 0; x and y float32, row-major, contiguous; scratch of
 * mq_gguf_scratch_bytes(R, K) bytes; signatures in gguf_qmatmul.h.
 */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale_cpu_math.h"
#include "gguf_qmatmul.h"
#include "metrale_qmatmul_tiles.h"

#define QK 32
#define TILE 16
#define GROUP MQ_TILE_ROWS
#define PREFETCH 8

/* kind = (code bits, sub-block size, has m) */
enum { K_U4_32_M = 0, K_S8_32 = 1, K_S8_32_M = 2, K_S8_16 = 3, K_S8_16_M = 4, N_KINDS = 5 };

static inline int kind_bits(int kind) { return kind == K_U4_32_M ? 4 : 8; }
static inline int kind_subs(int kind) { return kind >= K_S8_16 ? 2 : 1; }
static inline int kind_has_m(int kind) { return kind == K_U4_32_M || kind == K_S8_32_M || kind == K_S8_16_M; }

int mq_gguf_record_bytes(int kind) {
    if (kind < 0 || kind >= N_KINDS) return -1;
    return (kind_bits(kind) == 4 ? 256 : 512) + 64 * kind_subs(kind) * (1 + kind_has_m(kind));
}

size_t mq_gguf_scratch_bytes(int R, int K) {
    return 2 * (size_t)R * K + 4 * sizeof(float) * (size_t)R * (K / QK) + 128;
}

/* Activations per block of 32 (see the header): hi = round(t), t = x * 127 / amax, and with `fine`
 * lo = clamp(round(255 t) - 255 hi, -127, 127); the scale da = amax / 127 (coarse) or
 * amax / (127 * 255) (fine), and sa32 / sa16 = da * the sub-block sums of the codes (hi, or
 * 255 hi + lo) -- IEEE division, round to nearest even, as gguf_linear.quantize_activations.
 * With `flip` the stored codes are hi ^ 0x80 and lo ^ 0x80 (hi + 128, lo + 128 as unsigned bytes:
 * the VNNI tiles' operand for signed 8-bit weights); the sums are of the codes themselves. */
static void quantize_row(const float *x, int K, int fine, int flip, int8_t *hi, int8_t *lo, float *da,
                         float *sa32, float *sa16) {
    const __m256i sign = _mm256_set1_epi8((char)0x80);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), n255 = _mm256_set1_epi32(255);
    const __m256i lo_min = _mm256_set1_epi32(-127), lo_max = _mm256_set1_epi32(127);
    for (int b = 0; b < K / QK; b++) {
        __m256 v[4];
        const float amax = mt256_load32_amax(x + b * QK, v);
        const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i q[4], r[4], code[4];
        for (int i = 0; i < 4; i++) {
            const __m256 t = _mm256_mul_ps(v[i], id);
            q[i] = _mm256_cvtps_epi32(t);  /* round to nearest even */
            code[i] = q[i];
            if (fine) {
                const __m256i full = _mm256_cvtps_epi32(_mm256_mul_ps(t, _mm256_set1_ps(255.0f)));
                r[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_sub_epi32(full, _mm256_mullo_epi32(q[i], n255)),
                                                         lo_min), lo_max);
                code[i] = _mm256_add_epi32(_mm256_mullo_epi32(q[i], n255), r[i]);
            }
        }
        const int s0 = mt256_reduce_add_epi32(_mm256_add_epi32(code[0], code[1]));
        const int s1 = mt256_reduce_add_epi32(_mm256_add_epi32(code[2], code[3]));
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        __m256i out = _mm256_permutevar8x32_epi32(packed, order);
        _mm256_storeu_si256((__m256i *)(hi + b * QK), flip ? _mm256_xor_si256(out, sign) : out);
        if (fine) {
            const __m256i lp = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
            out = _mm256_permutevar8x32_epi32(lp, order);
            _mm256_storeu_si256((__m256i *)(lo + b * QK), flip ? _mm256_xor_si256(out, sign) : out);
        }
        const float d = amax / (fine ? 32385.0f : 127.0f);
        da[b] = d;
        sa32[b] = d * (float)(s0 + s1);
        sa16[2 * b] = d * (float)s0;
        sa16[2 * b + 1] = d * (float)s1;
    }
}

/* `rows` (<= GROUP) activation rows times one tile of 16 channels, in two halves of 8 channels;
 * inlined with constant kind / rows so the loops unroll. */
static inline __attribute__((always_inline)) void tile_rows(
        const uint8_t *rec, int nb, int kind, int fine, const int8_t *qa, const int8_t *ql, const float *da,
        const float *sa32, const float *sa16, int K, int rows, float *y, int ldy) {
    const int bits = kind_bits(kind), subs = kind_subs(kind), has_m = kind_has_m(kind);
    const int record = mq_gguf_record_bytes(kind), codes = bits == 4 ? 256 : 512;
    __m256 f[GROUP][2];
    for (int r = 0; r < rows; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = rec + (size_t)b * record;
        for (int line = 0; line < record; line += 64)
            _mm_prefetch((const char *)(p + PREFETCH * record + line), _MM_HINT_T0);
        const float *sc = (const float *)(p + codes);
        for (int h = 0; h < 2; h++) {
            __m256i w[8];
            mt256_load_codes(p, bits, h, w);
            __m256 dw[2], mw[2];
            for (int s = 0; s < subs; s++) {
                dw[s] = _mm256_loadu_ps(sc + 16 * s + 8 * h);
                if (has_m) mw[s] = _mm256_loadu_ps(sc + 16 * subs + 16 * s + 8 * h);
            }
            for (int r = 0; r < rows; r++) {
                const int8_t *q = qa + (size_t)r * K + b * QK;
                __m256i dot[2];
                for (int s = 0; s < subs; s++) {
                    const int g0 = s * 8 / subs, g1 = (s + 1) * 8 / subs;
                    dot[s] = mt256_codes_dot(w, q, bits, g0, g1);
                    if (fine)  /* 255 * dot(hi) + dot(lo): |.| < 2^31 */
                        dot[s] = _mm256_add_epi32(_mm256_mullo_epi32(dot[s], _mm256_set1_epi32(255)),
                                                  mt256_codes_dot(w, ql + (size_t)r * K + b * QK, bits, g0, g1));
                }
                const int at = r * nb + b;
                const __m256 a = _mm256_set1_ps(da[at]);
                for (int s = 0; s < subs; s++) {
                    f[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[s]), _mm256_mul_ps(dw[s], a), f[r][h]);
                    if (has_m) {
                        const float sm = subs == 1 ? sa32[at] : sa16[2 * at + s];
                        f[r][h] = _mm256_fmadd_ps(mw[s], _mm256_set1_ps(sm), f[r][h]);
                    }
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_ps(y + (size_t)r * ldy, f[r][0]);
        _mm256_storeu_ps(y + (size_t)r * ldy + 8, f[r][1]);
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* The AVX512-VNNI tile: all 16 channels of a record line in one 512-bit vector, one vpdpbusd per
 * group of 4 k (u8 x s8 into int32).  4-bit codes are the unsigned operand as they are; for
 * signed 8-bit codes the activations are the unsigned operand, offset by 128 (stored as a ^ 0x80
 * by quantize_row, so the tile spends no instruction on it), and
 * 128 * (the sub-block's code sum, one more vpdpbusd per group, shared by the rows) is taken off.
 * The int32 dot products are the AVX2 tile's exactly, and the float steps are the same ones per
 * lane in the same order, so both variants give the same bits. */
static inline __attribute__((always_inline)) __m512i sub_dot_vnni(const __m512i w[8], const int8_t *q, int bits,
                                                                   int g0, int g1, __m512i wsum) {
    __m512i acc = _mm512_setzero_si512();
    if (bits == 4) {
        for (int g = g0; g < g1; g++) acc = _mm512_dpbusd_epi32(acc, w[g], mt512_bcast4(q + 4 * g));
        return acc;
    }
    for (int g = g0; g < g1; g++) acc = _mm512_dpbusd_epi32(acc, mt512_bcast4(q + 4 * g), w[g]);  /* q: a ^ 0x80 */
    return _mm512_sub_epi32(acc, _mm512_slli_epi32(wsum, 7));
}

static inline __attribute__((always_inline)) void tile_rows_vnni(
        const uint8_t *rec, int nb, int kind, int fine, const int8_t *qa, const int8_t *ql, const float *da,
        const float *sa32, const float *sa16, int K, int rows, float *y, int ldy) {
    const int bits = kind_bits(kind), subs = kind_subs(kind), has_m = kind_has_m(kind);
    const int record = mq_gguf_record_bytes(kind), codes = bits == 4 ? 256 : 512;
    const __m512i low4 = _mm512_set1_epi8(0x0F), ones = _mm512_set1_epi8(1);
    __m512 f[GROUP];
    for (int r = 0; r < rows; r++) f[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = rec + (size_t)b * record;
        for (int line = 0; line < record; line += 64)
            _mm_prefetch((const char *)(p + PREFETCH * record + line), _MM_HINT_T0);
        const float *sc = (const float *)(p + codes);
        __m512i w[8], wsum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        if (bits == 4) {
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512((const void *)(p + 64 * j));
                w[j] = _mm512_and_si512(v, low4);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
        } else {
            for (int g = 0; g < 8; g++) {
                w[g] = _mm512_loadu_si512((const void *)(p + 64 * g));
                wsum[g * subs / 8] = _mm512_dpbusd_epi32(wsum[g * subs / 8], ones, w[g]);
            }
        }
        __m512 dw[2], mw[2];
        for (int s = 0; s < subs; s++) {
            dw[s] = _mm512_loadu_ps(sc + 16 * s);
            if (has_m) mw[s] = _mm512_loadu_ps(sc + 16 * subs + 16 * s);
        }
        for (int r = 0; r < rows; r++) {
            const int8_t *q = qa + (size_t)r * K + b * QK;
            __m512i dot[2];
            for (int s = 0; s < subs; s++) {
                const int g0 = s * 8 / subs, g1 = (s + 1) * 8 / subs;
                dot[s] = sub_dot_vnni(w, q, bits, g0, g1, wsum[s]);
                if (fine)  /* 255 * dot(hi) + dot(lo): |.| < 2^31 */
                    dot[s] = _mm512_add_epi32(_mm512_mullo_epi32(dot[s], _mm512_set1_epi32(255)),
                                              sub_dot_vnni(w, ql + (size_t)r * K + b * QK, bits, g0, g1, wsum[s]));
            }
            const int at = r * nb + b;
            const __m512 a = _mm512_set1_ps(da[at]);
            for (int s = 0; s < subs; s++) {
                f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[s]), _mm512_mul_ps(dw[s], a), f[r]);
                if (has_m) {
                    const float sm = subs == 1 ? sa32[at] : sa16[2 * at + s];
                    f[r] = _mm512_fmadd_ps(mw[s], _mm512_set1_ps(sm), f[r]);
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, f[r]);
}
#define TILE_ROWS tile_rows_vnni
#define FLIP_S8 1  /* 8-bit kinds: activations stored offset by 128 (see quantize_row) */
#else
#define TILE_ROWS tile_rows
#define FLIP_S8 0
#endif

#define MQ_TILE_ARGS const uint8_t *rec, int nb, const int8_t *qa, const int8_t *ql, const float *da, \
                     const float *sa32, const float *sa16, int K, float *y, int ldy
/* KIND = kind + N_KINDS * fine */
#define MQ_TILE_BODY(KIND, ROWS) \
    TILE_ROWS(rec, nb, (KIND) % N_KINDS, (KIND) / N_KINDS, qa, ql, da, sa32, sa16, K, ROWS, y, ldy)
MQ_TILE_FNS(gguf_tile, 0) MQ_TILE_FNS(gguf_tile, 1) MQ_TILE_FNS(gguf_tile, 2) MQ_TILE_FNS(gguf_tile, 3)
MQ_TILE_FNS(gguf_tile, 4) MQ_TILE_FNS(gguf_tile, 5) MQ_TILE_FNS(gguf_tile, 6) MQ_TILE_FNS(gguf_tile, 7)
MQ_TILE_FNS(gguf_tile, 8) MQ_TILE_FNS(gguf_tile, 9)

typedef void (*gguf_tile_fn)(MQ_TILE_ARGS);
static const gguf_tile_fn gguf_tile_table[2 * N_KINDS][MQ_TILE_ROWS] = {
    MQ_TILE_ROW(gguf_tile, 0), MQ_TILE_ROW(gguf_tile, 1), MQ_TILE_ROW(gguf_tile, 2), MQ_TILE_ROW(gguf_tile, 3),
    MQ_TILE_ROW(gguf_tile, 4), MQ_TILE_ROW(gguf_tile, 5), MQ_TILE_ROW(gguf_tile, 6), MQ_TILE_ROW(gguf_tile, 7),
    MQ_TILE_ROW(gguf_tile, 8), MQ_TILE_ROW(gguf_tile, 9),
};

/* y[R, N] = x[R, K] @ W^T for W packed as described above (fine: 15-bit activations, else
 * 8-bit); returns 0, or -1 for bad arguments. */
int mq_gguf_linear(const float *x, int R, int K, const uint8_t *w, int N, int kind, int fine, float *y,
                   void *scratch, int threads) {
    if (R < 0 || K % QK || N % TILE || kind < 0 || kind >= N_KINDS || threads <= 0) return -1;
    if (R == 0) return 0;  /* a step with no row for this projection */
    fine = fine != 0;
    const int nb = K / QK, tiles = N / TILE;
    const size_t tile_bytes = (size_t)nb * mq_gguf_record_bytes(kind);
    int8_t *qa = (int8_t *)scratch, *ql = qa + (size_t)R * K;
    float *da = (float *)(((uintptr_t)(ql + (size_t)R * K) + 63) & ~(uintptr_t)63);
    float *sa32 = da + (size_t)R * nb, *sa16 = sa32 + (size_t)R * nb;
    const gguf_tile_fn *fns = gguf_tile_table[kind + N_KINDS * fine];
    const int flip = FLIP_S8 && kind_bits(kind) == 8;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++)
            quantize_row(x + (size_t)r * K, K, fine, flip, qa + (size_t)r * K, ql + (size_t)r * K,
                         da + (size_t)r * nb, sa32 + (size_t)r * nb, sa16 + (size_t)r * 2 * nb);
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const uint8_t *rec = w + (size_t)t * tile_bytes;
            for (int r0 = 0; r0 < R; r0 += GROUP) {
                const int n = R - r0 < GROUP ? R - r0 : GROUP;
                fns[n - 1](rec, nb, qa + (size_t)r0 * K, ql + (size_t)r0 * K, da + (size_t)r0 * nb,
                           sa32 + (size_t)r0 * nb, sa16 + (size_t)r0 * 2 * nb, K, y + (size_t)r0 * N + (size_t)t * TILE,
                           N);
            }
        }
    }
    return 0;
}

#endif
