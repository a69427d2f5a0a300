/* routing.cu: the fused MoE routing kernel, cb_route_topk.
 *
 * From router logits [n_tokens, n_experts] (float32, row-major) to everything the grouped
 * expert GEMM (moe_gemm.cu) needs, in one launch with no host round trip and no dynamic
 * allocation:
 *   - top-k expert ids and weights per token (cuda/routing_logic.h, the same code the CPU
 *     router uses: softmax or sigmoid, optional selection bias, renorm, scale);
 *   - per-expert token counts and segment offsets: expert e owns the rows
 *     [seg_offset[e], seg_offset[e+1]) of the sorted list, its count rounded up to `tile`;
 *   - the sorted list itself: sorted_token[row] (token index, -1 for padding) and
 *     sorted_weight[row] (its routing weight, 0 for padding), each expert's tokens in
 *     ascending token order (deterministic, independent of thread scheduling);
 *   - pair_pos[t*k + j]: the row that holds token t's j-th choice (-1 if the token failed),
 *     which the deterministic combine kernel uses to sum a token's k outputs in order j;
 *   - tile_expert[i]: the expert owning GEMM row-tile i (rows [i*tile, (i+1)*tile)), -1 for
 *     tiles past the end, so the GEMM grid can be sized on the host from the capacity alone;
 *   - sel_offset[t*k + j]: the byte offset of the selected expert in the expert pool, from
 *     the per-expert slot table slot_offset[e] (-1 = not resident, an error); without a
 *     table (NULL) every sel_offset is -1 and residency is not checked.
 *
 * Launch: ONE block (grid 1), blockDim a multiple of 32 up to 1024 (colibri uses 1024).
 * A single block is what makes the counting, the prefix sum and the stable placement
 * possible without a grid-wide barrier; the work is O(n_tokens * n_experts) for the gating
 * plus O(n_tokens * k * n_experts / 32) warp steps for the placement (the times an H200
 * takes, and where the multi-block pair below takes over: docs/benchmarks.md "CUDA").
 *   Phase 1: route each token, write ids/weights/offsets, count per expert in shared memory
 *            (atomics: the counts do not depend on order). With `per_warp` and at most
 *            CB_ROUTE_WARP_MAX_EXPERTS experts a warp per token (cb_route_token_warp, the
 *            same bits as the serial routine); else a thread per token (cb_route_token), with
 *            up to CB_ROUTE_STAGE_FLOATS logits first copied to shared memory.
 *   Phase 2: one thread: exclusive prefix sum of the padded counts (n_experts <= 1024 adds).
 *   Phase 3: warp per expert: walk the tokens 32 at a time in ascending order; a ballot of
 *            "this lane's token chose e" and a popcount give each token its row, so the order
 *            within a segment is by token index. Then the padding and tile_expert entries.
 *   Phase 4: all threads: rows [total, cap) and tiles past the end are set to -1.
 *
 * Capacity: cap (rows of the sorted arrays, a multiple of tile) must be at least
 * n_tokens*k + min(n_experts, n_tokens*k)*(tile-1) rounded up to tile, which bounds the
 * padded total for every routing; colibri.cuda sizes it so. A smaller cap is reported as
 * CB_KERR_CAPACITY and then the sorted arrays hold only -1.
 *
 * Errors go to err[4] (common.cuh); a token whose logits are not finite gets ids -1,
 * weights 0, and takes no rows.
 *
 * Multi-block routing for large batches (the single block walks every token on 1024 threads):
 * the same outputs from two launches on the same stream, with the same per-token and
 * per-expert code (the helpers below) and no host round trip in between:
 *   cb_route_count: phase 1, a warp per token (per_warp; grid ceil(n_tokens / warps a block))
 *     or a thread per token (grid ceil(n_tokens / blockDim)); each block counts in shared
 *     memory and adds its counts to `counts` with atomics (zeroed by the caller first;
 *     integer sums do not depend on order).
 *   cb_route_place (any grid): every block computes the padded prefix sum of `counts` itself
 *     (n_experts <= 1024 adds), block 0 writes seg_offset and reports a capacity overflow;
 *     then a warp per expert over the whole grid (phase 3) and grid-stride phase 4.
 * Results are identical to cb_route_topk's, bit for bit (deterministic placement).
 *
 * All pointers are device pointers owned by the caller; bias and slot_offset may be NULL.
 */
