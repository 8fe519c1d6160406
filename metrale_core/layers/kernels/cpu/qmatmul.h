/* Entry points of qmatmul.c (AVX512-VNNI / AMX) and qmatmul_avx2.c: the one statement of their C
 * signatures.
 *
 * Owner: metrale_qwen3.cpu_qmatmul.  Both C files include this file, so the compiler rejects a
 * definition that differs from it, and metrale_core.kernels.cpu parses it (cffi's C parser) into
 * the ctypes signatures Python calls through -- nothing copies these signatures by hand.
 *
 * Invariants: plain C declarations only (cffi's cdef dialect).  Every ISA variant of the library
 * exports every function below except those marked "avx512 only" (the bfloat16 matmul needs
 * AVX512-BF16; callers check metrale_core.kernels.cpu.cpu_isa first).
 */
#ifndef METRALE_QWEN3_QMATMUL_H
#define METRALE_QWEN3_QMATMUL_H

#include <stddef.h>
#include <stdint.h>

int mq_set_amx(int on);
size_t mq_scratch_bytes(int R, int K);
int mq_record_bytes(int bits);
int mq_linear(const float *x, int R, int K, const uint8_t *w, int N, int bits, float *y,
              void *scratch, int threads);
/* scratch: mq_bf16_scratch_bytes(R, K) of bf16_matmul.h; without AVX512-BF16: mq_linear_bf16_fma */
int mq_linear_bf16(const float *x, int R, int K, const uint16_t *w, int N, float *y, void *scratch,
                   int threads); /* avx512 only */

#endif
