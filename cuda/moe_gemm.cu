/* moe_gemm.cu: the grouped expert FFN on tensor cores (nvcuda::wmma, 16x16x16 fp16
 * fragments, fp32 accumulation), fed by cb_route_topk (routing.cu).
 *
 * For every expert e with routed tokens, over the rows of its segment in the sorted token list:
 *     h   = act(x_rows . gate_e^T) * (x_rows . up_e^T)          [rows, F]  (kernel 1)
 *     z   = w_row * (h . down_e^T)                                [rows, D]  (kernel 2)
 *     out[t] = sum over j = 0..k-1 of z[pair_pos[t*k + j]]       [T, D]     (kernel 3)
 * x: activations [n_tokens, D] fp16; D = hidden size, F = expert intermediate size.
 *
 * Kernels (extern "C", launched by colibri/cuda.py):
 *   cb_moe_gate_up_{f16,i4}_{m16,m64}: grid (cap / BM, ceil(F / BN)), block THREADS
 *   cb_moe_down_{f16,i4}_{m16,m64}:    grid (cap / BM, ceil(D / BN)), block THREADS
 *   cb_moe_{gate_up,down}_f16_m{16,64}_cp: the same fp16 GEMMs with a multi-stage cp.async
 *                                      pipeline and dynamic shared memory (sm_80+; see below)
 *   cb_moe_combine:                    grid (n_tokens), block 256
 *   m16: BM = 16 rows per tile, BN = 64, BK = 64, 4 warps (128 threads), warp tile 16x16;
 *        for decode and small batches, where the weights stream from memory: the deeper
 *        slice keeps more bytes in flight per barrier. m64: BM = 64, BN = 128, BK = 32,
 *        8 warps (256 threads), warp tile 32x32; for prefill. The routing `tile` must equal BM: every row tile then lies inside one
 *        expert's segment, and tile_expert[] (from the router) names it; tiles marked -1 exit.
 *
 * Why a separate, deterministic combine instead of atomicAdd into the output: a token's k
 * expert outputs are summed in a fixed order (j = 0..k-1), so the result is bitwise
 * reproducible run to run; the cost is one float write and read of [n_tokens*k, D] (about
 * 30 us per 64 MiB on an H200), small next to the GEMMs at the batch sizes where it matters.
 * Every element of out is written (no pre-zeroing needed); padding rows of z are never written.
 *
 * Precision: x and weights fp16 (int4 weights are dequantized to fp16 in shared memory,
 * exactly (q - 8) * scale rounded once to fp16), products accumulated in fp32 by the tensor
 * cores, the activation in fp32, h rounded to fp16 between the two GEMMs (stored in a
 * [cap, F] fp16 scratch buffer), z and out fp32.
 *
 * Expert pool layout. The pool is one device buffer; expert e's weights start at byte
 * expert_offset[e] (a multiple of 16; -1 = not resident, an error). In that slot, three
 * matrices of the same byte size M follow each other: gate at 0, up at M, down at 2M.
 *   gate, up: [F rows, D cols]; down: [D rows, F cols]; rows are output features, columns
 *   input features (the GGUF / Hugging Face orientation: y = W x).
 *   fp16 ("f16"): row-major fp16, M = F * D * 2 bytes.
 *   int4 with one fp16 scale per group of 128 inputs ("int4-g128"), for a matrix of R rows
 *   and C columns (C a multiple of 128):
 *     quants [R, C/2] bytes, row-major: byte i of row r holds column 2i in its low nibble
 *            (bits 0-3) and column 2i+1 in its high nibble (bits 4-7), values q in 0..15;
 *     scales [R, C/128] fp16, row-major, right after the quants (offset R*C/2);
 *     value(r, c) = fp16((q(r, c) - 8) * scale[r, c / 128]);  M = R*C/2 + R*(C/128)*2.
 *   Both layouts give the three matrices the same M, as R*C = F*D for each.
 *
 * Shape requirements (checked here, reported as CB_KERR_SHAPE; colibri.cuda checks first):
 * the reduction dimension (D for gate/up, F for down) a multiple of 64 (fp16) or 128 (int4),
 * the output dimension a multiple of 16; pointers 16-byte aligned.
 *
 * Pipelining: one shared-memory stage per operand with register prefetch: while the warps
 * multiply the BK-wide slice in shared memory, each thread holds the next slice in registers
 * (fp16 vectors, or packed int4 + scale), and writes it (dequantizing) after a barrier.
 * The "_cp" fp16 kernels instead keep 3-4 slices in flight with cp.async (moe_gemm_cp_body).
 */
