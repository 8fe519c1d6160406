/* Block-quantized matmul for x86 CPUs with AVX512-VNNI (AVX2: qmatmul_avx2.c): y[R, N] = x[R, K] @ W[N, K]^T (and, in
 * bf16_matmul.c, the bfloat16-weight matmul with float32 results).
 *
 * Owner: metrale_qwen3.cpu_qmatmul (packs the weights into the layout below and calls it);
 * metrale_core.kernels.cpu builds it with decoder_ops.c into the package's CPU library.
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
 *          code byte g*64 + c*4 + i = q[c, 4g + i] ^ 0x80 (signed: q - 128)  (g < 8)
 * so one 64-byte vector holds four consecutive k of 16 channels, the operand order of vpdpbusd,
 * and eight of them (4-bit: unpacked) are the B operand of an AMX tile multiply.
 *
 * Two paths, same maths and the same result up to float rounding of the per-block sums:
 * - AVX512-VNNI (vpdpbusd, u8 weights x s8 activations), every call where AMX is not enabled
 *   and calls of fewer than AMX_MIN_ROWS rows (decode of a few sequences: memory-bound);
 * - AMX-INT8 (tdpbusd) for AMX_MIN_ROWS rows or more once mq_set_amx(1) succeeded: activations
 *   become the u8 operand (qa + 128) and weights the s8 one, so each block's dot product is
 *   corrected by 128 * sum(weights), computed alongside.
 *
 * Invariants: K % 32 == 0, N % 16 == 0; x and y are float32, row-major and contiguous; the caller
 * supplies scratch of mq_scratch_bytes(R, K) bytes.  Threads: one OpenMP team of `threads`
 * (linked against the libgomp torch already loaded, so torch's ops and these share one team).
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "metrale_cpu_math.h"
#include "metrale_qmatmul_tiles.h"
#include "qmatmul.h"

#define QK 32
#define TILE 16
#define ROW_GROUP MQ_TILE_ROWS
/* Records prefetched ahead of the one being multiplied (the hardware prefetcher alone leaves a
 * single-row call ~25% short of the memory bandwidth on SmolLM2's shapes; 8-24 measure alike). */
#define PREFETCH_RECORDS 12

/* Calls with at least this many rows use AMX once it is enabled: its per-block cost does not
 * depend on the rows (padded to 16), so it beats VNNI from ~12 rows (SmolLM2, 2 threads). */
#define AMX_MIN_ROWS 12
#define AMX_ROWS 16

/* The rest of the file up to mq_scratch_bytes, and everything after it, is the AVX512 variant
 * of the library; qmatmul_avx2.c holds the AVX2 one (see qmatmul.h). */
#if defined(__AVX512VNNI__)

static int amx_permitted = 0, amx_enabled = 0;

/* on = 1: ask the kernel for the AMX tile state (once per process) and use AMX when granted;
 * on = 0: use the VNNI path only.  Returns whether AMX is now used.  Call it only on CPUs with
 * AMX-TILE and AMX-INT8, and not while a matmul runs. */
int mq_set_amx(int on) {
    if (on && !amx_permitted)
        amx_permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    amx_enabled = on && amx_permitted;
    return amx_enabled;
}

#endif

static inline int padded_rows(int R) { return (R + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS; }

size_t mq_scratch_bytes(int R, int K) {
    const size_t rows = (size_t)padded_rows(R);
    return 2 * rows * K + 2 * sizeof(float) * rows * (K / QK) + 128;
}

int mq_record_bytes(int bits) { return bits == 4 ? 320 : 576; }

#if defined(__AVX512VNNI__)

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

/* Prefetch the record PREFETCH_RECORDS ahead of record p. */
static inline void prefetch_ahead(const uint8_t *p, int record) {
    for (int line = 0; line < record; line += 64)
        _mm_prefetch((const char *)(p + PREFETCH_RECORDS * record + line), _MM_HINT_T0);
}

/* A 4-bit record's 256 code bytes as eight vectors of byte codes 0..15, w[g] = k-group g. */
static inline __attribute__((always_inline)) void unpack4(const uint8_t *p, __m512i w[8]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_loadu_si512((const void *)(p + 64 * j));
        w[j] = _mm512_and_si512(v, low4);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
}

/* `rows` (<= ROW_GROUP) activation rows times one tile of 16 channels; inlined with constant
 * bits/rows so every loop below unrolls. */
static inline __attribute__((always_inline)) void tile_rows(
        const uint8_t *rec, int nb, int bits, const int8_t *qa, const float *da,
        const float *sa, int K, int rows, float *y, int ldy) {
    const int record = bits == 4 ? 320 : 576, codes = bits == 4 ? 256 : 512;
    __m512 f[ROW_GROUP];
    for (int r = 0; r < rows; r++) f[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = rec + (size_t)b * record;
        prefetch_ahead(p, record);
        __m512i w[8];
        if (bits == 4) {
            unpack4(p, w);
        } else {
            const __m512i flip = _mm512_set1_epi8((char)0x80);  /* stored q - 128 -> q */
            for (int g = 0; g < 8; g++) w[g] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(p + 64 * g)), flip);
        }
        __m512i sc = _mm512_loadu_si512((const void *)(p + codes));
        __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
        __m512 mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1));
        for (int r = 0; r < rows; r++) {
            const int8_t *q = qa + (size_t)r * K + b * QK;
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) {
                a0 = _mm512_dpbusd_epi32(a0, w[g], mt512_bcast4(q + 4 * g));
                a1 = _mm512_dpbusd_epi32(a1, w[g + 4], mt512_bcast4(q + 4 * (g + 4)));
            }
            const int at = r * (K / QK) + b;
            __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1));
            f[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_set1_ps(da[at])), f[r]);
            f[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[at]), f[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, f[r]);
}

