/* Vector maths shared by the C CPU kernels of Metrale's plugins (AVX512F).
 *
 * Owner: metrale_core.kernels (the include path of every C CPU library; see cpu.py).
 * Invariants: header-only, static inline; accurate to about 1 ulp over the float range; inputs
 * below -103.97 give 0 and above 88.38 give +inf, as expf does.
 */
#ifndef METRALE_CPU_MATH_H
#define METRALE_CPU_MATH_H

#include <immintrin.h>

/* exp(x) per lane: 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (Cody-Waite split), p the
 * degree-7 minimax polynomial of Cephes' expf. */
static inline __m512 mt_exp512(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-103.972077083991796f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* Lanes [0, n) of a 16-lane chunk (n <= 16). */
static inline __mmask16 mt_tail_mask(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

#endif
