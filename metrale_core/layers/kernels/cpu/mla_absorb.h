/* Entry point of mla_absorb.c (MLA's per-head absorption products on CPU); see that file.
 *
 * Owner: metrale_core.layers.mla.  metrale_core.kernels.cpu parses this file into the ctypes
 * signatures.  Invariants: plain C declarations only (cffi's cdef dialect).
 */
#ifndef METRALE_MLA_ABSORB_H
#define METRALE_MLA_ABSORB_H

#include <stdint.h>

int mt_head_matmul(const float *x, int64_t x_row_stride, int64_t x_head_stride, const float *w,
                   float *out, int T, int H, int K, int N, int threads);

#endif
