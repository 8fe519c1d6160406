/* Block-quantized matmul for x86 CPUs with AVX2 + FMA + F16C (desktops without AVX512-VNNI):
 * the AVX2 variant of qmatmul.c's mq_linear, over the same packed layout and the same maths.
 *
 * Owner: metrale_qwen3.cpu_qmatmul; metrale_core.kernels.cpu builds it into the AVX2 variant of
 * the package's CPU library (in the AVX512 variant this file compiles to nothing).
 *
 * The int8 dot products of qmatmul.c's header are computed with vpmaddubsw (u8 x s8 -> pairs of
 * int16) and vpmaddwd (-> int32), on the halves of each 64-byte vector (channels 0-7, 8-15):
 * - 4-bit codes (0..15) times activations (|qa| <= 128): a pair is at most 3840 and the 16
 *   products of a block's half fit int16 (30720), so the eight k-groups add up in int16 first;
 * - 8-bit codes are stored signed (q - 128): |stored| <= 128 and |qa| <= 127 keep a pair within
 *   int16 (sign trick: |w| x sign(qa, w)); dot(q, qa) = dot(stored, qa) + 128 * sum(qa), and
 *   d * da * 128 * sum(qa) = 128 * d * sa, folded into m as the AMX path does.
 * The integer sums are exact, so results equal the AVX512 variant's up to float rounding of the
 * per-block terms.  No AMX, no bfloat16 matmul (qmatmul.h marks those avx512 only).
 *
 * Invariants: as qmatmul.c (K % 32 == 0, N % 16 == 0, float32 contiguous x / y, scratch of
 * mq_scratch_bytes(R, K) bytes); the signatures are those of qmatmul.h.
 */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512VNNI__)
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale_cpu_math.h"
#include "metrale_qmatmul_tiles.h"
#include "qmatmul.h"

#define QK 32
#define TILE 16
#define ROW_GROUP MQ_TILE_ROWS
#define PREFETCH_RECORDS 12

/* No AMX in this variant: the VNNI-equivalent path serves every call. */
int mq_set_amx(int on) {
    (void)on;
    return 0;
}

/* Q8 per block of 32: codes qa, scale da and scaled code sum sa -- the same numbers as
 * qmatmul.c's quantize_row (IEEE division, round to nearest even, signed saturation). */
static void quantize_row(const float *x, int K, int8_t *qa, float *da, float *sa) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < K / QK; b++) {
        __m256 v[4];
        const float amax = mt256_load32_amax(x + b * QK, v);
        const float d = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
        const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(qa + b * QK), _mm256_permutevar8x32_epi32(packed, order));
        da[b] = d;
        sa[b] = d * (float)mt256_reduce_add_epi32(sum);
    }
}

static inline void prefetch_ahead(const uint8_t *p, int record) {
    for (int line = 0; line < record; line += 64)
        _mm_prefetch((const char *)(p + PREFETCH_RECORDS * record + line), _MM_HINT_T0);
}

/* `rows` (<= ROW_GROUP) activation rows times one tile of 16 channels (two halves of 8);
 * inlined with constant bits / rows so the loops unroll. */
static inline __attribute__((always_inline)) void tile_rows(
        const uint8_t *rec, int nb, int bits, const int8_t *qa, const float *da,
        const float *sa, int K, int rows, float *y, int ldy) {
    const int record = bits == 4 ? 320 : 576, codes = bits == 4 ? 256 : 512;
    __m256 f[ROW_GROUP][2];
    for (int r = 0; r < rows; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = rec + (size_t)b * record;
        prefetch_ahead(p, record);
        for (int h = 0; h < 2; h++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + codes + 16 * h)));
            __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + codes + 32 + 16 * h)));
            __m256i w[8];
            mt256_load_codes(p, bits, h, w);
            if (bits == 8) mw = _mm256_fmadd_ps(dw, _mm256_set1_ps(128.0f), mw);  /* q = stored + 128 */
            for (int r = 0; r < rows; r++) {
                const __m256i dot = mt256_codes_dot(w, qa + (size_t)r * K + b * QK, bits, 0, 8);
                const int at = r * (K / QK) + b;
                f[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, _mm256_set1_ps(da[at])), f[r][h]);
                f[r][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sa[at]), f[r][h]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_ps(y + (size_t)r * ldy, f[r][0]);
        _mm256_storeu_ps(y + (size_t)r * ldy + 8, f[r][1]);
    }
}

#define MQ_TILE_ARGS MQ_RECORD_TILE_ARGS
#define MQ_TILE_BODY MQ_RECORD_TILE_BODY
MQ_RECORD_TILE_TABLE;

/* y[R, N] = x[R, K] @ W^T for W packed as qmatmul.c describes; returns 0, or -1 for bad arguments. */
int mq_linear(const float *x, int R, int K, const uint8_t *w, int N, int bits, float *y,
              void *scratch, int threads) {
    if (R < 0 || K % QK || N % TILE || (bits != 4 && bits != 8) || threads <= 0) return -1;
    if (R == 0) return 0;  /* a step with no row for this projection */
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
            quantize_row(x + (size_t)r * K, K, qa + (size_t)r * K, da + (size_t)r * nb, sa + (size_t)r * nb);
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const uint8_t *rec = w + (size_t)t * tile_bytes;
            for (int r0 = 0; r0 < R; r0 += ROW_GROUP) {
                const int n = R - r0 < ROW_GROUP ? R - r0 : ROW_GROUP;
                fns[n - 1](rec, nb, qa + (size_t)r0 * K, da + (size_t)r0 * nb, sa + (size_t)r0 * nb, K,
                           y + (size_t)r0 * N + (size_t)t * TILE, N);
            }
        }
    }
    return 0;
}

#endif
