/* Entry points of qmatmul.c (AVX512-VNNI / AMX) and qmatmul_avx2.c: the one statement of their C
 * signatures.
 *
 * Owner: metrale_qwen3.cpu_qmatmul.  Both C files include this file, so the compiler rejects a
 * definition that differs from it, and metrale_core.kernels.cpu parses it (cffi's C parser) into
 * the ctypes signatures Python calls through -- nothing copies these signatures by hand.
 *
 * Invariants: plain C declarations only (cffi's cdef dialect).  Every ISA variant of the library
 * exports every function below (the bfloat16 matmul: bf16_matmul.h).
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

#endif
