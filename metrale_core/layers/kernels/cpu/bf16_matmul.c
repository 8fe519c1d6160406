/* bfloat16 weights, float32 results: y[R, N] = bf16(x)[R, K] @ W^T, batch- and thread-invariant
 * (the bf16 format's projections and head, the quantized formats' batch copy).
 *
 * Owner: metrale_core.layers.formats.cpu_qmatmul (packs W with pack_bf16, calls it through
 * qmatmul_bf16); metrale_core.kernels.cpu builds it into both ISA variants of the library.
 *
 * W is packed in tiles of 16 channels, each K/2 vectors of 64 bytes: element c*2 + j of vector
 * i = W[c, 2i + j] (the operand order of vdpbf16ps).  x is rounded to bfloat16 (nearest even,
 * as torch's .bfloat16()), so every product is exact in float32, and summed in float32; the
 * result stays float32 (oneDNN's bf16 matmul rounds it to bfloat16, which ties logits).  Paths:
 * - mq_linear_bf16 (AVX512 build, CPUs with AVX512-BF16): vdpbf16ps, k ascending in pairs;
 * - mq_linear_bf16_fma (every build): a bfloat16 is the top half of a float32, so a weight
 *   vector widens to two float32 vectors by shifting (k = 2i: << 16; k = 2i + 1: & 0xFFFF0000),
 *   multiplied by FMA.  AVX512: y = (sum over even k, ascending) + (sum over odd k, ascending);
 *   AVX2: one sum over k, ascending.
 *
 * Invariants: K % 32 == 0, N % 16 == 0, float32 contiguous x / y, scratch of
 * mq_bf16_scratch_bytes(R, K) bytes.  The order of the sum of one output element is fixed by K
 * and the path alone: row groups share weight loads but never sums, threads split output tiles
 * only, and x is rounded per element -- so a row's result never depends on the call's other rows,
 * its row count or the thread count.  Results differ between paths and ISA variants.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bf16_matmul.h"
#include "metrale_qmatmul_tiles.h"

#define TILE 16
#define ROW_GROUP MQ_TILE_ROWS

size_t mq_bf16_scratch_bytes(int R, int K) { return (size_t)R * K * 2 + 64; }

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

/* torch's round_to_nearest_even (NaN -> 0x7FC0). */
static inline uint16_t round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return f != f ? 0x7FC0 : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* xb[r, 2i] as a float32 (its bfloat16 bits << 16), and xb[r, 2i + 1]. */
static inline float widen(const uint16_t *xb, size_t at) {
    const uint32_t u = (uint32_t)xb[at] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#if defined(__AVX512F__)

static inline __attribute__((always_inline)) void fma_tile_rows(const uint16_t *tile, int K, const uint16_t *xb,
                                                                int rows, float *y, int ldy) {
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 even[ROW_GROUP], odd[ROW_GROUP];
    for (int r = 0; r < rows; r++) even[r] = odd[r] = _mm512_setzero_ps();
    for (int i = 0; i < K / 2; i++) {
        if ((i & 1) == 0) _mm_prefetch((const char *)(tile + (size_t)(i + 32) * 32), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512((const void *)(tile + (size_t)i * 32));
        const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        for (int r = 0; r < rows; r++) {
            even[r] = _mm512_fmadd_ps(we, _mm512_set1_ps(widen(xb, (size_t)r * K + 2 * i)), even[r]);
            odd[r] = _mm512_fmadd_ps(wo, _mm512_set1_ps(widen(xb, (size_t)r * K + 2 * i + 1)), odd[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, _mm512_add_ps(even[r], odd[r]));
}

#else

static inline __attribute__((always_inline)) void fma_tile_rows(const uint16_t *tile, int K, const uint16_t *xb,
                                                                int rows, float *y, int ldy) {
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 acc[ROW_GROUP][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int i = 0; i < K / 2; i++) {
        if ((i & 1) == 0) _mm_prefetch((const char *)(tile + (size_t)(i + 32) * 32), _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {  /* channels 8h .. 8h + 7 */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(tile + (size_t)i * 32 + 16 * h));
            const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, high));
            for (int r = 0; r < rows; r++) {
                acc[r][h] = _mm256_fmadd_ps(we, _mm256_set1_ps(widen(xb, (size_t)r * K + 2 * i)), acc[r][h]);
                acc[r][h] = _mm256_fmadd_ps(wo, _mm256_set1_ps(widen(xb, (size_t)r * K + 2 * i + 1)), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_ps(y + (size_t)r * ldy, acc[r][0]);
        _mm256_storeu_ps(y + (size_t)r * ldy + 8, acc[r][1]);
    }
}

#endif

#define MQ_TILE_ARGS const uint16_t *tile, int K, const uint16_t *xb, float *y, int ldy
#define MQ_TILE_BODY(KIND, ROWS) KIND##_tile_rows(tile, K, xb, ROWS, y, ldy)
MQ_TILE_FNS(bf16t, fma)

typedef void (*bf16t_fn)(MQ_TILE_ARGS);
static const bf16t_fn FMA_FNS[MQ_TILE_ROWS] = MQ_TILE_ROW(bf16t, fma);

/* Round x to bfloat16 into scratch, then multiply each tile of 16 channels by every row group
 * with fns[rows - 1]; returns 0, or -1 for bad arguments. */
static int bf16_linear(const bf16t_fn *fns, const float *x, int R, int K, const uint16_t *w, int N, float *y,
                       void *scratch, int threads) {
    if (R < 0 || K % 32 || N % TILE || threads <= 0) return -1;
    if (R == 0) return 0;
    uint16_t *xb = (uint16_t *)scratch;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++) xb[(size_t)r * K + k] = round_bf16(x[(size_t)r * K + k]);
#pragma omp for schedule(static)
        for (int t = 0; t < N / TILE; t++) {
            const uint16_t *tile = w + (size_t)t * TILE * K;
            for (int r0 = 0; r0 < R; r0 += ROW_GROUP) {
                const int n = R - r0 < ROW_GROUP ? R - r0 : ROW_GROUP;
                fns[n - 1](tile, K, xb + (size_t)r0 * K, y + (size_t)r0 * N + (size_t)t * TILE, N);
            }
        }
    }
    return 0;
}

int mq_linear_bf16_fma(const float *x, int R, int K, const uint16_t *w, int N, float *y, void *scratch,
                       int threads) {
    return bf16_linear(FMA_FNS, x, R, K, w, N, y, scratch, threads);
}

#endif

#if defined(__AVX512VNNI__)  /* the AVX512 variant: vdpbf16ps where the CPU has AVX512-BF16 */

static inline __attribute__((always_inline, target("avx512bf16"))) void dot_tile_rows(
        const uint16_t *tile, int K, const uint16_t *xb, int rows, float *y, int ldy) {
    __m512 acc[ROW_GROUP];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int i = 0; i < K / 2; i++) {
        if ((i & 1) == 0) _mm_prefetch((const char *)(tile + (size_t)(i + 32) * 32), _MM_HINT_T0);
        const __m512bh w = (__m512bh)_mm512_loadu_si512((const void *)(tile + (size_t)i * 32));
        for (int r = 0; r < rows; r++) {
            int32_t pair;
            __builtin_memcpy(&pair, xb + (size_t)r * K + 2 * i, 4);
            acc[r] = _mm512_dpbf16_ps(acc[r], w, (__m512bh)_mm512_set1_epi32(pair));
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, acc[r]);
}

/* MQ_TILE_FN's functions, with the target attribute the inlined vdpbf16ps needs. */
#define DOT_TILE_FN(ROWS)                                                                              \
    __attribute__((target("avx512bf16"))) static void bf16t_dot_##ROWS(MQ_TILE_ARGS) {                \
        dot_tile_rows(tile, K, xb, ROWS, y, ldy);                                                      \
    }
DOT_TILE_FN(1) DOT_TILE_FN(2) DOT_TILE_FN(3) DOT_TILE_FN(4)

static const bf16t_fn DOT_FNS[MQ_TILE_ROWS] = MQ_TILE_ROW(bf16t, dot);

int mq_linear_bf16(const float *x, int R, int K, const uint16_t *w, int N, float *y, void *scratch, int threads) {
    return bf16_linear(DOT_FNS, x, R, K, w, N, y, scratch, threads);
}

#endif
