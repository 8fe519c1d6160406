/* q8_0 quantize-on-write (llama.cpp's -ctk/-ctv q8_0): K/V rows of a step stored at their cache
 * slots as int8 codes with one float16 scale per 32 consecutive values.
 *
 * Owner: metrale_core.layers.kv_q8_ops (Q8KVCacheWrite.forward_cpu; kv_q8_ops.quantize_q8_0 is
 * the torch oracle, which this matches bit for bit).
 *
 * Invariants: per group of 32 values x: amax = max |x|, d = amax / 127, q = nearbyint(x * (1 / d))
 * (round half to even, as ggml's x86 quantize_row_q8_0 and torch.round), q = 0 when d = 0; the
 * scale stored is d rounded to float16 (nearest even), the codes were made with the float32 d
 * (as llama.cpp does).  Rows are dense [Hk * d] float32 (token stride in elements); a row's
 * codes go to codes + slot * row and its scales to scales + slot * row / 32.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kv_q8.h"
#include "metrale_cpu_math.h"

#define GROUP 32

/* One row's groups, MT_LANES values per vector (max |x| exact, rounding half to even). */
static void quantize_row(const float *x, int8_t *codes, uint16_t *scales, int row) {
    for (int g = 0; g < row; g += GROUP) {
        mt_vf top = mt_zero();
        for (int i = 0; i < GROUP; i += MT_LANES) {
            const mt_vf v = mt_load(x + g + i);
            top = mt_max(top, mt_max(v, mt_sub(mt_zero(), v)));
        }
        const float d = mt_reduce_max(top) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        float rounded[GROUP];
        for (int i = 0; i < GROUP; i += MT_LANES) mt_store(rounded + i, mt_round(mt_mul(mt_load(x + g + i), mt_set1(id))));
        for (int i = 0; i < GROUP; i++) codes[g + i] = (int8_t)(int)rounded[i];
        scales[g / GROUP] = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

int q8_kv_write(const float *k, int64_t k_stride, const float *v, int64_t v_stride, int8_t *k_codes,
                uint16_t *k_scales, int8_t *v_codes, uint16_t *v_scales, const int64_t *slots, int tokens,
                int k_row, int v_row) {
    if (tokens < 0 || k_row <= 0 || v_row <= 0 || k_row % GROUP || v_row % GROUP) return -1;
    for (int t = 0; t < tokens; t++) {
        const int64_t s = slots[t];
        quantize_row(k + t * k_stride, k_codes + s * k_row, k_scales + s * (k_row / GROUP), k_row);
        quantize_row(v + t * v_stride, v_codes + s * v_row, v_scales + s * (v_row / GROUP), v_row);
    }
    return 0;
}
