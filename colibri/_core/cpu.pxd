cdef extern from "colibri/cpu.h" nogil:
    ctypedef enum cb_simd_level:
        CB_SIMD_SCALAR
        CB_SIMD_AVX2
        CB_SIMD_AVX512
        CB_SIMD_AVX512_VNNI
    cb_simd_level cb_cpu_detect()
    cb_simd_level cb_cpu_level()
    cb_simd_level cb_cpu_set_max_level(cb_simd_level cap)
    const char *cb_simd_level_str(cb_simd_level level)
    int cb_build_portable()
