/* Entry point of attention_decode.c: the one statement of its C signature.
 *
 * Owner: metrale_core.layers.ops (PagedAttentionDecode.forward_cpu).  attention_decode.c includes
 * this file, so the compiler rejects a definition that differs from it, and
 * metrale_core.kernels.cpu parses it (cffi's C parser) into the ctypes signature Python calls.
 *
 * Invariants: plain C declarations only (cffi's cdef dialect: no macros in declarations); the
 * function returns 0, or -1 for arguments it cannot take; pointers are raw tensor data pointers.
 */
#ifndef METRALE_ATTENTION_DECODE_H
#define METRALE_ATTENTION_DECODE_H

#include <stdint.h>

int dop_paged_decode(float *out, const float *q, int64_t q_stride, const void *k_cache,
                     const void *v_cache, int bf16, const int64_t *tables, int64_t table_stride,
                     const int64_t *context, int batch, int hq, int hk, int d, int block_size,
                     float scale, int64_t window, const float *sinks, float softcap, int threads);
int dop_paged_decode_q8(float *out, const float *q, int64_t q_stride, const int8_t *k_codes,
                        const uint16_t *k_scales, const int8_t *v_codes, const uint16_t *v_scales,
                        const int64_t *tables, int64_t table_stride, const int64_t *context, int batch, int hq,
                        int hk, int d, int block_size, float scale, int64_t window, const float *sinks,
                        float softcap, int threads);
int dop_decode_chunk_len(void);

#endif