#define CB_FILE_ID CB_KFILE_MOE_GEMM
#include <mma.h>

#include "common.cuh"

using namespace nvcuda;

namespace {


/* Eight int4 values (one 32-bit word: nibble p = bits 4p..4p+3 is column p) times a scale,
 * as eight fp16 in column order. */
__device__ __forceinline__ uint4 cb_dequant8(unsigned word, float s) {
    uint4 out;
    unsigned *o = &out.x;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int lo = (int)((word >> (8 * p)) & 15u) - 8;
        const int hi = (int)((word >> (8 * p + 4)) & 15u) - 8;
        __half2 v = __floats2half2_rn((float)lo * s, (float)hi * s);
        o[p] = *reinterpret_cast<unsigned *>(&v);
    }
    return out;
}

template <int NW, int FM, int FN>
__device__ __forceinline__ void cb_zero_acc(
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[NW][FM][FN]) {
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
        for (int i = 0; i < FM; i++)
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[m][i][j], 0.0f);
}

/* The tensor-core work of one BK-wide slice held in shared memory: the warp (wm, wn) multiplies
 * its WM rows of A by its WN columns of each of the NW weight tiles (B = W^T: W's row n, a
 * column of B, is contiguous in shared memory), accumulating into acc. Row strides SK. */
template <int BN, int BK, int WM, int WN, int NW>
__device__ __forceinline__ void cb_mma_slice(
    const __half *sA, const __half *sB, int wm, int wn,
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[NW][WM / 16][WN / 16]) {
    constexpr int SK = BK + 8, FM = WM / 16, FN = WN / 16;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[FM];
#pragma unroll
        for (int i = 0; i < FM; i++)
            wmma::load_matrix_sync(fa[i], sA + (wm * WM + i * 16) * SK + kk, SK);
#pragma unroll
        for (int m = 0; m < NW; m++) {
#pragma unroll
            for (int j = 0; j < FN; j++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, sB + (m * BN + wn * WN + j * 16) * SK + kk, SK);
#pragma unroll
                for (int i = 0; i < FM; i++) wmma::mma_sync(acc[m][i][j], fa[i], fb, acc[m][i][j]);
            }
        }
    }
}

/* The epilogue, through shared memory sC (float, row stride BN + 4; the caller has made sure
 * the operand tiles it overlays are dead). GATE_UP: h = act(gate) * up rounded to fp16, every
 * tile row written (padding rows hold zeros); else z = routing weight * (h . down^T), fp32,
 * only for real (non-padding) rows. */
template <int BM, int BN, int WM, int WN, int NW, int THREADS, bool GATE_UP>
__device__ __forceinline__ void cb_gemm_epilogue(
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[NW][WM / 16][WN / 16],
    float *sC, const int *s_row, const float *s_w, int wm, int wn, int row0, int n0, int N,
    int act, __half *__restrict__ h_out, float *__restrict__ z_out) {
    constexpr int SC = BN + 4, FM = WM / 16, FN = WN / 16;
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < FM; i++) {
#pragma unroll
        for (int j = 0; j < FN; j++) {
            if constexpr (GATE_UP) {
                /* gate and up accumulators have the same fragment type, hence the same
                 * element-to-(row, col) mapping: combine them element by element. */
#pragma unroll
                for (int t = 0; t < acc[0][i][j].num_elements; t++)
                    acc[0][i][j].x[t] = cb_activation(acc[0][i][j].x[t], act) *
                                        acc[NW - 1][i][j].x[t];
            }
            wmma::store_matrix_sync(sC + (wm * WM + i * 16) * SC + wn * WN + j * 16,
                                    acc[0][i][j], SC, wmma::mem_row_major);
        }
    }
    __syncthreads();

    if constexpr (GATE_UP) {
        for (int idx = tid; idx < BM * (BN / 8); idx += THREADS) {
            const int r = idx / (BN / 8), c = (idx % (BN / 8)) * 8;
            if (n0 + c >= N) continue;
            const float *src = sC + r * SC + c;
            uint4 v;
            unsigned *o = &v.x;
#pragma unroll
            for (int p = 0; p < 4; p++) {
                __half2 hv = __floats2half2_rn(src[2 * p], src[2 * p + 1]);
                o[p] = *reinterpret_cast<unsigned *>(&hv);
            }
            *reinterpret_cast<uint4 *>(h_out + (size_t)(row0 + r) * N + n0 + c) = v;
        }
    } else {
        for (int idx = tid; idx < BM * (BN / 4); idx += THREADS) {
            const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            if (n0 + c >= N || s_row[r] < 0) continue;
            const float w = s_w[r];
            const float *src = sC + r * SC + c;
            *reinterpret_cast<float4 *>(z_out + (size_t)(row0 + r) * N + n0 + c) =
                make_float4(src[0] * w, src[1] * w, src[2] * w, src[3] * w);
        }
    }
}

