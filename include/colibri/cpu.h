/* CPU feature detection for run-time kernel dispatch, and the SIMD level in use.
 *
 * Kernels are compiled per function for several instruction sets (target attributes) and the
 * best one the CPU supports is chosen at run time, so a COLIBRI_PORTABLE build still uses
 * AVX2/AVX-512 where the machine has them. cb_cpu_set_max_level() caps the choice (tests use
 * it to exercise the scalar path).
 */
#ifndef COLIBRI_CPU_H
#define COLIBRI_CPU_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cb_simd_level {
    CB_SIMD_SCALAR = 0,
    CB_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    CB_SIMD_AVX512 = 2, /* AVX-512 F, BW, DQ, VL */
    CB_SIMD_AVX512_VNNI = 3, /* the above + AVX512-VNNI (vpdpbusd: the packed-row tiles) */
} cb_simd_level;

/* Best level the CPU supports (ignores the cap). */
cb_simd_level cb_cpu_detect(void);

/* Level the kernels use now: min(detected, cap). */
cb_simd_level cb_cpu_level(void);

/* Caps the level the kernels choose; returns the previous cap. Not thread-safe with respect to
 * kernels already running: call it between operations. */
cb_simd_level cb_cpu_set_max_level(cb_simd_level cap);

/* Static name of a level: "scalar", "avx2", "avx512", "avx512vnni". */
const char *cb_simd_level_str(cb_simd_level level);

/* Non-zero when the build was compiled with COLIBRI_PORTABLE=1. */
int cb_build_portable(void);

#ifdef __cplusplus
}
#endif
#endif
