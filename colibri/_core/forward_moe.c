/* The MoE block of a layer (forward.h; moe_impl.h runs the routed experts): routing, the
 * experts from the expert store (or the MoE hook), the shared expert. Split from forward.c. */
#include <math.h>
#include <string.h>

#include "forward_impl.h"
#include "moe_impl.h"
#include "routing_logic.h"

/* Expert prefetch hint (only when the store runs a prefetch thread): while layer l computes,
 * the next MoE layer's router is applied to layer l's expert input f->h (the cheapest stand-in
 * for that layer's own input: no extra norm) for up to PREFETCH_TOKENS tokens (decode-sized
 * batches; a bigger batch uses most experts anyway), and the union of the top-k is hinted to the
 * store. Scratch: f->u (unused by the routed experts) and f->rid/f->rw (free
 * once the lists are built). A hint never changes the tokens; failures are ignored. */
#define PREFETCH_TOKENS 16
static void prefetch_next(cb_forward_t *f, int l, int64_t n) {
    const cb_model_desc_t *m = f->m;
    int l2 = l + 1;
    while (l2 < m->n_layer && m->layers[l2].n_expert == 0) l2++;
    if (l2 >= m->n_layer || n > PREFETCH_TOKENS) return;
    const cb_layer_desc_t *L2 = &m->layers[l2];
    const int64_t E = m->n_embd, NE = L2->n_expert, K = L2->n_expert_used;
    if (n * NE > (int64_t)f->max_batch * f->max_ff || n * K > (int64_t)f->max_batch * f->max_used)
        return;
    if (fmm(f, &L2->router, f->h, n, E, f->u, NE) != CB_OK) return;
    if (L2->router_b)
        for (int64_t t = 0; t < n; t++) cb_add(f->u + t * NE, L2->router_b, NE, f->u + t * NE);
    uint8_t seen[CB_ROUTE_MAX_EXPERTS];
    int32_t ids[CB_ROUTE_MAX_EXPERTS], n_ids = 0;
    memset(seen, 0, (size_t)NE);
    for (int64_t t = 0; t < n; t++) {
        if (cb_route_token_grouped(f->u + t * NE, (int)NE, (int)K, m->gating, L2->router_bias,
                                   m->expert_renorm, m->expert_scale, m->expert_groups,
                                   m->expert_groups_used, f->rid, f->rw) != CB_ROUTE_OK)
            return;
        for (int64_t i = 0; i < K; i++)
            if (!seen[f->rid[i]]) {
                seen[f->rid[i]] = 1;
                ids[n_ids++] = f->rid[i];
            }
    }
    (void)cb_experts_prefetch(f->experts, l2, ids, n_ids);
}

/* cb_moe_run_t.wait: the started acquire's wait (moe.c calls it one at a time) */
static cb_status expert_wait(void *store, int32_t i) { return cb_experts_wait(store, i); }

/* The routed experts one after the other, three matmuls each (moe.c's dispatches give the same
 * bits): used while the started acquire reads misses, so that every expert computes as soon as
 * its own bytes are in, down projection included (moe.c starts the downs after the last read). */
static cb_status moe_each(cb_forward_t *f, int l, int64_t n, int32_t n_used, const float *lw) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t E = m->n_embd, ff = L->n_ff_exp;
    cb_status st = CB_OK;
    for (int32_t i = 0; i < n_used && st == CB_OK; i++) {
        st = cb_experts_wait(f->experts, i);
        if (st != CB_OK) break;
        int32_t e = f->used[i], ne = f->cnt[e];
        const int32_t *ids = f->lists + f->start[e];
        cb_matrix_t wg = L->exp_gate, wu = L->exp_up, wd = L->exp_down;
        wg.data = f->refs[i].gate;
        wu.data = f->refs[i].up;
        wd.data = f->refs[i].down;
        cb_matmul_opts_t op = cb_matmul_default_opts();
        op.token_ids = ids;
        op.n_rows_xy = n;
        op.fast = f->fast;
        st = cb_matmul_ex(&wg, f->h, ne, E, f->g, ff, &op, f->pool);
        if (st == CB_OK) st = cb_matmul_ex(&wu, f->h, ne, E, f->u, ff, &op, f->pool);
        for (int32_t j = 0; j < ne && st == CB_OK; j++) {
            float *g = f->g + (size_t)ids[j] * ff, *u = f->u + (size_t)ids[j] * ff;
            if (L->exp_gate_b) cb_moe_add_bias(g, L->exp_gate_b + (size_t)e * ff, 1.0f, ff);
            if (L->exp_up_b) cb_moe_add_bias(u, L->exp_up_b + (size_t)e * ff, 1.0f, ff);
            st = cb_glu(m->act, g, u, ff, g);
        }
        if (st != CB_OK) break;
        cb_matmul_opts_t od = op;
        od.accumulate = 1;
        od.token_scale = lw + f->start[e];
        st = cb_matmul_ex(&wd, f->g, ne, ff, f->o, E, &od, f->pool);
        for (int32_t j = 0; j < ne && st == CB_OK && L->exp_down_b; j++)
            cb_moe_add_bias(f->o + (size_t)ids[j] * E, L->exp_down_b + (size_t)e * E,
                            lw[f->start[e] + j], E);
    }
    return st;
}

