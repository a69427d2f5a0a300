/* GGUF block types and the CPU kernels that compute on them as stored: dequantize, embedding
 * row lookup, and matrix products (matvec for decode, matmul for a batch of tokens).
 *
 * Types. cb_type uses GGML's ids (the `type` field of a GGUF tensor), so a GGUF tensor's type
 * can be passed through unchanged. A type is a run of blocks: block_size values stored in
 * block_bytes bytes (F32/F16/BF16: blocks of one value). Layouts are GGML's (ggml-common.h):
 *   Q4_0  {f16 d; u8 qs[16]}               v = d*(q-8), q = nibble; value j<16 is the low
 *                                           nibble of qs[j], value j+16 its high nibble
 *   Q4_1  {f16 d, m; u8 qs[16]}            v = d*q + m
 *   Q5_0  {f16 d; u32 qh; u8 qs[16]}       q = nibble | (bit j of qh) << 4, v = d*(q-16)
 *   Q5_1  {f16 d, m; u32 qh; u8 qs[16]}    v = d*q + m
 *   Q8_0  {f16 d; i8 qs[32]}               v = d*q
 *   MXFP4 {u8 e; u8 qs[16]}                v = 2^(e-128) * K[nibble], K = doubled e2m1 values
 *                                           {0,1,2,3,4,6,8,12,0,-1,-2,-3,-4,-6,-8,-12}
 *   Q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}  256 values in 8 sub-blocks of 32 with
 *         6-bit scale sc_j and min m_j: v = d*sc_j*q - dmin*m_j; qs[32c..32c+31] hold
 *         sub-block 2c in the low and 2c+1 in the high nibbles
 *   Q5_K  {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}  as Q4_K, bit j of qh[l] is
 *         bit 4 of value l of sub-block j
 *   Q6_K  {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}  v = d*scales[i/16]*(q-32), 6-bit q
 * The low-bit types (256 values a block unless said; bit-level details in quant_lowbit.c and
 * quant_iq.c, whose comments give every index):
 *   Q2_K  {u8 scales[16]; u8 qs[64]; f16 d, dmin}   2-bit q, v = d*(sc&15)*q - dmin*(sc>>4)
 *   Q3_K  {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}  3-bit q-4, 6-bit scales - 32
 *   Q8_K  {f32 d; i8 qs[256]; i16 bsums[16]}        v = d*q
 *   TQ1_0 {u8 qs[48]; u8 qh[4]; f16 d}  TQ2_0 {u8 qs[64]; f16 d}  ternary: v = d*(-1|0|1)
 *   IQ2_XXS {f16 d; u16 qs[32]}  IQ2_XS {f16 d; u16 qs[32]; u8 sc[8]}  IQ2_S {f16 d; u8 qs[32],
 *         signs[32], qh[8], sc[8]}: 8-value lattice entries (8, 25, 43) with signs, 4-bit scales
 *   IQ3_XXS {f16 d; u8 qs[64]; u32 sc[8]}  IQ3_S {f16 d; u8 qs[64], qh[8], signs[32], sc[4]}:
 *         4-value lattice entries with signs
 *   IQ1_S {f16 d; u8 qs[32]; u16 qh[8]}  IQ1_M {u8 qs[32], qh[16]; u16 sc[4]}: 8-value
 *         entries of -1, 0, 1 shifted by +-1/8
 *   IQ4_NL {f16 d; u8 qs[16]} (32 values)  IQ4_XS {f16 d; u16 sh; u8 sl[4]; u8 qs[128]}:
 *         v = d*K[nibble] (IQ4_XS: times a 6-bit scale - 32 per 32), K 16 non-uniform values
 * The grids are data from the gguf package (quant_iq_tables.h, tools/gen_iq_tables.py).
 *
 * One type is colibri's own, not GGML's: I4_G128 ("int4-g128", the GPU expert kernels' format,
 * cuda/moe_gemm.cu), id 1024 (GGML's ids are < 64, so a GGUF never names it; only colibri
 * containers hold it):
 *   I4_G128 {f16 d; u8 qs[64]}              128 values, v = d*(q-8), q = nibble; byte i holds
 *                                           value 2i in its low and 2i+1 in its high nibble
 * (the GPU layout keeps the same nibbles and scales in two separate arrays per matrix).
 *
 * Activations (the x of W·x). Like llama.cpp, cb_matmul quantizes the activations once per
 * call, then multiplies integer blocks:
 *   - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, I4_G128 weights: x in blocks of 32 as int8 with an
 *     f32 scale (d = max|x|/127, q = round(x/d)) and d*sum(q) for the offset (m) of Q4_1/Q5_1;
 *     an I4_G128 block (one scale) meets 4 activation blocks (4 scales);
 *   - Q4_K, Q5_K, Q6_K and the 256-value low-bit types (IQ4_NL: the 32-blocks above): x in
 *     blocks of 256 as int8, f32 scale and 16 int16 sums of 16 (llama.cpp's Q8_K);
 *   - F32, F16, BF16 weights: x stays float (f32 products).
 * The error this adds is bounded by sum_b max|x_b|/254 * sum_{c in b} |W[r,c]| (the per-value
 * rounding of x), the same as llama.cpp's CPU backend. The integer sums are exact; the SIMD
 * and scalar paths compute the same products and differ only in float summation order.
 *
 * SIMD: AVX-512 (F/BW/DQ/VL) and AVX2 (+FMA, F16C) kernels chosen at run time with
 * cb_cpu_level() (AVX-512 where the CPU has it, else AVX2); a scalar path for every type (tests
 * cap the level to exercise it). With 4 or more tokens, the quantized types run a packed-row
 * kernel (8 weight rows unpacked once per call into the pool's scratch, as the 8 lanes of a
 * vector; see quant_avx2.c; the AVX-512 tile reads the same packing, two steps per vector);
 * the integer block sums are the same, so results differ from the other paths only in float
 * summation order.
 *
 * Threads: pass a cb_threadpool_t (threadpool.h) to split output rows across its threads, or
 * NULL to compute on the calling thread. Every call is synchronous: pointers are borrowed for
 * the call only.
 */
