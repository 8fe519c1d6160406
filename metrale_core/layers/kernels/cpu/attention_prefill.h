/* Entry point of attention_prefill.c (tiled prefill attention over the paged KV cache); see that
 * file for the work items and the invariants.
 *
 * Owner: metrale_core.layers.ops.PagedAttentionPrefill.  metrale_core.kernels.cpu parses this
 * file into the ctypes signatures.  Invariants: plain C declarations only (cffi's cdef dialect).
 *
 * out / q: [T, Hq, d] float32 rows (dense heads, row strides out_stride / q_stride); caches
 * [blocks, block_size, Hk, d] float32 (bf16 = 0) or bfloat16 (bf16 = 1); tables [B, table_stride]
 * block ids; segments [num_segments, 4] int64 = (row_start, row_end, sequence, context_len): rows
 * row_start .. row_end of q are the last row_end - row_start of the sequence's context_len
 * positions; window: positions a row sees back from its own (0: no window).
 */
#ifndef METRALE_ATTENTION_PREFILL_H
#define METRALE_ATTENTION_PREFILL_H

#include <stdint.h>

int ap_paged_prefill(float *out, int64_t out_stride, const float *q, int64_t q_stride, const void *k_cache,
                     const void *v_cache, int bf16, const int64_t *tables, int64_t table_stride,
                     const int64_t *segments, int num_segments, int hq, int hk, int d, int block_size,
                     int64_t window, float scale, float softcap, const float *sinks, int threads);
int ap_paged_prefill_q8(float *out, int64_t out_stride, const float *q, int64_t q_stride, const int8_t *k_codes,
                        const uint16_t *k_scales, const int8_t *v_codes, const uint16_t *v_scales,
                        const int64_t *tables, int64_t table_stride, const int64_t *segments, int num_segments,
                        int hq, int hk, int d, int block_size, int64_t window, float scale, float softcap,
                        const float *sinks, int threads);

#endif
