/* Vector maths shared by the C CPU kernels of Metrale's plugins, for each ISA variant they are
 * built for (see metrale_core/kernels/cpu.py): AVX512F (16 float lanes) or AVX2 + FMA (8 lanes).
 *
 * Owner: metrale_core.kernels (the include path of every C CPU library; see cpu.py).
 * Kernels written over mt_vf / MT_LANES / mt_* compile for both variants unchanged; the variant
 * is chosen by the compiler flags (__AVX512F__ defined or not).
 *
 * Invariants: header-only, static inline; mt_exp is accurate to about 1 ulp over the float range;
 * inputs below -103.97 give 0 and above 88.38 give +inf, as expf does, and both variants give
 * the same bits for the same input.  mt_tail_mask(n) selects lanes [0, n) of one vector;
 * masked loads never touch memory outside the selected lanes.
 */
#ifndef METRALE_CPU_MATH_H
#define METRALE_CPU_MATH_H

#include <immintrin.h>
#include <stdint.h>

/* Horizontal reductions of one 256-bit vector, in both variants (AVX512F implies AVX2): for
 * kernels written over __m256 whatever the build's widest vector is. */
static inline float mt256_reduce_add(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float mt256_reduce_max(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline int mt256_reduce_add_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* The four bytes at p (any alignment) in every 32-bit lane: the activation operand of the int8
 * dot-product kernels (one group of 4 k against 8 or 16 channels). */
static inline __attribute__((always_inline)) __m256i mt256_bcast4(const void *p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Loads the 32 floats at x (one quantization block) into v[0..3]; returns their largest magnitude. */
static inline __attribute__((always_inline)) float mt256_load32_amax(const float *x, __m256 v[4]) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_and_ps(v[i], abs_mask));
    }
    return mt256_reduce_max(mx);
}

/* The 8 code vectors (one per group of 4 k) of half h (channels 8h..8h+7) of a packed-code record
 * of the qmatmul kernels (qmatmul_avx2.c, gguf_qmatmul.c): 4-bit codes are 4 runs of 64 bytes,
 * groups 0-3 in the low nibbles and 4-7 in the high ones; 8-bit codes are 8 runs of 64 bytes. */
static inline __attribute__((always_inline)) void mt256_load_codes(const uint8_t *p, int bits, int h, __m256i w[8]) {
    if (bits == 4) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * j + 32 * h));
            w[j] = _mm256_and_si256(v, low4);
            w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
    } else {
        for (int g = 0; g < 8; g++) w[g] = _mm256_loadu_si256((const __m256i *)(p + 64 * g + 32 * h));
    }
}

/* The exact int32 dot products (8 channels) of code groups g0..g1-1 of w (mt256_load_codes) with
 * the int8 activations q: 4-bit codes are unsigned, 8-bit ones signed. */
static inline __attribute__((always_inline)) __m256i mt256_codes_dot(const __m256i w[8], const int8_t *q, int bits,
                                                                     int g0, int g1) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    if (bits == 4) {  /* pairs <= 3840, eight groups <= 30720: int16 holds them */
        for (int g = g0; g < g1; g++) acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(w[g], mt256_bcast4(q + 4 * g)));
        return _mm256_madd_epi16(acc, ones16);
    }
    for (int g = g0; g < g1; g++) {  /* |w| <= 128, |q| <= 127: a pair fits int16 */
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w[g]), _mm256_sign_epi8(mt256_bcast4(q + 4 * g), w[g]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones16));
    }
    return acc;
}

#if defined(__AVX512F__)