#define MQ_TILE_ARGS MQ_RECORD_TILE_ARGS
#define MQ_TILE_BODY MQ_RECORD_TILE_BODY
MQ_RECORD_TILE_TABLE;


typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) tile_config;

/* Two sets of tiles, used by alternate blocks so one block's tile multiply overlaps the previous
 * block's float epilogue: C (16 rows x 16 channels int32) in 0 / 3, A (16 rows x 32 u8
 * activations) in 1 / 4, B (8 k-groups x 16 channels x 4 s8 weights) in 2 / 5. */
__attribute__((target("amx-tile,amx-int8"))) static void amx_configure(void) {
    tile_config cfg = {0};
    cfg.palette = 1;
    for (int set = 0; set < 6; set += 3) {
        cfg.rows[set] = 16, cfg.colsb[set] = 64;
        cfg.rows[set + 1] = 16, cfg.colsb[set + 1] = 32;
        cfg.rows[set + 2] = 8, cfg.colsb[set + 2] = 64;
    }
    __asm__ __volatile__("" : : "r"(&cfg) : "memory");  /* gcc 12 drops the stores otherwise */
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile,amx-int8"))) static void amx_release(void) { _tile_release(); }

/* The s8 B operand of block record p (4-bit codes unpacked into `unpacked`) and, in *wsum, the
 * per-channel sums of its codes. */
static inline __attribute__((always_inline)) const void *amx_weights(const uint8_t *p, int bits,
                                                                     uint8_t *unpacked, __m512i *wsum) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sum = _mm512_setzero_si512();
    if (bits == 8) {
        for (int g = 0; g < 8; g++) sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512((const void *)(p + 64 * g)));
        *wsum = sum;
        return p;
    }
    __m512i w[8];
    unpack4(p, w);
    for (int g = 0; g < 8; g++) {
        _mm512_store_si512((void *)(unpacked + 64 * g), w[g]);
        sum = _mm512_dpbusd_epi32(sum, ones, w[g]);
    }
    *wsum = sum;
    return unpacked;
}

/* Block b's integer dot products into dots (tile set C, A, B); immediates, hence a macro. */
#define AMX_BLOCK(C, A, B, b, dots, wsum, unpacked)                                          \
    do {                                                                                     \
        const void *wts_ = amx_weights(rec + (size_t)(b) * record, bits, unpacked, &(wsum)); \
        _tile_loadd(B, wts_, 64);                                                            \
        _tile_loadd(A, ua + (b) * QK, K);                                                    \
        _tile_zero(C);                                                                       \
        _tile_dpbusd(C, A, B);                                                               \
        _tile_stored(C, dots, 64);                                                           \
    } while (0)

/* AMX_ROWS activation rows (ua: u8 codes, row stride K; rows past `rows` are padding) times one
 * tile of 16 channels. */
