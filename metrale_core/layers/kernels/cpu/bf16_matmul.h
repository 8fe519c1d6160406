/* Entry points of bf16_matmul.c: the bfloat16-weight matmul without AVX512-BF16.
 *
 * Owner: metrale_core.layers.formats.cpu_qmatmul (qmatmul_bf16 calls it where the CPU lacks
 * AVX512-BF16, and in the AVX2 build).  Parsed like qmatmul.h into the ctypes signatures.
 *
 * Invariants: plain C declarations only (cffi's cdef dialect); every ISA variant of the library
 * exports both functions.
 */
#ifndef METRALE_BF16_MATMUL_H
#define METRALE_BF16_MATMUL_H

#include <stddef.h>
#include <stdint.h>

size_t mq_bf16_scratch_bytes(int R, int K);
int mq_linear_bf16_fma(const float *x, int R, int K, const uint16_t *w, int N, float *y, void *scratch,
                       int threads);

#endif
