/* Entry points of decoder_ops.c: the one statement of their C signatures.
 *
 * Owner: metrale_qwen3.ops.  decoder_ops.c includes this file, so the compiler rejects a
 * definition that differs from it, and metrale_core.kernels.cpu parses it (cffi's C parser) into
 * the ctypes signatures Python calls through -- nothing copies these signatures by hand.
 *
 * Invariants: plain C declarations only (cffi's cdef dialect: no macros in declarations); every
 * function returns 0, or -1 for arguments it cannot take; pointers are raw tensor data pointers.
 */
#ifndef METRALE_QWEN3_DECODER_OPS_H
#define METRALE_QWEN3_DECODER_OPS_H

#include <stdint.h>

int dop_rms_norm(const float *x, int64_t x_stride, const float *w, float *out, int rows, int dim,
                 float eps, int threads);
int dop_qk_norm_rope(float *q, int64_t q_stride, int hq, float *k, int64_t k_stride, int hk,
                     int tokens, int d, const float *qw, const float *kw, const float *cos,
                     const float *sin, float eps, int threads);
int dop_swiglu(const float *gu, float *out, int rows, int inter, int threads);
int dop_kv_write(const float *k, int64_t k_stride, const float *v, int64_t v_stride, void *k_cache,
                 void *v_cache, const int64_t *slots, int tokens, int row, int bf16);
int dop_rows_matmul(const float *x, int64_t x_stride, const float *w, float *out, int rows, int n, int k,
                    int threads);

#endif
