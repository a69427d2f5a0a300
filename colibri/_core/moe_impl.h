/* The routed experts of one MoE layer on the CPU (moe.c), for the forward (forward.c): every
 * used expert's gate, up, activation and down in four thread-pool dispatches, however many
 * experts the batch uses:
 *   1. each token's activation row h quantized once per layout its experts' kernels read and
 *      copied to its entries (an entry = one (token, expert) routing);
 *   2. tasks of (expert, rows of n_ff): those rows of gate and up for the expert's entries,
 *      then act(gate) * up (cb_glu) on them, into the entries' rows of g; an expert's first
 *      task waits for its weights (cb_moe_run_t.wait: the expert store's started acquire), so
 *      the experts read late compute after the others, as with one matmul per expert;
 *   3. the entries' g rows quantized for the down weights;
 *   4. tasks of rows of n_embd: for every expert in ascending id, those rows of down for its
 *      entries, out[token] += weight * down(g) (the matmul's own accumulate).
 * Each kernel call goes through the matmul drivers' cb_mm_rows (matmul_impl.h) with the path
 * cb_matmul_ex would take for the expert's token count (direct tiles or packed rows), so a value
 * is the same bits as from one cb_matmul_ex per expert; the sum over a token's experts runs in
 * ascending expert id in one task, whatever the batch, the chunking or the threads (batch
 * invariance). */
#ifndef COLIBRI_MOE_IMPL_H
#define COLIBRI_MOE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/experts.h"
#include "colibri/ops.h"
#include "colibri/quant.h"
#include "colibri/threadpool.h"

typedef struct cb_moe_run {
    /* one expert's type, shape [n_ff x n_embd] / [n_embd x n_ff] and row stride (data unused) */
    const cb_matrix_t *gate, *up, *down;
    cb_act act;
    int fast;                     /* cb_matmul_opts_t.fast */
    const float *h;               /* [n_tokens x n_embd] expert input */
    int64_t n_tokens;
    int32_t k;                    /* entries (experts) per token */
    int32_t n_used;               /* experts with entries, in ascending id */
    const int32_t *n_tok;         /* [n_used] entries of each */
    const cb_expert_ref_t *refs;  /* [n_used] their weights (all readable) */
    /* the n_tokens * k entries, expert after expert (n_tok[i] each), in batch order within one */
    const int32_t *tok;           /* token of each entry */
    const float *scale;           /* routing weight of each entry */
    const int32_t *ent;           /* [n_tokens x k] the entries of each token */
    float *out;                   /* [n_tokens x n_embd]: += the experts' weighted sum */
    void *ws;                     /* workspace, 64-byte aligned */
    size_t ws_bytes;
    /* NULL (every expert's weights readable), or called before expert i's weights are first
     * read: once per i, one call at a time, from any thread of the pool (cb_experts_wait). A
     * failure stops the run (the tasks still queued skip their work) and is its result. */
    cb_status (*wait)(void *user, int32_t i);
    void *wait_user;
    const int32_t *expert_id;     /* [n_used] the experts' ids (rows of the biases) */
    /* NULL, or [n_expert x n_ff] added to gate / up before the activation, [n_expert x n_embd]
     * added times the routing weight after down (gpt-oss), as cb_moe_add_bias */
    const float *gate_b, *up_b, *down_b;
} cb_moe_run_t;

/* y[i] += s * b[i], each element on its own (no contraction into an FMA), so that any split of
 * a row gives the same bits: the one way the MoE paths add expert biases. */
void cb_moe_add_bias(float *y, const float *b, float s, int64_t n);

/* Workspace bytes for up to max_entries entries and max_used experts of these shapes on a pool
 * of n_threads, at any SIMD level; SIZE_MAX when that overflows. */
size_t cb_moe_workspace_bytes(const cb_matrix_t *gate, const cb_matrix_t *up,
                              const cb_matrix_t *down, int64_t max_entries, int32_t max_used,
                              int n_threads);

/* Runs the layer's routed experts (see above). Arguments are trusted (the forward built them);
 * INTERNAL when the workspace is too small. */
cb_status cb_moe_run(const cb_moe_run_t *r, cb_threadpool_t *pool);

#endif
