/* Entry points of bf16_matmul.c: the bfloat16-weight matmul with float32 results.
 *
 * Owner: metrale_core.layers.formats.cpu_qmatmul (qmatmul_bf16 calls mq_linear_bf16 on CPUs with
 * AVX512-BF16, mq_linear_bf16_fma elsewhere).  Parsed like qmatmul.h into the ctypes signatures.
 *
 * Invariants: plain C declarations only (cffi's cdef dialect); every ISA variant of the library
 * exports every function below except the one marked "avx512 only" (it needs AVX512-BF16; callers
 * check metrale_core.kernels.cpu.cpu_isa and the CPU flag avx512_bf16 first).
 */
#ifndef METRALE_BF16_MATMUL_H
#define METRALE_BF16_MATMUL_H

#include <stddef.h>
#include <stdint.h>

size_t mq_bf16_scratch_bytes(int R, int K);
int mq_linear_bf16_fma(const float *x, int R, int K, const uint16_t *w, int N, float *y, void *scratch,
                       int threads);
int mq_linear_bf16(const float *x, int R, int K, const uint16_t *w, int N, float *y, void *scratch,
                   int threads); /* avx512 only */

#endif
