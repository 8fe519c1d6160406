/* Multi-LoRA on CPU: y[t] += (x[t] @ A_s.T) @ B_s.T for every row t of adapter slot s, every slot
 * of the step in one call.
 *
 * Owner: metrale_core.layers.lora (LoRALinear's CPU path; the torch paths of that module are the
 * oracle it is tested against).
 *
 * Layout (float32, row-major): x [T, K]; the slots' A [S, W, K] and scaled B.T [S, W, N] (W = the
 * slot width: the parts' ranks side by side, zero-padded); part p of slot s uses the columns
 * part_cols[(s * P + p) * 2] .. + part_cols[(s * P + p) * 2 + 1] of A / B.T and writes outputs
 * part_out[2p] .. + part_out[2p + 1] (rank 0: the slot has nothing for that part).  The rows of
 * slot s are order[starts[s] .. starts[s + 1]).  Only the parts' own blocks of B.T are read (the
 * padding between them never is), and each weight is read once per group of ROWS rows of a slot:
 * at a few rows per adapter the work is bound by reading the adapter's weights.
 *
 * Invariants: every (row, output) sum runs in one fixed order (over the part's columns, then
 * outputs split between threads by column tiles), so a row's result does not depend on the other
 * rows of the step or on the thread count.  Returns 0, or -1 for arguments it cannot take.
 * scratch: threads * ROWS * W floats (the shrunk activations of a group of rows, per thread).
 * With at least as many slots holding rows as threads, each slot runs wholly on one thread (no
 * barriers); otherwise the team shares each group's columns and output tiles.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "lora_apply.h"

#define ROWS 8     /* rows of one slot multiplied together (each weight read once per group) */
#define NTILE 256  /* output columns per expand tile */

int mt_lora_rows(void) { return ROWS; }

static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One group of m rows of slot s: shrink into u [m, W], then expand into y.  Thread `tid` of
 * `team` takes every team-th column (shrink) and output tile (expand); with team > 1 every thread
 * of the enclosing parallel region calls it (it holds barriers); team == 1: one thread does all. */
static void apply_group(const float *x, int K, const int64_t *rows, int m, const float *as, const float *bs, int W,
                        int N, const int32_t *cols, int P, const int32_t *part_out, float *y, float *u, int tid,
                        int team) {
    for (int j = tid; j < W; j += team) {
        int used = 0;
        for (int p = 0; p < P; p++)
            if (j >= cols[2 * p] && j < cols[2 * p] + cols[2 * p + 1]) used = 1;
        for (int i = 0; i < m; i++)
            u[(size_t)i * W + j] = used ? dot(as + (size_t)j * K, x + (size_t)rows[i] * K, K) : 0.0f;
    }
    if (team > 1) {
#pragma omp barrier
    }
    for (int p = 0; p < P; p++) {
        const int c0 = cols[2 * p], r = cols[2 * p + 1], o0 = part_out[2 * p], n = part_out[2 * p + 1];
        if (r == 0 || n == 0) continue;
        const int tiles = (n + NTILE - 1) / NTILE;
        for (int t = tid; t < tiles; t += team) {
            const int lo = o0 + t * NTILE, len = (t + 1) * NTILE <= n ? NTILE : n - t * NTILE;
            float acc[ROWS][NTILE];
            for (int i = 0; i < m; i++) memset(acc[i], 0, sizeof(float) * (size_t)len);
            for (int j = c0; j < c0 + r; j++) {
                const float *brow = bs + (size_t)j * N + lo;
                for (int i = 0; i < m; i++) {
                    const float ui = u[(size_t)i * W + j];
                    float *ai = acc[i];
                    for (int o = 0; o < len; o++) ai[o] += ui * brow[o];
                }
            }
            for (int i = 0; i < m; i++) {
                float *yi = y + (size_t)rows[i] * N + lo;
                for (int o = 0; o < len; o++) yi[o] += acc[i][o];
            }
        }
    }
    if (team > 1) {
#pragma omp barrier
    }
}

int mt_lora_apply(const float *x, int K, const int64_t *order, const int64_t *starts, int S, const float *a,
                  const float *bt, int W, int N, const int32_t *part_cols, int P, const int32_t *part_out, float *y,
                  float *scratch, int threads) {
    if (K <= 0 || S <= 0 || W <= 0 || N <= 0 || P <= 0 || threads <= 0) return -1;
    for (int p = 0; p < P; p++)
        if (part_out[2 * p] < 0 || part_out[2 * p + 1] < 0 || part_out[2 * p] + part_out[2 * p + 1] > N) return -1;
    for (int i = 0; i < S * P; i++)
        if (part_cols[2 * i] < 0 || part_cols[2 * i + 1] < 0 || part_cols[2 * i] + part_cols[2 * i + 1] > W) return -1;
    int active = 0;
    for (int s = 0; s < S; s++) active += starts[s + 1] > starts[s];
    if (active >= threads) {
        /* as many slots with rows as threads: each slot wholly on one thread (its rows are its own,
         * so no two threads write one row), no barriers */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int s = 0; s < S; s++) {
            float *u = scratch + (size_t)omp_get_thread_num() * ROWS * W;
            for (int64_t g = starts[s]; g < starts[s + 1]; g += ROWS) {
                const int m = (int)(starts[s + 1] - g < ROWS ? starts[s + 1] - g : ROWS);
                apply_group(x, K, order + g, m, a + (size_t)s * W * K, bt + (size_t)s * W * N, W, N,
                            part_cols + (size_t)s * P * 2, P, part_out, y, u, 0, 1);
            }
        }
        return 0;
    }
#pragma omp parallel num_threads(threads)
    {
        const int tid = omp_get_thread_num(), team = omp_get_num_threads();
        for (int s = 0; s < S; s++)
            for (int64_t g = starts[s]; g < starts[s + 1]; g += ROWS) {
                const int m = (int)(starts[s + 1] - g < ROWS ? starts[s + 1] - g : ROWS);
                apply_group(x, K, order + g, m, a + (size_t)s * W * K, bt + (size_t)s * W * N, W, N,
                            part_cols + (size_t)s * P * 2, P, part_out, y, scratch, tid, team);
            }
    }
    return 0;
}