#ifndef COLIBRI_QUANT_H
#define COLIBRI_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"
#include "colibri/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cb_type {
    CB_TYPE_F32 = 0,
    CB_TYPE_F16 = 1,
    CB_TYPE_Q4_0 = 2,
    CB_TYPE_Q4_1 = 3,
    CB_TYPE_Q5_0 = 6,
    CB_TYPE_Q5_1 = 7,
    CB_TYPE_Q8_0 = 8,
    CB_TYPE_Q8_1 = 9,  /* known (sizes), no kernels */
    CB_TYPE_Q2_K = 10,
    CB_TYPE_Q3_K = 11,
    CB_TYPE_Q4_K = 12,
    CB_TYPE_Q5_K = 13,
    CB_TYPE_Q6_K = 14,
    CB_TYPE_Q8_K = 15,
    CB_TYPE_IQ2_XXS = 16,
    CB_TYPE_IQ2_XS = 17,
    CB_TYPE_IQ3_XXS = 18,
    CB_TYPE_IQ1_S = 19,
    CB_TYPE_IQ4_NL = 20,
    CB_TYPE_IQ3_S = 21,
    CB_TYPE_IQ2_S = 22,
    CB_TYPE_IQ4_XS = 23,
    CB_TYPE_IQ1_M = 29,
    CB_TYPE_BF16 = 30,
    CB_TYPE_TQ1_0 = 34,
    CB_TYPE_TQ2_0 = 35,
    CB_TYPE_MXFP4 = 39,
    CB_TYPE_I4_G128 = 1024, /* colibri's own (not a GGML id), see above */
    CB_TYPE_Q8_0_R16 = 1025, /* colibri's in-memory layouts of Q8_0, Q5_0, Q6_K, Q4_K: below */
    CB_TYPE_Q5_0_R16 = 1026,
    CB_TYPE_Q6_K_R16 = 1027,
    CB_TYPE_Q4_K_R16 = 1028,
} cb_type;

/* Values per block; 0 for an id this library does not know. */
int64_t cb_type_block_size(int type);

/* Bytes per block; 0 for an unknown id. */
size_t cb_type_block_bytes(int type);

/* Bytes of a row of n values: fails (INVALID_ARGUMENT) when n < 0 or n is not a multiple of the
 * block size, UNSUPPORTED for an unknown id, OUT_OF_MEMORY when the size overflows. */
cb_status cb_type_row_bytes(int type, int64_t n, size_t *out);

/* GGML's name ("Q4_K", "F32"); "unknown" for an unknown id. Static string. */
const char *cb_type_name(int type);

/* Non-zero when dequantize, get_rows and matmul support the type. */
int cb_type_supported(int type);

