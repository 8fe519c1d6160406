// bf16 carried as raw bits, and float <-> bf16 conversion, for every plugin's kernels.
//
// Owner: metrale_core/kernels/include (the core's shared device headers).  A plugin header or
// kernel includes it by its quoted name, "metrale_bf16.cuh": metrale_core.kernels.cuda's
// expand_includes (what NVRTC compiles at run time) and metrale_core.kernels.ptx's compile_ptx
// (nvcc -I) both resolve it here when no file of that name sits beside the including one.  No
// system headers (no cuda_bf16.h), so NVRTC compiles it as is.
//
// Invariants: bf16 is a struct of its raw 16 bits; to_float(bf16) is exact; from_float<bf16>
// rounds to nearest even (the rounding torch uses) and turns every NaN into the quiet NaN 0x7fc0;
// to_float(float) and from_float<float> are identities, so kernels templated on T build for both.
// Include-guarded: a translation unit may reach it through several headers and gets it once.
#ifndef METRALE_BF16_CUH
#define METRALE_BF16_CUH

struct bf16 {
    unsigned short bits;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) {
    return __uint_as_float(((unsigned int)x.bits) << 16);
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) {
    unsigned int u = __float_as_uint(x);
    bf16 out;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
        out.bits = 0x7fc0u;
        return out;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    out.bits = (unsigned short)(u >> 16);
    return out;
}

#endif  // METRALE_BF16_CUH
