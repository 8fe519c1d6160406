/* Block-quantized matmul for x86 CPUs with AVX512-VNNI: y[R, N] = x[R, K] @ W[N, K]^T.
 *
 * Owner: metrale_qwen3.cpu_qmatmul (builds this file with the system C compiler, loads it with
 * ctypes and packs the weights into the layout below).
 *
 * Weights keep a GGUF block format's own values: every run of 32 weights along K (a block) of an
 * output channel n is W[n, k] = d[n, b] * q[n, k] + m[n, b] with unsigned codes q (4-bit: 0..15,
 * 8-bit: 0..255) and fp16 d, m.  Activations are quantized per row and per block of 32 to signed
 * int8 (qa = round(x / da), da = max|x| / 127, sa = da * sum(qa)), as llama.cpp's Q8_1 does, so
 *
 *   y[r, n] = sum_b  d[n, b] * da[r, b] * (q[n, b, :] . qa[r, b, :])  +  m[n, b] * sa[r, b]
 *
 * where the dot product is exact int32 arithmetic (vpdpbusd: u8 x s8).
 *
 * Layout: output channels in tiles of 16, each tile a run of K/32 records, one per block:
 *   4-bit: 256 code bytes, then 16 x fp16 d, then 16 x fp16 m           (320 bytes)
 *          code byte j*64 + c*4 + i = q[c, 4j + i] | q[c, 4(j+4) + i] << 4  (j < 4, c < 16, i < 4)
 *   8-bit: 512 code bytes, then 16 x fp16 d, then 16 x fp16 m           (576 bytes)
 *          code byte g*64 + c*4 + i = q[c, 4g + i]                          (g < 8)
 * so one 64-byte vector holds four consecutive k of 16 channels, the operand order of vpdpbusd.
 *
 * Invariants: K % 32 == 0, N % 16 == 0; x and y are float32, row-major and contiguous; the caller
 * supplies scratch of mq_scratch_bytes(R, K) bytes.  Threads: one OpenMP team of `threads`
 * (linked against the libgomp torch already loaded, so torch's ops and these share one team).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define QK 32
#define TILE 16
#define ROW_GROUP 4
/* Records prefetched ahead of the one being multiplied (the hardware prefetcher alone leaves a
 * single-row call ~25% short of the memory bandwidth on SmolLM2's shapes; 8-24 measure alike). */
#define PREFETCH_RECORDS 12

size_t mq_scratch_bytes(int R, int K) {
    return (size_t)R * K + 2 * sizeof(float) * (size_t)R * (K / QK) + 64;
}

int mq_record_bytes(int bits) { return bits == 4 ? 320 : 576; }

/* Q8 per block of 32: codes qa, scale da and scaled code sum sa (see the header). */
static void quantize_row(const float *x, int K, int8_t *qa, float *da, float *sa) {
    for (int b = 0; b < K / QK; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * QK), v1 = _mm512_loadu_ps(x + b * QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f;
        __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));  /* round to nearest even */
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
        _mm_storeu_si128((__m128i *)(qa + b * QK), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qa + b * QK + 16), _mm512_cvtsepi32_epi8(i1));
        da[b] = d;
        sa[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

static inline __attribute__((always_inline)) __m512i bcast4(const int8_t *p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* `rows` (<= ROW_GROUP) activation rows times one tile of 16 channels; inlined with constant
 * bits/rows so every loop below unrolls. */
static inline __attribute__((always_inline)) void tile_rows(
        const uint8_t *rec, int nb, int bits, const int8_t *qa, const float *da,
        const float *sa, int K, int rows, float *y, int ldy) {
    const int record = bits == 4 ? 320 : 576, codes = bits == 4 ? 256 : 512;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 f[ROW_GROUP];
    for (int r = 0; r < rows; r++) f[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = rec + (size_t)b * record;
        for (int line = 0; line < record; line += 64)
            _mm_prefetch((const char *)(p + PREFETCH_RECORDS * record + line), _MM_HINT_T0);
        __m512i w[8];
        if (bits == 4) {
            for (int j = 0; j < 4; j++) {
                __m512i v = _mm512_loadu_si512((const void *)(p + 64 * j));
                w[j] = _mm512_and_si512(v, low4);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
        } else {
            for (int g = 0; g < 8; g++) w[g] = _mm512_loadu_si512((const void *)(p + 64 * g));
        }
        __m512i sc = _mm512_loadu_si512((const void *)(p + codes));
        __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
        __m512 mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1));
        for (int r = 0; r < rows; r++) {
            const int8_t *q = qa + (size_t)r * K + b * QK;
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) {
                a0 = _mm512_dpbusd_epi32(a0, w[g], bcast4(q + 4 * g));
                a1 = _mm512_dpbusd_epi32(a1, w[g + 4], bcast4(q + 4 * (g + 4)));
            }
            const int at = r * (K / QK) + b;
            __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1));
            f[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_set1_ps(da[at])), f[r]);
            f[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[at]), f[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, f[r]);
}

#define TILE_FN(BITS, ROWS)                                                                       \
    static void tile_##BITS##_##ROWS(const uint8_t *rec, int nb, const int8_t *qa,              \
                                     const float *da, const float *sa, int K, float *y,         \
                                     int ldy) {                                                 \
        tile_rows(rec, nb, BITS, qa, da, sa, K, ROWS, y, ldy);                                   \
    }
TILE_FN(4, 1) TILE_FN(4, 2) TILE_FN(4, 3) TILE_FN(4, 4)
TILE_FN(8, 1) TILE_FN(8, 2) TILE_FN(8, 3) TILE_FN(8, 4)

typedef void (*tile_fn)(const uint8_t *, int, const int8_t *, const float *, const float *, int,
                        float *, int);
static const tile_fn TILE_FNS[2][ROW_GROUP] = {
    {tile_4_1, tile_4_2, tile_4_3, tile_4_4},
    {tile_8_1, tile_8_2, tile_8_3, tile_8_4},
};

/* y[R, N] = x[R, K] @ W^T for W packed as described above; returns 0, or -1 for bad arguments. */
int mq_linear(const float *x, int R, int K, const uint8_t *w, int N, int bits, float *y,
              void *scratch, int threads) {
    if (R <= 0 || K % QK || N % TILE || (bits != 4 && bits != 8) || threads <= 0) return -1;
    const int nb = K / QK, tiles = N / TILE;
    const size_t tile_bytes = (size_t)nb * mq_record_bytes(bits);
    int8_t *qa = (int8_t *)scratch;
    float *da = (float *)(((uintptr_t)(qa + (size_t)R * K) + 63) & ~(uintptr_t)63);
    float *sa = da + (size_t)R * nb;
    const tile_fn *fns = TILE_FNS[bits == 8];
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++)
            quantize_row(x + (size_t)r * K, K, qa + (size_t)r * K, da + (size_t)r * nb,
                         sa + (size_t)r * nb);
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const uint8_t *rec = w + (size_t)t * tile_bytes;
            for (int r0 = 0; r0 < R; r0 += ROW_GROUP) {
                const int rows = R - r0 < ROW_GROUP ? R - r0 : ROW_GROUP;
                fns[rows - 1](rec, nb, qa + (size_t)r0 * K, da + (size_t)r0 * nb,
                              sa + (size_t)r0 * nb, K, y + (size_t)r0 * N + (size_t)t * TILE, N);
            }
        }
    }
    return 0;
}
