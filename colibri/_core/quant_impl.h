/* Private declarations shared by the quant kernels (quant.c: types, scalar kernels, drivers;
 * quant_avx2.c + quant_avx2_k.c: AVX2 kernels; quant_avx512.c + quant_avx512_k.c: AVX-512
 * kernels, which reuse the AVX2 packed-row packing; each SIMD level is split per type family,
 * the K-quants in the *_k.c file, with its private helpers in quant_avx2_impl.h /
 * quant_avx512_impl.h). */
#ifndef COLIBRI_QUANT_IMPL_H
#define COLIBRI_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri/quant.h"

/* Software prefetch of the weight streams. Far ahead (tiles ahead, the next groups of a layout,
 * 4 KiB and more) into L2 only (prefetcht2): into L1 (prefetcht0) the lines arrive tens of KiB
 * before their loads, more than L1 holds, and each holds one of the core's few L1 miss buffers
 * for a DRAM latency; on the Zen4 VM of 2026-12-03 that capped the AVX-512 1-token tiles from
 * memory at 8-13 GB/s, where ggml's vec_dot read 20 and the same tiles with the L2 hint 20-25.
 * Near (the AVX2 decode walks, CB_DEC_PF_BYTES = 2 KiB ahead in the row) into L1: the L2 hint
 * made them 1.5x slower there (docs/benchmarks.md, "Prefetch hints"; the A/B:
 * tools/bench/vs_ggml_matvec.py --far-hint 3). */
#ifndef CB_PF_FAR_HINT
#define CB_PF_FAR_HINT 1
#endif
#define cb_prefetch_l2(p) __builtin_prefetch((p), 0, CB_PF_FAR_HINT)
#define cb_prefetch_l1(p) __builtin_prefetch((p), 0, 3)

#define CB_QK 32   /* values per block of the 32-blocks (Q4_0 ... MXFP4) */
#define CB_QKK 256 /* values per K-quant super-block */

/* Quantized activations for the 32-block weight types: q = round(x/d), d = max|x|/127,
 * isum = sum(q) (the zero point of Q4_0/Q5_0 is taken out as -8*isum / -16*isum), s = d*isum
 * (used by the offset m of Q4_1/Q5_1). */
typedef struct {
    float d;
    float s;
    int32_t isum;
    int8_t qs[CB_QK];
} cb_q8a_t;

/* Quantized activations for the K-quants: d = max|x|/127, q = round(x/d), bsums[g] = sum of the
 * q of values 16g..16g+15. */
typedef struct {
    float d;
    int16_t bsums[CB_QKK / 16];
    int8_t qs[CB_QKK];
} cb_q8k_t;

/* How a weight type wants its activations. */
typedef enum { CB_ACT_F32 = 0, CB_ACT_Q8A = 1, CB_ACT_Q8K = 2 } cb_act_kind;

/* The largest tile a kernel is asked for (rows x tokens); one token: up to CB_TILE_R1 rows (a
 * decode tile amortises its activation loads and reduction over more rows). */
#define CB_TILE_R 4
#define CB_TILE_T 4
#define CB_TILE_R1 8
/* floats of a tile's output: the larger of the two shapes */
#define CB_TILE_OUT (CB_TILE_R * CB_TILE_T > CB_TILE_R1 ? CB_TILE_R * CB_TILE_T : CB_TILE_R1)

/* out[r*nt + t] = dot(weight row r, activation row t), t < nt <= CB_TILE_T, r < nr <= CB_TILE_R
 * (nt == 1: nr <= CB_TILE_R1).
 * n: number of activation blocks per row (CB_ACT_F32: number of values).
 * w: first weight row, rows w_stride bytes apart; x: first activation row (quantized blocks or
 * floats), rows x_stride bytes apart. */
typedef void (*cb_tile_fn)(int64_t n, const uint8_t *w, size_t w_stride, int nr, const uint8_t *x,
                           size_t x_stride, int nt, float *out);

/* Quantizes n floats (a multiple of the activation block) to activation blocks at dst. */
typedef void (*cb_act_fn)(const float *x, int64_t n, void *dst);

/* AVX2 kernels (quant_avx2.c, the K-quants' in quant_avx2_k.c); NULL where a type has none. */
cb_tile_fn cb_avx2_tile(int type);
/* The same without batch invariance (partial sums in lanes; cb_matmul_opts_t.fast). */
cb_tile_fn cb_avx2_tile_fast(int type);
/* The low-bit types' tiles (quant_avx2_lowbit.c: every type of quant_lowbit.c and quant_iq.c;
 * NULL for the others): the scalar kernels' results bit for bit, for both of the above. */
cb_tile_fn cb_avx2_lowbit_tile(int type);
void cb_avx2_quantize_q8a(const float *x, int64_t n, void *dst);
void cb_avx2_quantize_q8k(const float *x, int64_t n, void *dst);