#define CB_FILE_ID CB_KFILE_ROUTING
#include "common.cuh"
#include "routing_logic.h"

/* A token's routing status into the error record (one place, so that both phase-1 paths
 * report a failure the same way). */
__device__ __forceinline__ void cb_route_report(int st, int t, int *__restrict__ err)
{
    if (st != CB_ROUTE_OK)
        cb_kernel_fail(err, st == CB_ROUTE_ENONFINITE ? CB_KERR_ROUTE_NONFINITE
                                                      : CB_KERR_ROUTE_ARG,
                       __LINE__, CB_FILE_ID, t);
}

/* Token t's choice j (expert e, -1 if the token failed, weight w): its id, weight, pool
 * offset and pair_pos = -1, and its count into cnt (shared memory). */
__device__ __forceinline__ void cb_route_choice(
    int t, int j, int e, float w, int k, const long long *__restrict__ slot_offset,
    int *__restrict__ topk_ids, float *__restrict__ topk_w, long long *__restrict__ sel_offset,
    int *__restrict__ pair_pos, int *cnt, int *__restrict__ err)
{
    const size_t p = (size_t)t * k + j;
    long long off = -1;
    topk_ids[p] = e;
    topk_w[p] = w;
    pair_pos[p] = -1;
    if (e >= 0) {
        atomicAdd(&cnt[e], 1);
        if (slot_offset != nullptr) {
            off = slot_offset[e];
            if (off < 0) cb_kernel_fail(err, CB_KERR_NOT_RESIDENT, __LINE__, CB_FILE_ID, e);
        }
    }
    sel_offset[p] = off;
}

/* Phase 1 for token t by one thread: route it (cb_route_token), then write its choices. */
__device__ __forceinline__ void cb_route_one(
    const float *__restrict__ logits, int t, int n_experts, int k, int gating,
    const float *__restrict__ bias, int renorm, float scale,
    const long long *__restrict__ slot_offset, int *__restrict__ topk_ids,
    float *__restrict__ topk_w, long long *__restrict__ sel_offset, int *__restrict__ pair_pos,
    int *cnt, int *__restrict__ err)
{
    /* The insertion top-k reads back what it wrote: in the thread's own arrays (an H200 took
     * the same time as with the output arrays in global memory: the passes over the row
     * cost, see docs/benchmarks.md "CUDA"), then written out once. */
    int ids[CB_ROUTE_MAX_K];
    float w[CB_ROUTE_MAX_K];
    const int st = cb_route_token(logits + (size_t)t * n_experts, n_experts, k, gating, bias,
                                  renorm, scale, ids, w);
    cb_route_report(st, t, err);
    for (int j = 0; j < k; j++)
        cb_route_choice(t, j, ids[j], w[j], k, slot_offset, topk_ids, topk_w, sel_offset, pair_pos,
                        cnt, err);
}

/* Warp-per-token routing: the 32 lanes of a warp route one token together, lane l holding the
 * experts l, l + 32, ... (at most CB_ROUTE_WARP_MAX_EXPERTS, CB_ROUTE_WARP_R per lane, in
 * registers). The same arithmetic as cb_route_token (routing_logic.h) and, where the order of
 * float operations matters, the same order, so the same bits:
 *   - finiteness of every logit and bias: a ballot;
 *   - the softmax maximum: exact in any order (a butterfly of shuffles);
 *   - the exp sum: every lane adds the n_experts terms in ascending expert order from 0.0f,
 *     each fetched from the lane that computed it (a shuffle);
 *   - each expert's score and selection value by cb_route_score, as the serial loop does;
 *   - top-k: k rounds of a warp arg-max of (selection value, then the lower expert id), which
 *     picks the experts of the insertion top-k in its order (descending value, ties by
 *     ascending id);
 *   - weights: lane j < k recomputes choice j's score; the total is summed in order j =
 *     0..k-1, then the same renorm and scale.
 * Lane j < k gets choice j in *id and *weight (-1 and 0 when the token fails). Returns the
 * status, the same in every lane. The caller checks CB_ROUTE_ARGS_OK and n_experts <=
 * CB_ROUTE_WARP_MAX_EXPERTS. */