template <int BM, int BN, int BK, int WM, int WN, bool INT4, bool GATE_UP>
__device__ __forceinline__ void moe_gemm_body(
    const __half *__restrict__ a,            /* GATE_UP: x [n_tokens, K]; else h [cap, K] */
    const int *__restrict__ sorted_token,    /* [cap] */
    const float *__restrict__ sorted_weight, /* [cap] */
    const int *__restrict__ tile_expert,     /* [cap / BM] */
    const unsigned char *__restrict__ pool, const long long *__restrict__ expert_offset,
    int n_experts, int K, int N, int act,
    __half *__restrict__ h_out,              /* GATE_UP: [cap, N] */
    float *__restrict__ z_out,               /* !GATE_UP: [cap, N] */
    int *__restrict__ err) {
    /* Shared row stride in halves: BK + 8 spreads the rows over the banks and keeps every
     * 16-row fragment start 32-byte aligned (16 * (BK + 8) * 2 is a multiple of 32). */
    constexpr int SK = BK + 8;
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int FM = WM / 16, FN = WN / 16;
    constexpr int NW = GATE_UP ? 2 : 1; /* weight matrices per stage: gate and up, or down */
    constexpr int A_BYTES = BM * SK * 2;
    constexpr int B_BYTES = NW * BN * SK * 2;
    constexpr int SC = BN + 4; /* float stride of the epilogue staging tile */
    constexpr int C_BYTES = BM * SC * 4;
    constexpr int SMEM = (A_BYTES + B_BYTES) > C_BYTES ? (A_BYTES + B_BYTES) : C_BYTES;
    static_assert(A_BYTES % 128 == 0, "B operand must stay aligned");
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "tiles");
    static_assert(BK % 32 == 0 && 128 % BK == 0, "a slice is whole int4 words within a group");

    __shared__ __align__(128) unsigned char smem[SMEM];
    __shared__ int s_row[BM];  /* source row of A for each tile row, -1 = zero row */
    __shared__ float s_w[BM];  /* routing weight of each tile row */
    __half *sA = reinterpret_cast<__half *>(smem);
    __half *sB = reinterpret_cast<__half *>(smem + A_BYTES);
    float *sC = reinterpret_cast<float *>(smem); /* reused after the main loop */

    const int tile = blockIdx.x;
    const int e = tile_expert[tile];
    if (e < 0) return; /* past the padded total: nothing routed here */
    const int row0 = tile * BM, n0 = blockIdx.y * BN;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;

    CB_KCHECK(blockDim.x == THREADS && e < n_experts && K > 0 && N > 0 &&
                  K % (INT4 ? 128 : BK) == 0 && N % 16 == 0,
              err, CB_KERR_SHAPE, K);
    const long long off = expert_offset[e];
    CB_KCHECK(off >= 0 && off % 16 == 0, err, CB_KERR_NOT_RESIDENT, e);
    const size_t mat_bytes = INT4 ? (size_t)N * K / 2 + (size_t)N * (K / 128) * 2
                                  : (size_t)N * K * 2;
    const unsigned char *wbase = pool + off + (GATE_UP ? 0 : 2 * mat_bytes);

    for (int r = tid; r < BM; r += THREADS) {
        const int tok = sorted_token[row0 + r];
        s_row[r] = GATE_UP ? tok : (tok >= 0 ? row0 + r : -1);
        s_w[r] = sorted_weight[row0 + r];
    }
    __syncthreads();

    /* Register prefetch buffers. */
    constexpr int A_VECS = BM * (BK / 8);
    constexpr int A_PER = (A_VECS + THREADS - 1) / THREADS;
    /* B items: 16-byte vectors, holding 32 int4 values (INT4) or 8 fp16 values. */
    constexpr int B_VEC = INT4 ? BK / 32 : BK / 8; /* vectors per row and slice */
    constexpr int B_ITEMS = NW * BN * B_VEC;
    constexpr int B_PER = (B_ITEMS + THREADS - 1) / THREADS;
    uint4 ra[A_PER];
    uint4 rb[B_PER];
    float rs[INT4 ? B_PER : 1];

    auto load_slice = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            const int idx = tid + i * THREADS;
            ra[i] = make_uint4(0u, 0u, 0u, 0u);
            if (idx < A_VECS) {
                const int src = s_row[idx / (BK / 8)];
                if (src >= 0)
                    ra[i] = *reinterpret_cast<const uint4 *>(a + (size_t)src * K + k0 +
                                                             (idx % (BK / 8)) * 8);
            }
        }
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            const int idx = tid + i * THREADS;
            rb[i] = make_uint4(0u, 0u, 0u, 0u);
            if (INT4) {
                rs[i] = 0.0f;
                if (idx < B_ITEMS) {
                    const int row = idx / B_VEC, c = idx % B_VEC; /* row = m * BN + n */
                    const int m = row / BN, n = n0 + row % BN;
                    if (n < N) {
                        const unsigned char *wq = wbase + m * mat_bytes;
                        const __half *ws =
                            reinterpret_cast<const __half *>(wq + (size_t)N * K / 2);
                        rb[i] = *reinterpret_cast<const uint4 *>(wq + (size_t)n * (K / 2) +
                                                                 k0 / 2 + c * 16);
                        rs[i] = __half2float(ws[(size_t)n * (K / 128) + (k0 + c * 32) / 128]);
                    }
                }
            } else if (idx < B_ITEMS) {
                const int m = idx / (BN * B_VEC), rem = idx % (BN * B_VEC);
                const int n = n0 + rem / B_VEC, c = rem % B_VEC;
                if (n < N) {
                    const __half *w = reinterpret_cast<const __half *>(wbase + m * mat_bytes);
                    rb[i] = *reinterpret_cast<const uint4 *>(w + (size_t)n * K + k0 + c * 8);
                }
            }
        }
    };

    auto store_slice = [&]() {
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            const int idx = tid + i * THREADS;
            if (idx < A_VECS)
                *reinterpret_cast<uint4 *>(sA + (idx / (BK / 8)) * SK + (idx % (BK / 8)) * 8) =
                    ra[i];
        }