/* AVX2 packed-row matmul for the 32-block types (quant_avx2.c, see the comment there): rows are
 * unpacked 8 at a time into a group buffer (cb_avx2_rp_group_bytes, 32-byte aligned), then
 * cb_avx2_rp_tile computes those 8 rows against nt <= 4 tokens of activations quantized by
 * cb_avx2_rp_quantize (rows cb_avx2_rp_act_stride(cols) bytes apart, 32-byte aligned):
 * out[r*nt + t], r < 8 (rows past nr come out 0). */
int cb_avx2_rp_supported(int type);
size_t cb_avx2_rp_act_stride(int64_t cols);
size_t cb_avx2_rp_group_bytes(int type, int64_t cols);
void cb_avx2_rp_quantize(int type, const float *x, int64_t cols, uint8_t *dst);
void cb_avx2_rp_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst);
void cb_avx2_rp_tile(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                     int nt, float *out);

/* AVX-512 (F/BW/DQ/VL) kernels (quant_avx512.c, quant_avx512_k.c), used when
 * cb_cpu_level() >= CB_SIMD_AVX512: the same contracts as the AVX2 ones above.
 * cb_avx512_rp_tile reads groups packed by cb_avx2_rp_pack and activations laid out as
 * cb_avx2_rp_quantize's (cb_avx512_rp_quantize writes the same bytes). Compiled with
 * CB_AVX512_EMULATE (tests), the same sources define cb_avx512emu_* instead, on SIMDe. */
cb_tile_fn cb_avx512_tile(int type);
/* The batch-invariant AVX-512 direct tiles (the AVX2 invariant tiles' results bit for bit): the
 * K-quants', and with vnni (cb_cpu_level() == CB_SIMD_AVX512_VNNI) the 32-block types' (not
 * I4_G128); NULL for the other types. */
cb_tile_fn cb_avx512_tile_invariant(int type, int vnni);
/* The low-bit types' AVX-512 tiles (quant_avx512_lowbit.c; NULL for a type without one), with
 * vnni the AVX512-VNNI ones: the scalar kernels' results bit for bit, for both of the above. */
cb_tile_fn cb_avx512_lowbit_tile(int type, int vnni);
void cb_avx512_quantize_q8a(const float *x, int64_t n, void *dst);
void cb_avx512_quantize_q8k(const float *x, int64_t n, void *dst);
void cb_avx512_rp_quantize(int type, const float *x, int64_t cols, uint8_t *dst);
void cb_avx512_rp_tile(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                       int nt, float *out);
/* The same tile with AVX512-VNNI (cb_cpu_level() == CB_SIMD_AVX512_VNNI): bit-identical
 * results. */
void cb_avx512_rp_tile_vnni(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                            int nt, float *out);
/* Attention's score rows (ops_avx512.c, for ops.c): the 8-lane partial sums t of 8 rows of k
 * (f32, or f16 widened) against n_q heads, in the AVX2 kernel's order; ops.c reduces them. */
void cb_avx512_dot_rows8_t(const float *q, int64_t q_stride, int n_q, const float *k,
                           int64_t k_stride, int64_t n, float *t);
void cb_avx512_dot_rows8_t_f16(const float *q, int64_t q_stride, int n_q, const uint16_t *k,
                               int64_t k_stride, int64_t n, float *t);

/* 16-row groups for the AVX512-VNNI packed tile of the 32-block types (quant_avx2.c): the
 * 8-row layout with 64-byte steps (rows 0..7 low, 8..15 high), d[16] (m[16]), Q8_0 as w + 128. */
size_t cb_avx2_rp16_group_bytes(int type, int64_t cols);
void cb_avx2_rp16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst);
/* Its tile (quant_avx512.c): 16 rows x nt <= 8 tokens, out[r*nt + t]; bit-identical to the
 * 8-row tiles. */

/* Bytes per block of a 16-row group (the packing and the tiles read this one definition): the
 * 32-block types 8 steps of 64 bytes, d[16] (and m[16] for Q4_1/Q5_1); the K-quants per
 * super-block 64 steps of 64 bytes, NS = 16 (Q6_K) or 8 scale vectors of 16 int32, 8 min vectors
 * of 16 int16 pairs, d[16] and dmin[16]. */
static inline size_t cb_rp16_bstride(int type) {
    switch (type) {
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K: return 4096 + 8 * 64 + 512 + 128;
    case CB_TYPE_Q6_K: return 4096 + 16 * 64 + 512 + 128;
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q5_1: return 512 + 64 + 64;
    default: return 512 + 64;
    }
}
void cb_avx512_rp16_tile_vnni(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                              size_t xs, int nt, float *out);
/* The R16 layouts' tile (quant_avx512.c, the K layouts' in quant_avx512_k.c): a group of 16
 * rows read in place against nt tokens, out[r*nt + t]: Q8_0_R16 / Q5_0_R16 nt <= 8 rows of
 * packed-row activations of the source type, Q6_K_R16 / Q4_K_R16 nt <= 4 cb_q8k_t rows. */
