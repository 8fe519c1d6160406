// Shared device helpers of the metrale_fp8 kernels (no system headers, so NVRTC compiles it).
//
// Owner: metrale_fp8/kernels.  Invariants: E4M3FN is encoded in software exactly as
// cvt.rn.satfinite.e4m3 does (round-to-nearest-even, saturate to +-448, NaN stays NaN) and as
// metrale_fp8.e4m3.quantize does in torch; bf16 (raw bits, round-to-nearest-even) comes from the
// core's metrale_bf16.cuh, and neg_inf / warp_sum from the core's metrale_reduce.cuh (both in
// metrale_core/kernels/include), never a copy here.
#ifndef METRALE_FP8_COMMON_CUH
#define METRALE_FP8_COMMON_CUH

#include "metrale_bf16.cuh"
#include "metrale_reduce.cuh"

#define FP8_E4M3_MAX 448.0f

// float -> E4M3FN code: RNE, saturating (|x| > 448 and +-inf -> +-448), NaN -> NaN.
__device__ __forceinline__ unsigned char e4m3_from_float(float x) {
    const unsigned int u = __float_as_uint(x);
    const unsigned char sign = (unsigned char)((u >> 24) & 0x80u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned char)(sign | 0x7fu);
    const float a = fminf(fabsf(x), FP8_E4M3_MAX);
    if (a < 0.015625f) {  // below the smallest normal 2^-6: subnormal steps of 2^-9
        return (unsigned char)(sign | (unsigned char)rintf(a * 512.0f));  // 8 -> 0x08, the min normal
    }
    const unsigned int ua = __float_as_uint(a);
    int e = (int)(ua >> 23) - 127 + 7;  // biased E4M3 exponent, 1..15
    const unsigned int mant = ua & 0x7fffffu;
    const unsigned int rounded = mant + 0x7ffffu + ((mant >> 20) & 1u);  // RNE to 3 bits
    if (rounded & 0x800000u) e += 1;  // carried into the exponent (a <= 448 keeps e <= 15)
    return (unsigned char)(sign | (e << 3) | ((rounded >> 20) & 7u));
}

// E4M3FN code -> float.
__device__ __forceinline__ float e4m3_to_float(unsigned char b) {
    const unsigned int sign = ((unsigned int)b & 0x80u) << 24;
    const unsigned int e = (b >> 3) & 0xfu;
    const unsigned int m = b & 7u;
    if (e == 15u && m == 7u) return __uint_as_float(0x7fc00000u | sign);
    const float mag = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return sign ? -mag : mag;
}

#endif  // METRALE_FP8_COMMON_CUH