#pragma unroll
        for (int i = 0; i < B_PER; i++) {
            const int idx = tid + i * THREADS;
            if (idx >= B_ITEMS) continue;
            if (INT4) {
                /* row idx / B_VEC (= m * BN + n) of the stacked tile, columns c * 32.. */
                __half *dst = sB + (idx / B_VEC) * SK + (idx % B_VEC) * 32;
                *reinterpret_cast<uint4 *>(dst + 0) = cb_dequant8(rb[i].x, rs[i]);
                *reinterpret_cast<uint4 *>(dst + 8) = cb_dequant8(rb[i].y, rs[i]);
                *reinterpret_cast<uint4 *>(dst + 16) = cb_dequant8(rb[i].z, rs[i]);
                *reinterpret_cast<uint4 *>(dst + 24) = cb_dequant8(rb[i].w, rs[i]);
            } else {
                *reinterpret_cast<uint4 *>(sB + (idx / (BK / 8)) * SK + (idx % (BK / 8)) * 8) =
                    rb[i];
            }
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NW][FM][FN];
    cb_zero_acc<NW, FM, FN>(acc);

    const int ksteps = K / BK;
    load_slice(0);
    store_slice();
    __syncthreads();
    for (int kt = 0; kt < ksteps; kt++) {
        if (kt + 1 < ksteps) load_slice((kt + 1) * BK); /* in flight during the MMAs */
        cb_mma_slice<BN, BK, WM, WN, NW>(sA, sB, wm, wn, acc);
        __syncthreads();
        if (kt + 1 < ksteps) {
            store_slice();
            __syncthreads();
        }
    }

    /* The operand tiles are dead: the loop ended on a barrier. */
    cb_gemm_epilogue<BM, BN, WM, WN, NW, THREADS, GATE_UP>(acc, sC, s_row, s_w, wm, wn, row0, n0,
                                                           N, act, h_out, z_out);
}