#define CB_ROUTE_WARP_R (CB_ROUTE_WARP_MAX_EXPERTS / 32)
#define CB_FULL_WARP 0xffffffffu

__device__ __forceinline__ int cb_route_token_warp(const float *__restrict__ logits,
                                                   int n_experts, int k, int gating,
                                                   const float *__restrict__ bias, int renorm,
                                                   float scale, int lane, int *id, float *weight)
{
    float lg[CB_ROUTE_WARP_R], val[CB_ROUTE_WARP_R];
    const float neg_inf = -__int_as_float(0x7f800000);
    const int rounds = (n_experts + 31) / 32;
    int bad = 0;
    float mx = neg_inf;
#pragma unroll
    for (int r = 0; r < CB_ROUTE_WARP_R; r++) {
        const int e = r * 32 + lane;
        lg[r] = 0.0f;
        if (e < n_experts) {
            lg[r] = logits[e];
            bad |= !cb_route_finite(lg[r]) || (bias != nullptr && !cb_route_finite(bias[e]));
            mx = lg[r] > mx ? lg[r] : mx;
        }
    }
    *id = -1;
    *weight = 0.0f;
    if ((gating != CB_GATING_SOFTMAX && gating != CB_GATING_SIGMOID) || !cb_route_finite(scale))
        return CB_ROUTE_EARG;
    if (__ballot_sync(CB_FULL_WARP, bad)) return CB_ROUTE_ENONFINITE;
    float inv_sum = 1.0f;
    if (gating == CB_GATING_SOFTMAX) {
        for (int off = 16; off > 0; off >>= 1) {
            const float o = __shfl_xor_sync(CB_FULL_WARP, mx, off);
            mx = o > mx ? o : mx;
        }
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < CB_ROUTE_WARP_R; r++) {
            if (r >= rounds) break;
            const float ex = expf(lg[r] - mx);
            const int m = n_experts - r * 32 < 32 ? n_experts - r * 32 : 32;
            for (int j = 0; j < m; j++) sum += __shfl_sync(CB_FULL_WARP, ex, j);
        }
        inv_sum = 1.0f / sum;
    }
#pragma unroll
    for (int r = 0; r < CB_ROUTE_WARP_R; r++) {
        const int e = r * 32 + lane;
        val[r] = neg_inf;
        if (e < n_experts) {
            val[r] = cb_route_score(lg[r], gating, mx, inv_sum);
            if (bias != nullptr) val[r] += bias[e];
        }
    }
    unsigned taken = 0;
    for (int i = 0; i < k; i++) {
        float bv = neg_inf;
        int be = CB_ROUTE_WARP_MAX_EXPERTS; /* nothing: above every id */
#pragma unroll
        for (int r = 0; r < CB_ROUTE_WARP_R; r++)
            if (!((taken >> r) & 1u) && val[r] > bv) { /* ascending ids: ties keep the lower */
                bv = val[r];
                be = r * 32 + lane;
            }
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(CB_FULL_WARP, bv, off);
            const int oe = __shfl_xor_sync(CB_FULL_WARP, be, off);
            if (ov > bv || (ov == bv && oe < be)) {
                bv = ov;
                be = oe;
            }
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        if (i == lane) *id = be;
    }
    const float score = lane < k ? cb_route_score(logits[*id], gating, mx, inv_sum) : 0.0f;
    float total = 0.0f;
    for (int j = 0; j < k; j++) total += __shfl_sync(CB_FULL_WARP, score, j);
    const float f = (renorm && total > 0.0f) ? scale / total : scale;
    if (lane < k) *weight = score * f;
    return CB_ROUTE_OK;
}

/* Phase 1 for token t by a whole warp (cb_route_token_warp): what cb_route_one writes. */
__device__ __forceinline__ void cb_route_one_warp(
    const float *__restrict__ logits, int t, int lane, int n_experts, int k, int gating,
    const float *__restrict__ bias, int renorm, float scale,
    const long long *__restrict__ slot_offset, int *__restrict__ topk_ids,
    float *__restrict__ topk_w, long long *__restrict__ sel_offset, int *__restrict__ pair_pos,
    int *cnt, int *__restrict__ err)
{
    int id;
    float w;
    const int st = cb_route_token_warp(logits + (size_t)t * n_experts, n_experts, k, gating,
                                       bias, renorm, scale, lane, &id, &w);
    if (lane == 0) cb_route_report(st, t, err);
    if (lane < k)
        cb_route_choice(t, lane, id, w, k, slot_offset, topk_ids, topk_w, sel_offset, pair_pos,
                        cnt, err);
}

