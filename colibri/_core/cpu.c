/* Run-time CPU feature detection (x86-64 via __builtin_cpu_supports; other machines: scalar).
 * The cap is a process-wide atomic so every kernel sees the same choice. */
#include "colibri/cpu.h"

#include <stdatomic.h>

static atomic_int max_level = CB_SIMD_AVX512_VNNI;

cb_simd_level cb_cpu_detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    /* every SIMD level's kernels convert f16 with F16C (scales, the f16 KV cache) */
    const int f16c = __builtin_cpu_supports("f16c");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("fma") && f16c)
        return __builtin_cpu_supports("avx512vnni") ? CB_SIMD_AVX512_VNNI : CB_SIMD_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
        return CB_SIMD_AVX2;
#endif
    return CB_SIMD_SCALAR;
}

cb_simd_level cb_cpu_level(void) {
    static int detected = -1;
    if (detected < 0) detected = (int)cb_cpu_detect(); /* idempotent: a race writes the same */
    int cap = atomic_load(&max_level);
    return (cb_simd_level)(detected < cap ? detected : cap);
}

cb_simd_level cb_cpu_set_max_level(cb_simd_level cap) {
    if (cap < CB_SIMD_SCALAR) cap = CB_SIMD_SCALAR;
    if (cap > CB_SIMD_AVX512_VNNI) cap = CB_SIMD_AVX512_VNNI;
    return (cb_simd_level)atomic_exchange(&max_level, (int)cap);
}

const char *cb_simd_level_str(cb_simd_level level) {
    switch (level) {
    case CB_SIMD_SCALAR: return "scalar";
    case CB_SIMD_AVX2: return "avx2";
    case CB_SIMD_AVX512: return "avx512";
    case CB_SIMD_AVX512_VNNI: return "avx512vnni";
    }
    return "unknown";
}

int cb_build_portable(void) {
#ifdef CB_PORTABLE
    return 1;
#else
    return 0;
#endif
}
