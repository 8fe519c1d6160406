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
 * Invariants: preprocessor macros only (MQ_RECORD_* expand to code only where a kernel writes them); it lives in metrale_core/kernels/include (on every CPU
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

/* The packed-record kernels qmatmul.c and qmatmul_avx2.c share one tile signature: each defines
 * `tile_rows(rec, nb, bits, qa, da, sa, K, rows, y, ldy)` (always inline), then
 * `#define MQ_TILE_ARGS MQ_RECORD_TILE_ARGS`, `#define MQ_TILE_BODY MQ_RECORD_TILE_BODY` and writes
 * `MQ_RECORD_TILE_TABLE;` once: the functions tile_<bits>_<rows> and TILE_FNS[bits == 8][rows - 1]. */
#define MQ_RECORD_TILE_ARGS \
    const uint8_t *rec, int nb, const int8_t *qa, const float *da, const float *sa, int K, float *y, int ldy
#define MQ_RECORD_TILE_BODY(BITS, ROWS) tile_rows(rec, nb, BITS, qa, da, sa, K, ROWS, y, ldy)
#define MQ_RECORD_TILE_TABLE                          \
    MQ_TILE_FNS(tile, 4) MQ_TILE_FNS(tile, 8)         \
    typedef void (*tile_fn)(MQ_TILE_ARGS);            \
    static const tile_fn TILE_FNS[2][MQ_TILE_ROWS] = {MQ_TILE_ROW(tile, 4), MQ_TILE_ROW(tile, 8)}

#endif