/* Phase 2 (one thread): seg[e] = padded exclusive prefix sum of cnt; returns whether the
 * total fits cap (seg[n_experts] = the total either way). */
__device__ __forceinline__ int cb_route_prefix(const int *cnt, int *seg, int n_experts,
                                               int tile, int cap)
{
    int acc = 0;
    for (int e = 0; e < n_experts; e++) {
        seg[e] = acc;
        acc += cb_route_pad(cnt[e], tile);
    }
    seg[n_experts] = acc;
    return acc <= cap;
}

/* Phase 3 for expert e, by one whole warp: its tokens in ascending order into the rows from
 * seg (ballot + popcount), then its padding rows and its tiles. */
__device__ __forceinline__ void cb_route_place_expert(
    int e, int lane, int seg, int n_tokens, int k, int tile,
    const int *__restrict__ topk_ids, const float *__restrict__ topk_w,
    int *__restrict__ sorted_token, float *__restrict__ sorted_weight,
    int *__restrict__ pair_pos, int *__restrict__ tile_expert)
{
    int placed = 0;
    for (int base = 0; base < n_tokens; base += 32) {
        const int t = base + lane;
        int j_hit = -1;
        if (t < n_tokens) {
            const int *ids = topk_ids + (size_t)t * k;
            for (int j = 0; j < k; j++)
                if (ids[j] == e) j_hit = j;
        }
        const unsigned hits = __ballot_sync(0xffffffffu, j_hit >= 0);
        if (j_hit >= 0) {
            const int row = seg + placed + __popc(hits & cb_lanemask_lt());
            sorted_token[row] = t;
            sorted_weight[row] = topk_w[(size_t)t * k + j_hit];
            pair_pos[(size_t)t * k + j_hit] = row;
        }
        placed += __popc(hits);
    }
    const int end = seg + cb_route_pad(placed, tile);
    for (int row = seg + placed + lane; row < end; row += 32) {
        sorted_token[row] = -1;
        sorted_weight[row] = 0.0f;
    }
    for (int i = seg / tile + lane; i < end / tile; i += 32) tile_expert[i] = e;
}

/* Phase 4 (grid-stride from index `first` by `stride`): rows [total, cap) and the tiles past
 * the end are empty. */
__device__ __forceinline__ void cb_route_clear_tail(int first, int stride, int total, int tile,
                                                    int cap, int *__restrict__ sorted_token,
                                                    float *__restrict__ sorted_weight,
                                                    int *__restrict__ tile_expert)
{
    for (int row = total + first; row < cap; row += stride) {
        sorted_token[row] = -1;
        sorted_weight[row] = 0.0f;
    }
    for (int i = total / tile + first; i < cap / tile; i += stride) tile_expert[i] = -1;
}

/* logits staged in shared memory by cb_route_topk when they fit (16 KiB: 32 tokens of 128
 * experts, 4 of 1024) */
#define CB_ROUTE_STAGE_FLOATS 4096

#define CB_ROUTE_ARGS_OK(nthreads)                                                           \
    (n_tokens >= 0 && n_experts >= 1 && n_experts <= CB_ROUTE_MAX_EXPERTS && k >= 1 &&       \
     k <= n_experts && k <= CB_ROUTE_MAX_K && tile >= 1 && cap >= 0 && cap % tile == 0 &&    \
     ((nthreads) & 31) == 0)

