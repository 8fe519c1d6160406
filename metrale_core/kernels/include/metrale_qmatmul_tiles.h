/* metrale_qmatmul_tiles.h: the per-(kind, rows) tile functions and their dispatch table, shared by qmatmul.c,
 * qmatmul_avx2.c and gguf_qmatmul.c (one copy of the pattern instead of one per file).
 *
 * Owner: metrale_core.layers (its C kernels).  A kernel file defines MQ_TILE_ARGS (the parameter
 * list of a tile function) and MQ_TILE_BODY(KIND, ROWS) (a call of its always-inline tile routine
 * with constant kind and row count), then writes MQ_TILE_FNS(prefix, kind) once per kind and
 * `static const prefix_fn TABLE[][MQ_TILE_ROWS] = {MQ_TILE_ROW(prefix, kind), ...};`.  Each
 * function is a separate, fully unrolled instance, so a call of 1..MQ_TILE_ROWS rows runs code
 * specialised for that count; the per-row arithmetic is the same in every instance.
 *
 * Invariants: preprocessor macros only; it lives in metrale_core/kernels/include (on every CPU
 * build's include path) rather than next to the kernels, whose headers are parsed for entry points.
 */
#ifndef METRALE_QMATMUL_TILES_H
#define METRALE_QMATMUL_TILES_H

#define MQ_TILE_ROWS 4

#define MQ_TILE_FN(PREFIX, KIND, ROWS) \
    static void PREFIX##_##KIND##_##ROWS(MQ_TILE_ARGS) { MQ_TILE_BODY(KIND, ROWS); }

#define MQ_TILE_FNS(PREFIX, KIND) \
    MQ_TILE_FN(PREFIX, KIND, 1) MQ_TILE_FN(PREFIX, KIND, 2) MQ_TILE_FN(PREFIX, KIND, 3) MQ_TILE_FN(PREFIX, KIND, 4)

#define MQ_TILE_ROW(PREFIX, KIND) \
    { PREFIX##_##KIND##_1, PREFIX##_##KIND##_2, PREFIX##_##KIND##_3, PREFIX##_##KIND##_4 }

#endif