/* A weight matrix: rows x cols values of `type`, row r at data + r*row_bytes. data is
 * borrowed (often a mapped GGUF tensor); row_bytes >= cb_type_row_bytes(type, cols). */
typedef struct cb_matrix {
    int type;          /* a cb_type */
    int64_t rows;      /* output features */
    int64_t cols;      /* input features; a multiple of the block size */
    size_t row_bytes;  /* stride between rows in bytes */
    const void *data;  /* borrowed */
} cb_matrix_t;

/* The R16 layouts, CB_TYPE_Q8_0_R16, _Q5_0_R16, _Q6_K_R16 and _Q4_K_R16: a Q8_0, Q5_0, Q6_K or
 * Q4_K matrix re-laid in memory (never in a file) for the decode matvec, in as many bytes. The
 * direct tiles must reduce every row's block sum across a vector before its scale; here 16 rows
 * share each vector, so a block of 16 rows is vpdpbusd against broadcast activations and one fma
 * per token, and the matvec streams at memory speed. Rows come in groups of 16 (the last padded
 * with zero rows): group g at data + 16*g*row_bytes, row_bytes exactly the source's (cols/32 * 34
 * or 22, cols/256 * 210 or 144). A step is 4 consecutive values of the 16 rows: 64 positions p =
 * 32*(row/8) + 4*(row%8) + value%4 (= 4*row + value%4). Per block of 32 values a Q8_0 / Q5_0
 * group holds 8 steps (step s: values 4s..4s+3), then the 16 rows' d (f16):
 *   Q8_0_R16  step s as 64 bytes q + 128                                  (544 bytes a block)
 *   Q5_0_R16  4 x 64 bytes: byte p of vector v = the low 4 bits of q at p of step v, | those of
 *             step v + 4 << 4; then 8 x 64 bits: bit p of word s = bit 4 of q at p of step s
 *                                                                         (352 bytes a block)
 * Per super-block of 256 values a Q6_K group holds 64 steps of the unsigned 6-bit q (0..63):
 *   Q6_K_R16  32 x 64 bytes: byte p of vector v = the low 4 bits of q at p of step v | those of
 *             step v + 32 << 4; 16 x 64 bytes: bits 2f, 2f+1 of byte p of vector v = bits 4, 5
 *             of q at p of step v + 16f (f < 4); the scales int8 [16 sub-blocks][16 rows];
 *             d[16] (f16)                                                (3360 bytes a block)
 * and of the unsigned 4-bit q of a Q4_K group (sub-block j: values 32j..32j+31, steps 8j..8j+7):
 *   Q4_K_R16  32 x 64 bytes: byte p of vector v = the low 4 bits of q at p of step v | those of
 *             step v + 32 << 4; 128 bytes [sub-block j][row]: scale_j | (min_j & 3) << 6; 64
 *             bytes [j < 4][row]: min_j >> 2 | (min_j+4 >> 2) << 4; d[16], dmin[16] (f16)
 *                                                                        (2304 bytes a block)
 * Products are bit-identical to those of the source matrix (the same integer block sums and float
 * operations). cb_get_rows and cb_matmul read them; cb_dequantize_rows refuses them (a row is not
 * contiguous). */
int cb_r16_layout(int type); /* the layout of a type (Q8_0, Q5_0, Q6_K, Q4_K), 0 for others */
size_t cb_r16_bytes(int layout, int64_t rows, int64_t cols); /* 0: not a layout, a bad shape */

/* Packs the Q8_0, Q5_0, Q6_K or Q4_K matrix src into its layout at dst (64-byte aligned, dst_bytes >=
 * cb_r16_bytes(layout, rows, cols)), on the pool's threads (NULL: the caller's). */
cb_status cb_pack_r16(const cb_matrix_t *src, void *dst, size_t dst_bytes, cb_threadpool_t *pool);

/* Checks a matrix: supported type, rows/cols >= 0, cols a multiple of the block size,
 * row_bytes large enough, data non-NULL when non-empty. */
cb_status cb_matrix_check(const cb_matrix_t *w);

/* Dequantizes n_values values of `type` (a multiple of the block size) from src (borrowed,
 * n_values/block_size blocks) to dst (caller-owned, n_values floats). */
cb_status cb_dequantize_rows(int type, const void *src, int64_t n_values, float *dst);

/* Embedding lookup: out[i*w->cols + c] = W[ids[i], c] for i < n (out: caller-owned, n*cols
 * floats). Every id is checked against [0, rows): an out-of-range id fails with
 * INVALID_ARGUMENT naming it, before anything is written. */