extern "C" __global__ void __launch_bounds__(1024) cb_route_topk(
    const float *__restrict__ logits,    /* [n_tokens, n_experts] */
    int n_tokens, int n_experts, int k,
    int gating,                          /* CB_GATING_SOFTMAX or CB_GATING_SIGMOID */
    const float *__restrict__ bias,      /* [n_experts] selection bias or NULL */
    int renorm, float scale,
    int tile,                            /* rows per GEMM tile: segments padded to this */
    int cap,                             /* rows in sorted_token / sorted_weight */
    int per_warp,                        /* phase 1 by a warp per token (where n_experts <=
                                            CB_ROUTE_WARP_MAX_EXPERTS), else a thread per token */
    const long long *__restrict__ slot_offset, /* [n_experts] pool byte offsets or NULL */
    int *__restrict__ topk_ids,          /* [n_tokens, k] out */
    float *__restrict__ topk_w,          /* [n_tokens, k] out */
    long long *__restrict__ sel_offset,  /* [n_tokens, k] out */
    int *__restrict__ counts,            /* [n_experts] out */
    int *__restrict__ seg_offset,        /* [n_experts + 1] out */
    int *__restrict__ sorted_token,      /* [cap] out */
    float *__restrict__ sorted_weight,   /* [cap] out */
    int *__restrict__ pair_pos,          /* [n_tokens, k] out */
    int *__restrict__ tile_expert,       /* [cap / tile] out */
    int *__restrict__ err)               /* [4] error record, zeroed by the caller */
{
    __shared__ int s_count[CB_ROUTE_MAX_EXPERTS];
    __shared__ int s_seg[CB_ROUTE_MAX_EXPERTS + 1];
    __shared__ int s_ok;
    __shared__ float s_logits[CB_ROUTE_STAGE_FLOATS];
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int warp = tid >> 5, lane = tid & 31, nwarps = nthreads >> 5;

    /* Arguments the block cannot work with at all: flag and leave (nothing is written). */
    CB_KCHECK(CB_ROUTE_ARGS_OK(nthreads), err, CB_KERR_ROUTE_ARG, 0);

    for (int e = tid; e < n_experts; e += nthreads) s_count[e] = 0;
    /* Few tokens (a decode step): the logits copied to shared memory by the whole block in
     * one coalesced pass first, so that the thread routing a token reads them from there: its
     * passes over the row (finite check, max, exp-sum, scores) otherwise wait a global-memory
     * latency per logit, one after the other. The same routine on the same values: the same
     * bits. */
    const bool warp_route = per_warp && n_experts <= CB_ROUTE_WARP_MAX_EXPERTS;
    const bool staged = !warp_route && (long long)n_tokens * n_experts <= CB_ROUTE_STAGE_FLOATS;
    if (staged)
        for (int i = tid; i < n_tokens * n_experts; i += nthreads) s_logits[i] = logits[i];
    __syncthreads();

    /* Phase 1: route each token: a warp per token (its logits read once, coalesced), or a
     * thread per token. The same bits either way. */
    if (warp_route)
        for (int t = warp; t < n_tokens; t += nwarps)
            cb_route_one_warp(logits, t, lane, n_experts, k, gating, bias, renorm, scale,
                              slot_offset, topk_ids, topk_w, sel_offset, pair_pos, s_count, err);
    else
        for (int t = tid; t < n_tokens; t += nthreads)
            cb_route_one(staged ? s_logits : logits, t, n_experts, k, gating, bias, renorm,
                         scale, slot_offset, topk_ids, topk_w, sel_offset, pair_pos, s_count,
                         err);
    __syncthreads();

    /* Phase 2: padded exclusive prefix sum. */
    if (tid == 0) {
        s_ok = cb_route_prefix(s_count, s_seg, n_experts, tile, cap);
        if (!s_ok) cb_kernel_fail(err, CB_KERR_CAPACITY, __LINE__, CB_FILE_ID, s_seg[n_experts]);
    }
    __syncthreads();
    for (int e = tid; e < n_experts; e += nthreads) {
        counts[e] = s_count[e];
        seg_offset[e] = s_seg[e];
    }
    if (tid == 0) seg_offset[n_experts] = s_seg[n_experts];
    const int total = s_ok ? s_seg[n_experts] : 0;

    /* Phase 3: stable placement, warp per expert. */
    if (s_ok)
        for (int e = warp; e < n_experts; e += nwarps)
            cb_route_place_expert(e, lane, s_seg[e], n_tokens, k, tile, topk_ids, topk_w,
                                  sorted_token, sorted_weight, pair_pos, tile_expert);

    /* Phase 4: everything past the padded total is empty. */
    cb_route_clear_tail(tid, nthreads, total, tile, cap, sorted_token, sorted_weight,
                        tile_expert);
}

/* Multi-block phase 1: a warp per token (per_warp, grid ceil(n_tokens / (blockDim / 32)),
 * n_experts <= CB_ROUTE_WARP_MAX_EXPERTS) or a thread per token (grid ceil(n_tokens /
 * blockDim)) over the grid; counts (zeroed by the caller) get each block's shared counts
 * added atomically. */
