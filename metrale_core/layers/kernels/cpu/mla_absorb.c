/* Per-head products of multi-head latent attention's absorbed form, every row the same way:
 * out[t, h, :] = x[t, h, :] @ W_h for each row t and head h.
 *
 * Owner: metrale_core.layers.mla (its rowwise path; torch's einsum is the oracle it is tested
 * against, to float rounding).
 *
 * Layout (float32): x [T, H, K] with row stride x_row_stride, head stride x_head_stride and unit
 * stride along K; W [H, K, N] contiguous; out [T, H, N] contiguous.  out[t, h, n] = sum_k
 * x[t, h, k] W[h, k, n], the sum over k in order (one accumulator per output, vectorised across
 * n); a group of ROWS rows of one head shares each weight load.
 *
 * Invariants: a row's result is computed by the same operations in the same order whatever T,
 * the row's place in the batch, or the thread count (threads split (head, row group) pairs; no
 * sum crosses rows), so it is batch-invariant.  Returns 0, or -1 for arguments it cannot take.
 */
#include <omp.h>
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "mla_absorb.h"

#define ROWS 4 /* rows of one head multiplied together (each weight read once per group) */
#define NB 16  /* outputs kept in registers across the whole sum: two 8-float vectors per row */


/* Rows x[0 .. ROWS) of one head times its W, outputs n0 .. n0 + nb (a padding row repeats a real
 * one).  Each output's sum is acc = fma(x[k], w[k], acc) for k in order, in a vector lane or in
 * the tail alike (one rounding per step either way). */
static void block(const float *const x[ROWS], const float *w, int K, int N, int n0, int nb, float *const out[ROWS]) {
    if (nb == NB) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
        for (int k = 0; k < K; k++) {
            const float *wk = w + (size_t)k * N + n0;
            const __m256 w0 = _mm256_loadu_ps(wk), w1 = _mm256_loadu_ps(wk + 8);
            const __m256 xa = _mm256_set1_ps(x[0][k]), xb = _mm256_set1_ps(x[1][k]);
            const __m256 xc = _mm256_set1_ps(x[2][k]), xd = _mm256_set1_ps(x[3][k]);
            a0 = _mm256_fmadd_ps(xa, w0, a0), a1 = _mm256_fmadd_ps(xa, w1, a1);
            b0 = _mm256_fmadd_ps(xb, w0, b0), b1 = _mm256_fmadd_ps(xb, w1, b1);
            c0 = _mm256_fmadd_ps(xc, w0, c0), c1 = _mm256_fmadd_ps(xc, w1, c1);
            d0 = _mm256_fmadd_ps(xd, w0, d0), d1 = _mm256_fmadd_ps(xd, w1, d1);
        }
        const __m256 acc[ROWS][2] = {{a0, a1}, {b0, b1}, {c0, c1}, {d0, d1}};
        for (int i = 0; i < ROWS; i++) {
            _mm256_storeu_ps(out[i] + n0, acc[i][0]);
            _mm256_storeu_ps(out[i] + n0 + 8, acc[i][1]);
        }
        return;
    }
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < nb; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = __builtin_fmaf(x[i][k], w[(size_t)k * N + n0 + j], acc);
            out[i][n0 + j] = acc;
        }
}

int mt_head_matmul(const float *x, int64_t x_row_stride, int64_t x_head_stride, const float *w, float *out, int T,
                   int H, int K, int N, int threads) {
    if (T < 0 || H <= 0 || K <= 0 || N <= 0 || threads <= 0) return -1;
    const int groups = (T + ROWS - 1) / ROWS;
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
    for (int h = 0; h < H; h++) {
        for (int g = 0; g < groups; g++) {
            const int t0 = g * ROWS, m = T - t0 < ROWS ? T - t0 : ROWS;
            const float *xs[ROWS];
            float *os[ROWS];  /* a padding row writes its real row's outputs again, the same values */
            for (int i = 0; i < ROWS; i++) {
                const int t = t0 + (i < m ? i : 0);
                xs[i] = x + t * x_row_stride + h * x_head_stride;
                os[i] = out + ((size_t)t * H + h) * N;
            }
            const float *wh = w + (size_t)h * K * N;
            for (int n0 = 0; n0 < N; n0 += NB) block(xs, wh, K, N, n0, N - n0 < NB ? N - n0 : NB, os);
        }
    }
    return 0;
}
