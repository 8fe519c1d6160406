/* bfloat16 weights, float32 results, on any AVX2 / AVX512F CPU: y[R, N] = bf16(x)[R, K] @ W^T,
 * batch- and thread-invariant (the path of the bf16 format and of the quantized formats' batch
 * copy where the CPU has no AVX512-BF16; qmatmul.c's mq_linear_bf16 is the one where it has).
 *
 * Owner: metrale_core.layers.formats.cpu_qmatmul (packs W with pack_bf16, calls it through
 * qmatmul_bf16); metrale_core.kernels.cpu builds it into both ISA variants of the library.
 *
 * W is qmatmul.c's bfloat16 layout: tiles of 16 channels, each K/2 vectors of 64 bytes, element
 * c*2 + j of vector i = W[c, 2i + j].  A bfloat16 is the top half of a float32, so a vector
 * widens to two float32 vectors by shifting: channels c at k = 2i (<< 16) and at k = 2i + 1
 * (& 0xFFFF0000).  x is rounded to bfloat16 (nearest even, as torch's .bfloat16()), so every
 * product is exact in float32, and summed by FMA in float32:
 *   AVX512: y[r, n] = (sum over even k, ascending) + (sum over odd k, ascending);
 *   AVX2:   y[r, n] = sum over k, ascending (one accumulator).
 *
 * Invariants: K % 32 == 0, N % 16 == 0, float32 contiguous x / y, scratch of
 * mq_bf16_scratch_bytes(R, K) bytes.  The order of the sum of one output element is fixed by K
 * alone: row groups share weight loads but never sums, and threads split output tiles only (the
 * rounding of x is per element), so a row's result never depends on the other rows of the call,
 * its row count or the thread count.  Results differ between the two ISA variants (sum order).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bf16_matmul.h"
#include "metrale_qmatmul_tiles.h"

#define TILE 16
#define ROW_GROUP MQ_TILE_ROWS

size_t mq_bf16_scratch_bytes(int R, int K) { return (size_t)R * K * sizeof(float) + 64; }

/* x rounded to bfloat16 (torch's round_to_nearest_even; NaN -> 0x7FC0), kept as a float32. */
static inline float round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = f != f ? 0x7FC00000u : (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}

#if defined(__AVX512F__)

static inline __attribute__((always_inline)) void tile_rows(const uint16_t *tile, int K, const float *xf, int rows,
                                                            float *y, int ldy) {
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 even[ROW_GROUP], odd[ROW_GROUP];
    for (int r = 0; r < rows; r++) even[r] = odd[r] = _mm512_setzero_ps();
    for (int i = 0; i < K / 2; i++) {
        if ((i & 1) == 0) _mm_prefetch((const char *)(tile + (size_t)(i + 32) * 32), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512((const void *)(tile + (size_t)i * 32));
        const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        for (int r = 0; r < rows; r++) {
            even[r] = _mm512_fmadd_ps(we, _mm512_set1_ps(xf[(size_t)r * K + 2 * i]), even[r]);
            odd[r] = _mm512_fmadd_ps(wo, _mm512_set1_ps(xf[(size_t)r * K + 2 * i + 1]), odd[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, _mm512_add_ps(even[r], odd[r]));
}

#elif defined(__AVX2__) && defined(__FMA__)

static inline __attribute__((always_inline)) void tile_rows(const uint16_t *tile, int K, const float *xf, int rows,
                                                            float *y, int ldy) {
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
                acc[r][h] = _mm256_fmadd_ps(we, _mm256_set1_ps(xf[(size_t)r * K + 2 * i]), acc[r][h]);
                acc[r][h] = _mm256_fmadd_ps(wo, _mm256_set1_ps(xf[(size_t)r * K + 2 * i + 1]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_ps(y + (size_t)r * ldy, acc[r][0]);
        _mm256_storeu_ps(y + (size_t)r * ldy + 8, acc[r][1]);
    }
}

#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

#define MQ_TILE_ARGS const uint16_t *tile, int K, const float *xf, float *y, int ldy
#define MQ_TILE_BODY(KIND, ROWS) tile_rows(tile, K, xf, ROWS, y, ldy)
MQ_TILE_FNS(bf16t, w)

typedef void (*bf16t_fn)(MQ_TILE_ARGS);
static const bf16t_fn BF16T_FNS[MQ_TILE_ROWS] = MQ_TILE_ROW(bf16t, w);

int mq_linear_bf16_fma(const float *x, int R, int K, const uint16_t *w, int N, float *y, void *scratch,
                       int threads) {
    if (R < 0 || K % 32 || N % TILE || threads <= 0) return -1;
    if (R == 0) return 0;
    float *xf = (float *)scratch;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++) xf[(size_t)r * K + k] = round_bf16(x[(size_t)r * K + k]);
#pragma omp for schedule(static)
        for (int t = 0; t < N / TILE; t++) {
            const uint16_t *tile = w + (size_t)t * TILE * K;
            for (int r0 = 0; r0 < R; r0 += ROW_GROUP) {
                const int n = R - r0 < ROW_GROUP ? R - r0 : ROW_GROUP;
                BF16T_FNS[n - 1](tile, K, xf + (size_t)r0 * K, y + (size_t)r0 * N + (size_t)t * TILE, N);
            }
        }
    }
    return 0;
}

#endif