/* The fp16 GEMM with a STAGES-deep cp.async pipeline (the "_cp" kernels): slices kt+1 ..
 * kt+STAGES-1 of A and of the weights are in flight, straight from global to shared memory,
 * while the warps multiply slice kt. One barrier per slice: after a thread's wait for slice kt
 * the barrier both publishes everyone's copies of kt and retires slice kt-1, whose stage the
 * next copies then reuse. Shared memory is dynamic (STAGES stages of (BM + NW*BN) rows of
 * BK + 8 halves; the epilogue tile overlays them) and the kernel checks the launch gave it
 * enough (CB_KERR_SMEM, value = bytes needed); colibri/cuda.py computes the same size. */
template <int BM, int BN, int BK, int WM, int WN, int STAGES, bool GATE_UP>
__device__ __forceinline__ void moe_gemm_cp_body(
    const __half *__restrict__ a, const int *__restrict__ sorted_token,
    const float *__restrict__ sorted_weight, const int *__restrict__ tile_expert,
    const unsigned char *__restrict__ pool, const long long *__restrict__ expert_offset,
    int n_experts, int K, int N, int act, __half *__restrict__ h_out, float *__restrict__ z_out,
    int *__restrict__ err) {
    constexpr int SK = BK + 8;
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int FM = WM / 16, FN = WN / 16;
    constexpr int NW = GATE_UP ? 2 : 1;
    constexpr int A_ELEMS = BM * SK, STAGE_ELEMS = (BM + NW * BN) * SK;
    constexpr int C_BYTES = BM * (BN + 4) * 4;
    constexpr int SMEM = STAGES * STAGE_ELEMS * 2 > C_BYTES ? STAGES * STAGE_ELEMS * 2 : C_BYTES;
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static_assert((A_ELEMS * 2) % 128 == 0 && (STAGE_ELEMS * 2) % 128 == 0, "stage alignment");
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0,
                  "tiles");

    CB_DYNAMIC_SMEM(smem);
    __shared__ int s_row[BM];
    __shared__ float s_w[BM];
    __half *stages = reinterpret_cast<__half *>(smem);

    const int tile = blockIdx.x;
    const int e = tile_expert[tile];
    if (e < 0) return;
    const int row0 = tile * BM, n0 = blockIdx.y * BN;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;

    CB_KCHECK(blockDim.x == THREADS && e < n_experts && K > 0 && N > 0 && K % BK == 0 &&
                  N % 16 == 0,
              err, CB_KERR_SHAPE, K);
    CB_KCHECK(cb_dynamic_smem_bytes() >= (unsigned)SMEM &&
                  reinterpret_cast<size_t>(smem) % 128 == 0,
              err, CB_KERR_SMEM, SMEM);
    const long long off = expert_offset[e];
    CB_KCHECK(off >= 0 && off % 16 == 0, err, CB_KERR_NOT_RESIDENT, e);
    const size_t mat_bytes = (size_t)N * K * 2;
    const unsigned char *wbase = pool + off + (GATE_UP ? 0 : 2 * mat_bytes);

    for (int r = tid; r < BM; r += THREADS) {
        const int tok = sorted_token[row0 + r];
        s_row[r] = GATE_UP ? tok : (tok >= 0 ? row0 + r : -1);
        s_w[r] = sorted_weight[row0 + r];
    }
    __syncthreads();

    /* Issue the copies of the BK-wide slice at k0 into stage st: A rows gathered by s_row
     * (padding rows zero-filled), then the NW weight tiles stacked (row m * BN + n), rows past
     * N zero-filled. 16 bytes = 8 halves per copy. */
    auto issue = [&](int st, int k0) {
        __half *sA = stages + st * STAGE_ELEMS;
        __half *sB = sA + A_ELEMS;
        for (int idx = tid; idx < BM * (BK / 8); idx += THREADS) {
            const int r = idx / (BK / 8), c = (idx % (BK / 8)) * 8;
            const int src = s_row[r];
            cb_cp_async16(sA + r * SK + c, src >= 0 ? a + (size_t)src * K + k0 + c : a, src >= 0);
        }
        for (int idx = tid; idx < NW * BN * (BK / 8); idx += THREADS) {
            const int row = idx / (BK / 8), c = (idx % (BK / 8)) * 8;
            const int n = n0 + row % BN;
            const __half *w = reinterpret_cast<const __half *>(wbase + (row / BN) * mat_bytes);
            cb_cp_async16(sB + row * SK + c, n < N ? w + (size_t)n * K + k0 + c : w, n < N);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NW][FM][FN];
    cb_zero_acc<NW, FM, FN>(acc);

    const int ksteps = K / BK;
    /* Prologue: slices 0 .. STAGES-2, one commit group each (empty past the end, so that the
     * group count, and with it the wait below, stays the same for every K). */
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < ksteps) issue(st, st * BK);
        cb_cp_async_commit();
    }
    for (int kt = 0; kt < ksteps; kt++) {
        cb_cp_async_wait<STAGES - 2>(); /* this thread's copies of slice kt have landed */
        __syncthreads();                /* everyone's have, and slice kt-1 is retired */
        const int next = kt + STAGES - 1;
        if (next < ksteps) issue(next % STAGES, next * BK);
        cb_cp_async_commit();
        const __half *sA = stages + (kt % STAGES) * STAGE_ELEMS;
        cb_mma_slice<BN, BK, WM, WN, NW>(sA, sA + A_ELEMS, wm, wn, acc);
    }
    cb_cp_async_wait<0>(); /* only empty groups remain; nothing may land on the epilogue tile */
    __syncthreads();       /* every warp is done with the last slice */
    cb_gemm_epilogue<BM, BN, WM, WN, NW, THREADS, GATE_UP>(acc, reinterpret_cast<float *>(smem),
                                                           s_row, s_w, wm, wn, row0, n0, N, act,
                                                           h_out, z_out);
}

}  // namespace