static inline __attribute__((always_inline)) __m512i mt512_bcast4(const void *p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

#define MT_LANES 16
typedef __m512 mt_vf;
typedef __mmask16 mt_mask;

/* Lanes [0, n) of a 16-lane chunk (n <= 16). */
static inline mt_mask mt_tail_mask(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}
static inline mt_vf mt_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void mt_store(float *p, mt_vf v) { _mm512_storeu_ps(p, v); }
static inline mt_vf mt_maskz_load(mt_mask m, const float *p) { return _mm512_maskz_loadu_ps(m, p); }
/* Lanes outside m keep src. */
static inline mt_vf mt_mask_load(mt_vf src, mt_mask m, const float *p) { return _mm512_mask_loadu_ps(src, m, p); }
static inline void mt_mask_store(float *p, mt_mask m, mt_vf v) { _mm512_mask_storeu_ps(p, m, v); }
static inline mt_vf mt_maskz_mov(mt_mask m, mt_vf v) { return _mm512_maskz_mov_ps(m, v); }
static inline mt_vf mt_set1(float x) { return _mm512_set1_ps(x); }
static inline mt_vf mt_zero(void) { return _mm512_setzero_ps(); }
static inline mt_vf mt_add(mt_vf a, mt_vf b) { return _mm512_add_ps(a, b); }
static inline mt_vf mt_sub(mt_vf a, mt_vf b) { return _mm512_sub_ps(a, b); }
static inline mt_vf mt_mul(mt_vf a, mt_vf b) { return _mm512_mul_ps(a, b); }
static inline mt_vf mt_div(mt_vf a, mt_vf b) { return _mm512_div_ps(a, b); }
static inline mt_vf mt_max(mt_vf a, mt_vf b) { return _mm512_max_ps(a, b); }
static inline mt_vf mt_min(mt_vf a, mt_vf b) { return _mm512_min_ps(a, b); }
static inline mt_vf mt_fmadd(mt_vf a, mt_vf b, mt_vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline mt_vf mt_fnmadd(mt_vf a, mt_vf b, mt_vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline float mt_reduce_add(mt_vf v) { return _mm512_reduce_add_ps(v); }
static inline float mt_reduce_max(mt_vf v) { return _mm512_reduce_max_ps(v); }
static inline mt_vf mt_round(mt_vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^n for integral n in [-150, 128]. */
static inline mt_vf mt_scale2(mt_vf p, mt_vf n) { return _mm512_scalef_ps(p, n); }

#elif defined(__AVX2__) && defined(__FMA__)

#define MT_LANES 8
typedef __m256 mt_vf;
typedef __m256i mt_mask; /* all-ones lanes are selected */

/* Lanes [0, n) of an 8-lane chunk (n <= 8). */
static inline mt_mask mt_tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline mt_vf mt_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void mt_store(float *p, mt_vf v) { _mm256_storeu_ps(p, v); }
static inline mt_vf mt_maskz_load(mt_mask m, const float *p) { return _mm256_maskload_ps(p, m); }
static inline mt_vf mt_mask_load(mt_vf src, mt_mask m, const float *p) {
    return _mm256_blendv_ps(src, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
static inline void mt_mask_store(float *p, mt_mask m, mt_vf v) { _mm256_maskstore_ps(p, m, v); }
static inline mt_vf mt_maskz_mov(mt_mask m, mt_vf v) { return _mm256_and_ps(v, _mm256_castsi256_ps(m)); }
static inline mt_vf mt_set1(float x) { return _mm256_set1_ps(x); }
static inline mt_vf mt_zero(void) { return _mm256_setzero_ps(); }
static inline mt_vf mt_add(mt_vf a, mt_vf b) { return _mm256_add_ps(a, b); }
static inline mt_vf mt_sub(mt_vf a, mt_vf b) { return _mm256_sub_ps(a, b); }
static inline mt_vf mt_mul(mt_vf a, mt_vf b) { return _mm256_mul_ps(a, b); }
static inline mt_vf mt_div(mt_vf a, mt_vf b) { return _mm256_div_ps(a, b); }
static inline mt_vf mt_max(mt_vf a, mt_vf b) { return _mm256_max_ps(a, b); }
static inline mt_vf mt_min(mt_vf a, mt_vf b) { return _mm256_min_ps(a, b); }
static inline mt_vf mt_fmadd(mt_vf a, mt_vf b, mt_vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline mt_vf mt_fnmadd(mt_vf a, mt_vf b, mt_vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline float mt_reduce_add(mt_vf v) { return mt256_reduce_add(v); }
static inline float mt_reduce_max(mt_vf v) { return mt256_reduce_max(v); }
static inline mt_vf mt_round(mt_vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^e for integral e in [-126, 127], as float bits. */
static inline mt_vf mt_pow2i(mt_vf e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(e), _mm256_set1_epi32(127)), 23));
}
/* p * 2^n for integral n in [-150, 128], in two exact steps of 2^(n/2) so that neither power
 * leaves the normal range; the last product rounds once, as scalef does. */
static inline mt_vf mt_scale2(mt_vf p, mt_vf n) {
    const mt_vf half = _mm256_floor_ps(_mm256_mul_ps(n, _mm256_set1_ps(0.5f)));
    return _mm256_mul_ps(_mm256_mul_ps(p, mt_pow2i(half)), mt_pow2i(_mm256_sub_ps(n, half)));
}

#else
#error "metrale_cpu_math.h needs AVX512F, or AVX2 and FMA (see metrale_core/kernels/cpu.py)"
#endif

/* exp(x) per lane: 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (Cody-Waite split), p the
 * degree-7 minimax polynomial of Cephes' expf. */
static inline mt_vf mt_exp(mt_vf x) {
    x = mt_min(x, mt_set1(88.3762626647949f));
    x = mt_max(x, mt_set1(-103.972077083991796f));
    const mt_vf n = mt_round(mt_mul(x, mt_set1(1.44269504088896341f)));
    mt_vf r = mt_fnmadd(n, mt_set1(0.693359375f), x);
    r = mt_fnmadd(n, mt_set1(-2.12194440e-4f), r);
    mt_vf p = mt_set1(1.9875691500e-4f);
    p = mt_fmadd(p, r, mt_set1(1.3981999507e-3f));
    p = mt_fmadd(p, r, mt_set1(8.3334519073e-3f));
    p = mt_fmadd(p, r, mt_set1(4.1665795894e-2f));
    p = mt_fmadd(p, r, mt_set1(1.6666665459e-1f));
    p = mt_fmadd(p, r, mt_set1(5.0000001201e-1f));
    p = mt_fmadd(p, mt_mul(r, r), mt_add(r, mt_set1(1.0f)));
    return mt_scale2(p, n);
}

#endif