void cb_avx512_r16_tile_vnni(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                             size_t xs, int nt, float *out);
/* The same packing with AVX-512 (quant_avx512_pack.c; cb_cpu_level() >= CB_SIMD_AVX512): the
 * same bytes, cb_avx2_rp16_pack for the types it does not cover. */
void cb_avx512_rp16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst);

/* The packed-row path of a type at a SIMD level (cb_rp_kernel, quant.c; rows == 0: none): groups
 * of `rows` weight rows are packed once by `pack` into group_bytes(type, cols) bytes (64-byte
 * aligned), then `tile` computes a group against nt <= `tokens` activation rows (laid out by
 * cb_avx2_rp_quantize for the 32-block types, as cb_q8k_t for the K-quants): out[r*nt + t],
 * r < rows (rows past the packed nr come out 0). */
typedef struct {
    int rows, tokens;
    size_t (*group_bytes)(int type, int64_t cols);
    void (*pack)(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst);
    void (*tile)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs, int nt,
                 float *out);
} cb_rp_kernel_t;
cb_rp_kernel_t cb_rp_kernel(int type, int simd_level);
#define CB_RP_MAX_ROWS 16
#define CB_RP_MAX_TOKENS 8

/* The packed-row activations' per-block z*isum multiplier: the packed weights' zero point (8
 * for Q4_0/I4_G128, 16 for Q5_0, 12 for MXFP4), 128 for Q8_0 (the VNNI tile's w + 128; the
 * other Q8_0 tiles do not read it), else 0. */
static inline int cb_rp_act_z(int type) {
    switch (type) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_I4_G128: return 8;
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_0_R16: return 16;
    case CB_TYPE_MXFP4: return 12;
    case CB_TYPE_Q8_0:
    case CB_TYPE_Q8_0_R16: return 128;
    default: return 0;
    }
}

/* The scalar reference kernels (quant.c), for tests of the SIMD ones: dot(weight row w,
 * activation row x) with n as for cb_tile_fn; NULL for a type without kernels. */
typedef float (*cb_dot_fn)(int64_t n, const uint8_t *w, const uint8_t *x);
cb_dot_fn cb_scalar_dot(int type);
void cb_scalar_quantize_q8a(const float *x, int64_t n, void *dst);
void cb_scalar_quantize_q8k(const float *x, int64_t n, void *dst);

/* The low-bit types' scalar kernels (Q2_K, Q3_K, Q8_K, TQ1_0, TQ2_0 in quant_lowbit.c, the
 * i-quants in quant_iq.c): a block's dequantizer (gguf-py's float order) and the dot product
 * (cb_dot_fn; activations cb_q8k_t, IQ4_NL's cb_q8a_t); NULL for other types. cb_lowbit_* cover
 * both files. */
typedef void (*cb_deq_fn)(const uint8_t *b, float *y);
cb_deq_fn cb_lowbit_deq(int type);
cb_dot_fn cb_lowbit_dot(int type);
cb_deq_fn cb_iq_deq(int type);
cb_dot_fn cb_iq_dot(int type);

static inline uint16_t cb_rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t cb_rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Q4_K/Q5_K: the 12 packed scale bytes -> bytes sc[0..7] (u[0..1]) and m[0..7] (u[2..3]), 6 bits
 * each (see cb_scale_min_k4), with 32-bit word operations; shared by the SIMD kernels. */
static inline void cb_k4_scale_words(const uint8_t *p12, uint32_t u[4]) {
    memcpy(u, p12, 12);
    u[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    uint32_t m_lo = u[1] & 0x3F3F3F3Fu;
    u[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = m_lo;
    u[0] &= 0x3F3F3F3Fu;
}

/* MXFP4's e8m0 scale halved (the kvalues table is doubled): 2^(e-128), exact for every e. */
static inline float cb_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? (uint32_t)0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

extern const int8_t cb_mxfp4_values[16];

/* Q6_K value i (signed, -32..31) = 128h + 32k + l: low 4 bits from ql[64h + 32(k&1) + l] (low
 * nibble for k<2, high for k>=2), high 2 bits from qh[32h + l] >> 2k. */
static inline int cb_q6k_value(const uint8_t *ql, const uint8_t *qh, int i) {
    int h = i >> 7, k = (i >> 5) & 3, l = i & 31;
    int lo = (ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0x0F;
    int hi = (qh[32 * h + l] >> (2 * k)) & 3;
    return (lo | hi << 4) - 32;
}

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes. */
static inline void cb_scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

#endif