/* Shared parameter list of the eight GEMM entry points (see moe_gemm_body). For gate/up:
 * a = x [n_tokens, D], K = D, N = F, writes h. For down: a = h [cap, F], K = F, N = D,
 * writes z. The unused output pointer may be NULL. */
#define CB_MOE_GEMM_PARAMS                                                                  \
    const __half *__restrict__ a, const int *__restrict__ sorted_token,                    \
        const float *__restrict__ sorted_weight, const int *__restrict__ tile_expert,       \
        const unsigned char *__restrict__ pool, const long long *__restrict__ expert_offset, \
        int n_experts, int K, int N, int act, __half *__restrict__ h_out,                   \
        float *__restrict__ z_out, int *__restrict__ err
#define CB_MOE_GEMM_ARGS                                                                    \
    a, sorted_token, sorted_weight, tile_expert, pool, expert_offset, n_experts, K, N, act, \
        h_out, z_out, err

/* Occupancy: at least 2 blocks of 256 threads (16 warps) or 4 of 128 per SM, which caps
 * registers at 128 per thread; ptxas then spills 8-12 bytes in the m64 gate/up kernels
 * (64 accumulator registers for gate and up), a fair trade for twice the warps to hide the
 * global loads behind. */
#define CB_MOE_GEMM_KERNEL(name, threads, BM, BN, BK, WM, WN, INT4, GATE_UP)          \
    extern "C" __global__ void __launch_bounds__(threads, (threads) == 256 ? 2 : 4) name( \
        CB_MOE_GEMM_PARAMS) {                                                          \
        moe_gemm_body<BM, BN, BK, WM, WN, INT4, GATE_UP>(CB_MOE_GEMM_ARGS);             \
    }

