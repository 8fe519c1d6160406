/* Reading a paged KV cache from the C CPU kernels: where a position's row lies and its elements
 * as float32 vectors, for every kernel that attends over the cache (decoder_ops.c's decode,
 * attention_prefill.c's tiled prefill).
 *
 * Owner: metrale_core.kernels (the include path of every C CPU library; see cpu.py).
 *
 * Invariants: header-only, static inline, over metrale_cpu_math.h's vectors (include it first).
 * Caches are [blocks, block_size, Hk, d] (contiguous), float32 or bfloat16; a block table maps a
 * sequence's block index to a block id; bfloat16 is widened exactly (the 16 bits shifted up).
 */
#ifndef METRALE_CPU_PAGED_H
#define METRALE_CPU_PAGED_H

#include <stdint.h>

/* Element offset of position t of KV head h in a [blocks, bs, Hk, d] cache. */
static inline int64_t cache_row(const int64_t *table, int64_t t, int block_size, int hk, int h, int d) {
    return ((table[t / block_size] * block_size + t % block_size) * hk + h) * d;
}

/* MT_LANES cache elements from offset e as float32 (bfloat16 widened exactly). */
static inline mt_vf load_cache(const void *cache, int64_t e, const int bf16) {
#if MT_LANES == 16
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + e))), 16));
#else
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)cache + e))), 16));
#endif
    return mt_load((const float *)cache + e);
}

#endif
