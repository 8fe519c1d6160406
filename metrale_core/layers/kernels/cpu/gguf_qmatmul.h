/* Entry points of gguf_qmatmul.c (the GGUF block kernels); see that file for the layout.
 *
 * Owner: metrale_core.layers.gguf_linear.  metrale_core.kernels.cpu parses this file into the
 * ctypes signatures.  Invariants: plain C declarations only (cffi's cdef dialect); every ISA
 * variant of the library exports all of them (the AVX512 build compiles the AVX2 code).
 */
#ifndef METRALE_GGUF_QMATMUL_H
#define METRALE_GGUF_QMATMUL_H

#include <stddef.h>
#include <stdint.h>

int mq_gguf_record_bytes(int kind);
size_t mq_gguf_scratch_bytes(int R, int K);
int mq_gguf_linear(const float *x, int R, int K, const uint8_t *w, int N, int kind, int fine, float *y,
                   void *scratch, int threads);

#endif