cb_status cb_get_rows(const cb_matrix_t *w, const int32_t *ids, int64_t n, float *out);

/* y = W x for a batch of tokens:
 *   y[t*y_stride + r] = sum_c W[r,c] * x[t*x_stride + c]   for t < n_tokens, r < rows.
 * x: n_tokens rows of cols floats (borrowed), y: n_tokens rows of at least `rows` floats
 * (caller-owned; must not overlap x). Strides are in floats, >= cols and >= rows.
 * n_tokens == 1 is the decode matvec; larger batches run a tiled kernel that streams each
 * weight row block once per call. pool NULL = calling thread only. The pool's scratch holds the
 * quantized activations; without a pool one buffer is allocated per call. */
cb_status cb_matmul(const cb_matrix_t *w, const float *x, int64_t n_tokens, int64_t x_stride,
                    float *y, int64_t y_stride, cb_threadpool_t *pool);

/* Options of cb_matmul_ex (zero-initialise, or use cb_matmul_default_opts()). */
typedef struct cb_matmul_opts {
    /* Non-zero: y += scale * (W x) instead of y = W x. */
    int accumulate;
    /* Optional per-token factor (n_tokens floats, borrowed): y = token_scale[t] * (W x_t)
     * (or += with accumulate). NULL = 1. MoE: the router weight of each token. */
    const float *token_scale;
    /* Optional token indices (n_tokens int32, borrowed): token t reads x row token_ids[t] and
     * writes y row token_ids[t] (gather/scatter without copies; MoE: the tokens routed to
     * one expert). Ids must be >= 0 and < n_rows_xy. Repeated ids are allowed with
     * accumulate (each adds). NULL = identity. */
    const int32_t *token_ids;
    /* Number of x / y rows the ids may address (required when token_ids is set). */
    int64_t n_rows_xy;
    /* The packed-row path (weights repacked per call, 8 rows at a time, shared by every
     * token; AVX2/AVX-512 builds, most quantized types): 0 = when the batch has enough tokens
     * for the type (the default), > 0 = whenever the type has one, < 0 = never. The results
     * are bit-identical either way (within rounding with fast); for benchmarks and tests. */
    int packed;
    /* Non-zero: allow the faster kernels that are not batch invariant (Model(deterministic=
     * False)). By default (0) a token's output row is bit-identical whatever the number of
     * tokens in the call and whichever path (direct tiles, packed rows) that picks: every
     * kernel sums an element block by block in one order (ARCHITECTURE "Batch invariance");
     * AVX-512 CPUs then run the AVX2 direct tiles (and the AVX-512 packed-row tile). */
    int fast;
} cb_matmul_opts_t;

cb_matmul_opts_t cb_matmul_default_opts(void);

/* cb_matmul with options (opts NULL = defaults, i.e. cb_matmul). */
cb_status cb_matmul_ex(const cb_matrix_t *w, const float *x, int64_t n_tokens, int64_t x_stride,
                       float *y, int64_t y_stride, const cb_matmul_opts_t *opts,
                       cb_threadpool_t *pool);

/* Quantizes n floats (a multiple of 32) to Q8_0 blocks (dst: n/32*34 bytes, caller-owned), with
 * GGML's rounding (d = max|x|/127 stored as f16, q = round(x/d)). For tools. */
cb_status cb_quantize_q8_0(const float *x, int64_t n, void *dst);

/* Quantizes n floats (a multiple of 128) to I4_G128 blocks (dst: n/128*66 bytes, caller-owned),
 * exactly like the GPU reference quantizer (colibri/_cuda_ref.py quantize_int4_g128):
 * d = f16(max|x|/7) per group of 128, q = clamp(round_half_even(x / d) + 8, 0, 15) (q = 8 when
 * d == 0). max|x|/7 (not GGML's signed max/-8) keeps the group symmetric: +-max both map to
 * q = 1 / 15 within d/2. Fails (INVALID_ARGUMENT, dst untouched) on a non-finite input or
 * a scale that overflows f16 (|x| above about 458000). */
cb_status cb_quantize_i4g128(const float *src, int64_t n, void *dst);

/* Half/bfloat conversions used by the kernels (exact, round-to-nearest-even for to_f16). */
float cb_f16_to_f32(uint16_t h);
uint16_t cb_f32_to_f16(float f);
float cb_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