CB_MOE_GEMM_KERNEL(cb_moe_gate_up_f16_m16, 128, 16, 64, 64, 16, 16, false, true)
CB_MOE_GEMM_KERNEL(cb_moe_gate_up_f16_m64, 256, 64, 128, 32, 32, 32, false, true)
CB_MOE_GEMM_KERNEL(cb_moe_gate_up_i4_m16, 128, 16, 64, 64, 16, 16, true, true)
CB_MOE_GEMM_KERNEL(cb_moe_gate_up_i4_m64, 256, 64, 128, 32, 32, 32, true, true)
CB_MOE_GEMM_KERNEL(cb_moe_down_f16_m16, 128, 16, 64, 64, 16, 16, false, false)
CB_MOE_GEMM_KERNEL(cb_moe_down_f16_m64, 256, 64, 128, 32, 32, 32, false, false)
CB_MOE_GEMM_KERNEL(cb_moe_down_i4_m16, 128, 16, 64, 64, 16, 16, true, false)
CB_MOE_GEMM_KERNEL(cb_moe_down_i4_m64, 256, 64, 128, 32, 32, 32, true, false)

/* The fp16 kernels with the cp.async pipeline (moe_gemm_cp_body): same tiles, 4 stages at
 * m16 (decode: more bytes in flight), 3 at m64. Dynamic shared memory, launched with the
 * bytes colibri.cuda.gemm_cp_smem_bytes(tile, gate_up) gives (above 48 KiB after opting in
 * with cuFuncSetAttribute): m16 gate/up 82944, down 46080; m64 gate/up 76800, down 46080.
 * Chosen by colibri/cuda.py on sm_80+ (cp.async); the register-prefetch kernels above remain
 * for older devices and int4 weights, and COLIBRI_CUDA_GEMM_PIPELINE=regs selects them. */
#define CB_MOE_GEMM_CP_KERNEL(name, threads, BM, BN, BK, WM, WN, STAGES, GATE_UP)     \
    extern "C" __global__ void __launch_bounds__(threads, (threads) == 256 ? 2 : 4) name( \
        CB_MOE_GEMM_PARAMS) {                                                          \
        moe_gemm_cp_body<BM, BN, BK, WM, WN, STAGES, GATE_UP>(CB_MOE_GEMM_ARGS);        \
    }

CB_MOE_GEMM_CP_KERNEL(cb_moe_gate_up_f16_m16_cp, 128, 16, 64, 64, 16, 16, 4, true)
CB_MOE_GEMM_CP_KERNEL(cb_moe_gate_up_f16_m64_cp, 256, 64, 128, 32, 32, 32, 3, true)
CB_MOE_GEMM_CP_KERNEL(cb_moe_down_f16_m16_cp, 128, 16, 64, 64, 16, 16, 4, false)
CB_MOE_GEMM_CP_KERNEL(cb_moe_down_f16_m64_cp, 256, 64, 128, 32, 32, 32, 3, false)

/* out[t, :] = sum over j = 0..k-1 (in that order) of z[pair_pos[t*k + j], :]; a pair whose
 * token failed routing (pair_pos -1) adds nothing. D a multiple of 4. Grid (n_tokens),
 * block 256. */
extern "C" __global__ void __launch_bounds__(256) cb_moe_combine(
    const float *__restrict__ z,        /* [cap, D] */
    const int *__restrict__ pair_pos,   /* [n_tokens, k] */
    int n_tokens, int k, int D,
    float *__restrict__ out,            /* [n_tokens, D] */
    int *__restrict__ err) {
    const int t = blockIdx.x;
    CB_KCHECK(t < n_tokens && D % 4 == 0 && k >= 1, err, CB_KERR_SHAPE, D);
    for (int c = threadIdx.x * 4; c < D; c += blockDim.x * 4) {
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j = 0; j < k; j++) {
            const int row = pair_pos[(size_t)t * k + j];
            if (row < 0) continue;
            const float4 v = *reinterpret_cast<const float4 *>(z + (size_t)row * D + c);
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        *reinterpret_cast<float4 *>(out + (size_t)t * D + c) = s;
    }
}