extern "C" __global__ void __launch_bounds__(256) cb_route_count(
    const float *__restrict__ logits, int n_tokens, int n_experts, int k, int gating,
    const float *__restrict__ bias, int renorm, float scale, int per_warp,
    const long long *__restrict__ slot_offset, /* [n_experts] pool byte offsets or NULL */
    int *__restrict__ topk_ids, float *__restrict__ topk_w, long long *__restrict__ sel_offset,
    int *__restrict__ pair_pos,
    int *__restrict__ counts,            /* [n_experts] in/out: zeroed before the launch */
    int *__restrict__ err)
{
    __shared__ int s_count[CB_ROUTE_MAX_EXPERTS];
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int tile = 1, cap = 0; /* for the shared argument check */
    CB_KCHECK(CB_ROUTE_ARGS_OK(nthreads) && (!per_warp || n_experts <= CB_ROUTE_WARP_MAX_EXPERTS),
              err, CB_KERR_ROUTE_ARG, 0);
    for (int e = tid; e < n_experts; e += nthreads) s_count[e] = 0;
    __syncthreads();
    if (per_warp) {
        const int t = blockIdx.x * (nthreads >> 5) + (tid >> 5);
        if (t < n_tokens) /* the whole warp: the same t */
            cb_route_one_warp(logits, t, tid & 31, n_experts, k, gating, bias, renorm, scale,
                              slot_offset, topk_ids, topk_w, sel_offset, pair_pos, s_count, err);
    } else {
        const int t = blockIdx.x * nthreads + tid;
        if (t < n_tokens)
            cb_route_one(logits, t, n_experts, k, gating, bias, renorm, scale, slot_offset,
                         topk_ids, topk_w, sel_offset, pair_pos, s_count, err);
    }
    __syncthreads();
    for (int e = tid; e < n_experts; e += nthreads)
        if (s_count[e]) atomicAdd(&counts[e], s_count[e]);
}

/* Multi-block phases 2-4, after cb_route_count on the same stream. */
extern "C" __global__ void __launch_bounds__(256) cb_route_place(
    int n_tokens, int n_experts, int k, int tile, int cap,
    const int *__restrict__ topk_ids, const float *__restrict__ topk_w,
    const int *__restrict__ counts,      /* [n_experts] from cb_route_count */
    int *__restrict__ seg_offset, int *__restrict__ sorted_token,
    float *__restrict__ sorted_weight, int *__restrict__ pair_pos,
    int *__restrict__ tile_expert, int *__restrict__ err)
{
    __shared__ int s_count[CB_ROUTE_MAX_EXPERTS];
    __shared__ int s_seg[CB_ROUTE_MAX_EXPERTS + 1];
    __shared__ int s_ok;
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int lane = tid & 31, nwarps = nthreads >> 5;
    CB_KCHECK(CB_ROUTE_ARGS_OK(nthreads), err, CB_KERR_ROUTE_ARG, 0);
    for (int e = tid; e < n_experts; e += nthreads) s_count[e] = counts[e];
    __syncthreads();
    if (tid == 0) {
        s_ok = cb_route_prefix(s_count, s_seg, n_experts, tile, cap);
        if (!s_ok && blockIdx.x == 0)
            cb_kernel_fail(err, CB_KERR_CAPACITY, __LINE__, CB_FILE_ID, s_seg[n_experts]);
    }
    __syncthreads();
    if (blockIdx.x == 0)
        for (int e = tid; e <= n_experts; e += nthreads) seg_offset[e] = s_seg[e];
    const int total = s_ok ? s_seg[n_experts] : 0;
    const int gwarp = blockIdx.x * nwarps + (tid >> 5), all_warps = gridDim.x * nwarps;
    if (s_ok)
        for (int e = gwarp; e < n_experts; e += all_warps)
            cb_route_place_expert(e, lane, s_seg[e], n_tokens, k, tile, topk_ids, topk_w,
                                  sorted_token, sorted_weight, pair_pos, tile_expert);
    cb_route_clear_tail(blockIdx.x * nthreads + tid, gridDim.x * nthreads, total, tile, cap,
                        sorted_token, sorted_weight, tile_expert);
}