cb_status cb_fwd_moe_ffn(cb_forward_t *f, int l, int64_t n) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t E = m->n_embd, NE = L->n_expert, K = L->n_expert_used;
    CHECK_OK(fmm(f, &L->router, f->h, n, E, f->rlog, NE));
    if (L->router_b)
        for (int64_t t = 0; t < n; t++) cb_add(f->rlog + t * NE, L->router_b, NE, f->rlog + t * NE);
    if (L->ffn_pre_norm_2) /* gemma4: the router read its own input; the experts read this */
        CHECK_OK(cb_rmsnorm_rows(f->x, E, n, E, L->ffn_pre_norm_2, m->norm_eps, 0, f->h, E));
    if (f->moe_hook) {
        /* routing and the routed experts run in the hook (colibri.cuda on a GPU) */
        memset(f->o, 0, (size_t)n * E * sizeof(float));
        cb_status hs = f->moe_hook(f->moe_hook_user, l, f->h, f->rlog, n, f->o);
        if (hs != CB_OK) return hs;
        goto shared;
    }
    memset(f->cnt, 0, (size_t)NE * sizeof(int32_t));
    for (int64_t t = 0; t < n; t++) {
        int r = cb_route_token_grouped(f->rlog + t * NE, (int)NE, (int)K, m->gating,
                                       L->router_bias, m->expert_renorm, m->expert_scale,
                                       m->expert_groups, m->expert_groups_used, f->rid + t * K,
                                       f->rw + t * K);
        if (r != CB_ROUTE_OK)
            return cb_fail(r == CB_ROUTE_ENONFINITE ? CB_STATUS_CORRUPT : CB_STATUS_INTERNAL,
                           "forward: layer %d: routing of token %lld failed (%s)", l,
                           (long long)t,
                           r == CB_ROUTE_ENONFINITE ? "non-finite router logits" : "bad arguments");
        for (int64_t i = 0; i < K; i++) {
            f->cnt[f->rid[t * K + i]]++;
            if (L->exp_down_scale) f->rw[t * K + i] *= L->exp_down_scale[f->rid[t * K + i]];
        }
    }
    /* counting sort: lists[start[e] ..) = (token t) of expert e, in batch order */
    int32_t n_used = 0;
    f->start[0] = 0;
    for (int64_t e = 0; e < NE; e++) {
        f->start[e + 1] = f->start[e] + f->cnt[e];
        f->fill[e] = f->start[e];
        if (f->cnt[e] > 0) f->used[n_used++] = (int32_t)e;
    }
    /* per-entry routing weights, in list order: rlog is free again after routing */
    float *lw = f->rlog;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < K; i++) {
            int32_t e = f->rid[t * K + i];
            int32_t at = f->fill[e]++;
            f->lists[at] = (int32_t)t;
            f->ent[t * K + i] = at;
            lw[at] = f->rw[t * K + i];
        }
    for (int32_t i = 0; i < n_used; i++) f->fill[i] = f->cnt[f->used[i]]; /* tokens per expert */
    if (m->expert_weight_in) { /* llama4 (top-1): the experts read w * h; the shared one h */
        memcpy(f->o2, f->h, (size_t)(n * E) * sizeof(float));
        for (int64_t t = 0; t < n; t++) {
            cb_scale(f->h + t * E, E, f->rw[t]);
            lw[f->ent[t]] = 1.0f;
        }
    }
    /* the misses are read while the experts before them compute (moe.c, four dispatches):
     * expert i's first task waits for its own bytes only; the order of the sums, and so the
     * logits, is the one of a plain acquire */
    CHECK_OK(cb_experts_acquire_start(f->experts, l, f->used, n_used, f->fill, f->refs));
    if (cb_experts_prefetching(f->experts)) prefetch_next(f, l, n); /* hint the next layer */
    memset(f->o, 0, (size_t)n * E * sizeof(float));
    cb_status st;
    if (cb_experts_reads_pending(f->experts) > 0) {
        st = moe_each(f, l, n, n_used, lw); /* each expert's down overlaps the later reads */
    } else {
        cb_moe_run_t r = {&L->exp_gate, &L->exp_up, &L->exp_down, m->act, f->fast, f->h, n,
                          (int32_t)K, n_used, f->fill, f->refs, f->lists, lw, f->ent, f->o,
                          f->moe_ws, f->moe_ws_bytes, expert_wait, f->experts, f->used,
                          L->exp_gate_b, L->exp_up_b, L->exp_down_b};
        st = cb_moe_run(&r, f->pool);
    }
    cb_status fs = cb_experts_acquire_finish(f->experts); /* every read ended */
    if (fs != CB_OK) return st != CB_OK ? st : fs; /* a failed read: nothing stays acquired */
    cb_status rs = cb_experts_release(f->experts, l, f->used, n_used);
    if (st != CB_OK) return st;
    CHECK_OK(rs);
    if (m->expert_weight_in) memcpy(f->h, f->o2, (size_t)(n * E) * sizeof(float));
shared:
    if (mat_present(&L->sh_gate)) {
        /* shared expert into lrows, scaled by sigmoid(sh_gate_inp . h) when that gate exists */
        CHECK_OK(cb_fwd_dense_ffn(f, &L->sh_gate, &L->sh_up, &L->sh_down, n, f->lrows));
        if (mat_present(&L->sh_gate_inp))
            CHECK_OK(fmm(f, &L->sh_gate_inp, f->h, n, E, f->shg, 1));
        for (int64_t t = 0; t < n; t++) {
            float s = 1.0f;
            if (mat_present(&L->sh_gate_inp)) s = 1.0f / (1.0f + expf(-f->shg[t]));
            cb_axpy(s, f->lrows + t * E, E, f->o + t * E);
        }
    }
    return CB_OK;
}