static inline __attribute__((always_inline, target("amx-tile,amx-int8"))) void amx_tile_rows(
        const uint8_t *rec, int nb, int bits, const uint8_t *ua, const float *da, const float *sa,
        int K, int rows, float *y, int ldy) {
    const int record = bits == 4 ? 320 : 576, codes = bits == 4 ? 256 : 512;
    uint8_t unpacked[2][512] __attribute__((aligned(64)));
    int32_t dots[2][AMX_ROWS * TILE] __attribute__((aligned(64)));
    __m512i wsum[2];
    __m512 f[AMX_ROWS];
    for (int r = 0; r < AMX_ROWS; r++) f[r] = _mm512_setzero_ps();
    AMX_BLOCK(0, 1, 2, 0, dots[0], wsum[0], unpacked[0]);
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = rec + (size_t)b * record;
        prefetch_ahead(p, record);
        if (b + 1 < nb) {  /* the next block's multiply, in the other tile set */
            if (b & 1)
                AMX_BLOCK(0, 1, 2, b + 1, dots[0], wsum[0], unpacked[0]);
            else
                AMX_BLOCK(3, 4, 5, b + 1, dots[1], wsum[1], unpacked[1]);
        }
        const int32_t *dot = dots[b & 1];
        const __m512i sc = _mm512_loadu_si512((const void *)(p + codes));
        const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
        __m512 mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1));
        if (bits == 8) mw = _mm512_fmadd_ps(dw, _mm512_set1_ps(128.0f), mw);  /* q = stored + 128 */
        /* dot(q, qa) = dot(stored, qa + 128) - 128 * sum(stored) [+ 128 * sum(qa), in mw] */
        const __m512 e = _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(-128.0f)), _mm512_cvtepi32_ps(wsum[b & 1]));
        for (int r = 0; r < AMX_ROWS; r++) {
            const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(dot + r * TILE))), dw, e);
            f[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(da[r * nb + b]), f[r]);
            f[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[r * nb + b]), f[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (size_t)r * ldy, f[r]);
}

__attribute__((target("amx-tile,amx-int8"))) static void amx_tile_4(
        const uint8_t *rec, int nb, const uint8_t *ua, const float *da, const float *sa, int K, int rows,
        float *y, int ldy) {
    amx_tile_rows(rec, nb, 4, ua, da, sa, K, rows, y, ldy);
}

__attribute__((target("amx-tile,amx-int8"))) static void amx_tile_8(
        const uint8_t *rec, int nb, const uint8_t *ua, const float *da, const float *sa, int K, int rows,
        float *y, int ldy) {
    amx_tile_rows(rec, nb, 8, ua, da, sa, K, rows, y, ldy);
}

/* y[R, N] = x[R, K] @ W^T for W packed as described above; returns 0, or -1 for bad arguments. */
int mq_linear(const float *x, int R, int K, const uint8_t *w, int N, int bits, float *y,
              void *scratch, int threads) {
    if (R < 0 || K % QK || N % TILE || (bits != 4 && bits != 8) || threads <= 0) return -1;
    if (R == 0) return 0;  /* a step with no row for this projection */
    const int nb = K / QK, tiles = N / TILE, rows = padded_rows(R);
    const int amx = amx_enabled && R >= AMX_MIN_ROWS;
    const size_t tile_bytes = (size_t)nb * mq_record_bytes(bits);
    int8_t *qa = (int8_t *)scratch;
    uint8_t *ua = (uint8_t *)(qa + (size_t)rows * K);
    float *da = (float *)(((uintptr_t)(ua + (size_t)rows * K) + 63) & ~(uintptr_t)63);
    float *sa = da + (size_t)rows * nb;
    const tile_fn *fns = TILE_FNS[bits == 8];
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            if (r < R) {
                quantize_row(x + (size_t)r * K, K, qa + (size_t)r * K, da + (size_t)r * nb, sa + (size_t)r * nb);
            } else {  /* AMX padding rows: zero scales, so they add nothing */
                for (int b = 0; b < nb; b++) da[(size_t)r * nb + b] = sa[(size_t)r * nb + b] = 0.0f;
                for (int k = 0; k < K; k++) qa[(size_t)r * K + k] = 0;
            }
            if (amx) {  /* the u8 operand: qa + 128 */
                for (int k = 0; k < K; k += 64) {
                    const __mmask64 m = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
                    __m512i v = _mm512_maskz_loadu_epi8(m, qa + (size_t)r * K + k);
                    _mm512_mask_storeu_epi8(ua + (size_t)r * K + k, m, _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)));
                }
            }
        }
        if (amx) amx_configure();
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const uint8_t *rec = w + (size_t)t * tile_bytes;
            float *yt = y + (size_t)t * TILE;
            if (amx) {
                for (int r0 = 0; r0 < R; r0 += AMX_ROWS) {
                    const int n = R - r0 < AMX_ROWS ? R - r0 : AMX_ROWS;
                    (bits == 4 ? amx_tile_4 : amx_tile_8)(rec, nb, ua + (size_t)r0 * K, da + (size_t)r0 * nb,
                                                          sa + (size_t)r0 * nb, K, n, yt + (size_t)r0 * N, N);
                }
            } else {
                for (int r0 = 0; r0 < R; r0 += ROW_GROUP) {
                    const int n = R - r0 < ROW_GROUP ? R - r0 : ROW_GROUP;
                    fns[n - 1](rec, nb, qa + (size_t)r0 * K, da + (size_t)r0 * nb, sa + (size_t)r0 * nb, K,
                               yt + (size_t)r0 * N, N);
                }
            }
        }
        if (amx) amx_release();
    }
    return 0;
}

#endif  /* __AVX512VNNI__ */
