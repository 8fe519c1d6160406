/* Entry point of kv_q8.c (q8_0 quantize-on-write into a paged KV cache): the one statement of its
 * C signature.
 *
 * Owner: metrale_core.layers.kv_q8_ops (Q8KVCacheWrite.forward_cpu).  kv_q8.c includes this file;
 * metrale_core.kernels.cpu parses it into the ctypes signature Python calls.
 *
 * Invariants: plain C declarations only (cffi's cdef dialect); returns 0, or -1 for arguments it
 * cannot take; pointers are raw tensor data pointers.
 */
#ifndef METRALE_KV_Q8_H
#define METRALE_KV_Q8_H

#include <stdint.h>

int q8_kv_write(const float *k, int64_t k_stride, const float *v, int64_t v_stride, int8_t *k_codes,
                uint16_t *k_scales, int8_t *v_codes, uint16_t *v_scales, const int64_t *slots, int tokens,
                int k_row, int v_row);

#endif
