/* Entry point of lora_apply.c (batched multi-LoRA on CPU); see that file for the layout.
 *
 * Owner: metrale_core.layers.lora.  metrale_core.kernels.cpu parses this file into the ctypes
 * signatures.  Invariants: plain C declarations only (cffi's cdef dialect).
 */
#ifndef METRALE_LORA_APPLY_H
#define METRALE_LORA_APPLY_H

#include <stdint.h>

int mt_lora_apply(const float *x, int K, const int64_t *order, const int64_t *starts, int S, const float *a,
                  const float *bt, int W, int N, const int32_t *part_cols, int P, const int32_t *part_out, float *y,
                  float *scratch, int threads);
/* ROWS: rows of one slot mt_lora_apply multiplies together; scratch holds threads * ROWS * W floats. */
int mt_lora_rows(void);

#endif
