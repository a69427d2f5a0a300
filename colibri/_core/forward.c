/* The forward pass (see include/colibri/forward.h for the math of one layer).
 *
 * Batch flow per layer: every projection is one cb_matmul over all tokens of the batch (the
 * weights stream once per batch); attention is parallelised over (token, head) pairs on the
 * thread pool; the MoE block routes every token (routing_logic.h, the code the CUDA router
 * shares), groups the tokens by expert with a counting sort (deterministic: experts in
 * ascending id, tokens in batch order), acquires the chosen experts from the expert store once
 * per batch, and runs all of them in four thread-pool dispatches (moe.c: activations
 * quantized once, gate/up/act per (expert, rows) task, down accumulating w * expert(h) into the
 * output rows in ascending expert id).
 *
 * Invariants: scratch is sized at creation for max_batch tokens, the attention score buffers
 * grow (only) when a longer sequence appears; K/V of the batch are written for a layer before
 * any query of that layer reads them, and a query at position p reads positions <= p only, so
 * tokens of one sequence can share a batch. Sequence lengths are committed only after the whole
 * batch succeeded.
 */
#include "colibri/forward.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "forward_impl.h"
#include "moe_impl.h"
#include "routing_logic.h"


/* The field tables of the description (forward.h), from the same X-macro lists as the structs. */
_Static_assert(sizeof(cb_act) == sizeof(int) && sizeof(cb_qk_norm) == sizeof(int) &&
                   sizeof(cb_rope_mode) == sizeof(int),
               "CB_DESC_ENUM fields are int-sized");
#define CB_DESC_ENTRY_(type, kind, name) {#name, offsetof(type, name), CB_DESC_K_##kind},
#define CB_LAYER_ENTRY_(kind, name) CB_DESC_ENTRY_(cb_layer_desc_t, kind, name)
#define CB_MODEL_ENTRY_(kind, name) CB_DESC_ENTRY_(cb_model_desc_t, kind, name)
static const cb_desc_field_t layer_fields[] = {CB_LAYER_DESC_FIELDS(CB_LAYER_ENTRY_)};
static const cb_desc_field_t model_fields[] = {CB_MODEL_DESC_FIELDS(CB_MODEL_ENTRY_)};

int32_t cb_desc_fields(int layer, const cb_desc_field_t **out) {
    *out = layer ? layer_fields : model_fields;
    return layer ? (int32_t)(sizeof layer_fields / sizeof layer_fields[0])
                 : (int32_t)(sizeof model_fields / sizeof model_fields[0]);
}

/* Every matmul of the forward: cb_matmul with the batch-invariance choice. */

void cb_forward_set_deterministic(cb_forward_t *f, int deterministic) {
    if (f) f->fast = !deterministic;
}


cb_status cb_fw_check_mat(const cb_matrix_t *w, int64_t rows, int64_t cols, const char *what,
                          int layer) {
    if (!w->data)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: %s is missing", layer, what);
    if (w->rows != rows || w->cols != cols)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "forward: layer %d: %s is %lld x %lld, expected %lld x %lld", layer, what,
                       (long long)w->rows, (long long)w->cols, (long long)rows, (long long)cols);
    cb_status s = cb_matrix_check(w);
    if (s != CB_OK)
        return cb_fail(s, "forward: layer %d: %s: %s", layer, what, cb_last_error());
    return CB_OK;
}


static cb_status validate(const cb_model_desc_t *m, int64_t *max_ff, int32_t *max_expert,
                          int32_t *max_used, int64_t *max_nq, int64_t *max_nkv,
                          size_t *kv_elems, int64_t *max_mla, size_t *state, int64_t *max_gdn) {
    if (m->n_embd <= 0 || m->n_layer <= 0 || m->n_head <= 0 || m->n_head_kv <= 0 ||
        m->head_dim <= 0 || m->n_vocab <= 0 || m->n_head % m->n_head_kv != 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "forward: bad sizes (n_embd %d, n_layer %d, n_head %d, n_head_kv %d, "
                       "head_dim %d, n_vocab %d)",
                       m->n_embd, m->n_layer, m->n_head, m->n_head_kv, m->head_dim, m->n_vocab);
    if (m->head_dim > CB_FORWARD_MAX_HEAD_DIM)
        return cb_fail(CB_STATUS_UNSUPPORTED, "forward: head_dim %d > %d", m->head_dim,
                       CB_FORWARD_MAX_HEAD_DIM);
    if (m->rope_n_dims < 0 || m->rope_n_dims > m->head_dim || m->rope_n_dims % 2)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: rope dims %d for head_dim %d",
                       m->rope_n_dims, m->head_dim);
    if (!m->layers || !m->output_norm)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: no layers or output norm");
    if (m->n_embd_per_layer < 0 || (m->n_embd_per_layer > 0 &&
        (!mat_present(&m->per_layer_tok_embd) || !mat_present(&m->per_layer_model_proj) ||
         !m->per_layer_proj_norm)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: per-layer embeddings without "
                                                   "their tensors");
    if (m->act != CB_ACT_SILU && m->act != CB_ACT_GELU_TANH && m->act != CB_ACT_SWIGLU_OAI)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: unknown activation %d", (int)m->act);
    const int64_t E = m->n_embd;
    CHECK_OK(cb_fw_check_mat(&m->tok_embd, m->n_vocab, E, "token_embd", -1));
    CHECK_OK(cb_fw_check_mat(&m->output, m->n_vocab, E, "output", -1));
    *max_ff = 1;
    *max_expert = 0;
    *max_used = 0;
    *max_nq = *max_nkv = *max_mla = *max_gdn = 0;
    *kv_elems = *state = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const cb_layer_desc_t *L = &m->layers[l];
        const int32_t hd = layer_hd(m, L), n_kv = layer_nkv(m, L), n_rot = layer_nrot(m, L);
        if (L->head_dim < 0 || L->n_head_kv < 0 || L->rope_n_dims < 0 || hd > CB_FORWARD_MAX_HEAD_DIM ||
            m->n_head % n_kv != 0 || n_rot > hd || n_rot % 2)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "forward: layer %d: head_dim %d (max %d), %d KV heads for %d heads, "
                           "%d rope dims not supported", l, hd, CB_FORWARD_MAX_HEAD_DIM, n_kv,
                           m->n_head, n_rot);
        int64_t nq = (int64_t)m->n_head * hd, nkv = (int64_t)n_kv * hd;
        const int own = L->kv_from == 0; /* else it attends to layer kv_from - 1's K/V */
        if (L->gdn_v_heads) { /* forward_gdn.c: a recurrent state, no K/V */
            size_t st;
            int64_t scr;
            CHECK_OK(cb_gdn_validate(m, L, l, &st, &scr));
            *state += st;
            if (scr > *max_gdn) *max_gdn = scr;
            nq = nkv = 0;
        } else if (L->mla_kv_lora) { /* forward_mla.c: its own tensors and cache row */
            size_t row;
            int64_t scr;
            CHECK_OK(cb_mla_validate(m, L, l, &nq, &row, &scr));
            nkv = (int64_t)row;
            *kv_elems += row;
            if (scr > *max_mla) *max_mla = scr;
        } else if (own) {
            *kv_elems += 2 * (size_t)nkv;
        }
        if (nq > *max_nq) *max_nq = nq;
        if (nkv > *max_nkv) *max_nkv = nkv;
        if (!own) {
            const int ok = L->kv_from >= 1 && L->kv_from <= l;
            const cb_layer_desc_t *S = &m->layers[ok ? L->kv_from - 1 : l];
            if (!ok || S->kv_from != 0 || layer_hd(m, S) != hd || layer_nkv(m, S) != n_kv)
                return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: shares the K/V of "
                               "layer %d, not an earlier layer of its shape with K/V of its own",
                               l, L->kv_from - 1);
        }
        if (!L->attn_norm || !L->ffn_norm)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: missing norms", l);
        if (m->n_embd_per_layer > 0 &&
            (!mat_present(&L->pl_inp_gate) || !mat_present(&L->pl_proj) || !L->pl_post_norm))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: missing per-layer "
                                                       "embedding weights", l);
        if (m->qk_norm != CB_QK_NORM_NONE && !L->gdn_v_heads && (!L->q_norm || (own && !L->k_norm)))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: missing q/k norm", l);
        if (L->sliding_window < 0 || !(L->rope_base > 0) || !(L->rope_freq_scale > 0) ||
            L->attn_chunk < 0 || (L->attn_temp_scale > 0.0f && !(L->attn_temp_floor >= 1.0f)) ||
            (m->expert_weight_in && L->n_expert > 0 &&
             (L->n_expert_used != 1 || mat_present(&L->ffn_gate))))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "forward: layer %d: bad window %d, chunk %d, rope base %g / scale %g, "
                           "temperature floor %g, or input-weighted experts with top-%d routing "
                           "or a dense FFN beside", l, L->sliding_window, L->attn_chunk,
                           L->rope_base, L->rope_freq_scale, L->attn_temp_floor, L->n_expert_used);
        if (!L->mla_kv_lora && !L->gdn_v_heads) {
            CHECK_OK(cb_fw_check_mat(&L->wq, L->attn_q_gate ? 2 * nq : nq, E, "attn_q", l));
            if (own) CHECK_OK(cb_fw_check_mat(&L->wk, nkv, E, "attn_k", l));
            if (own && !L->v_from_k) CHECK_OK(cb_fw_check_mat(&L->wv, nkv, E, "attn_v", l));
            CHECK_OK(cb_fw_check_mat(&L->wo, E, nq, "attn_output", l));
        }
        if (L->n_expert > 0) {
            if (L->n_expert_used < 1 || L->n_expert_used > L->n_expert ||
                L->n_expert_used > CB_ROUTE_MAX_K || L->n_expert > CB_ROUTE_MAX_EXPERTS ||
                L->n_ff_exp <= 0)
                return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                               "forward: layer %d: %d of %d experts (ff %lld) not supported", l,
                               L->n_expert_used, L->n_expert, (long long)L->n_ff_exp);
            CHECK_OK(cb_fw_check_mat(&L->router, L->n_expert, E, "ffn_gate_inp", l));
            if (m->expert_groups > 1 &&
                (m->expert_groups > CB_ROUTE_MAX_GROUPS || L->n_expert % m->expert_groups ||
                 L->n_expert < 2 * m->expert_groups || m->expert_groups_used < 1 ||
                 m->expert_groups_used > m->expert_groups || m->gating >= CB_GATING_SPARSEMIXER ||
                 L->n_expert_used > m->expert_groups_used * (L->n_expert / m->expert_groups)))
                return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: %d experts in %d "
                               "groups (%d used) for top-%d routing not supported", l,
                               L->n_expert, m->expert_groups, m->expert_groups_used,
                               L->n_expert_used);
            {
                /* the expert templates carry no data: check them with a dummy pointer */
                cb_matrix_t tg = L->exp_gate, tu = L->exp_up, td = L->exp_down;
                tg.data = tu.data = td.data = L;
                CHECK_OK(cb_fw_check_mat(&tg, L->n_ff_exp, E, "ffn_gate_exps (one expert)", l));
                CHECK_OK(cb_fw_check_mat(&tu, L->n_ff_exp, E, "ffn_up_exps (one expert)", l));
                CHECK_OK(cb_fw_check_mat(&td, E, L->n_ff_exp, "ffn_down_exps (one expert)", l));
            }
            if (L->n_ff_exp > *max_ff) *max_ff = L->n_ff_exp;
            if (mat_present(&L->ffn_gate)) {
                /* gemma4: a dense FFN beside the experts, with its own norms */
                int64_t ff = L->ffn_gate.rows;
                CHECK_OK(cb_fw_check_mat(&L->ffn_gate, ff, E, "ffn_gate", l));
                CHECK_OK(cb_fw_check_mat(&L->ffn_up, ff, E, "ffn_up", l));
                CHECK_OK(cb_fw_check_mat(&L->ffn_down, E, ff, "ffn_down", l));
                if (!L->ffn_post_norm_1 || !L->ffn_pre_norm_2 || !L->ffn_post_norm_2)
                    return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                                   "forward: layer %d: dense FFN beside experts needs "
                                   "post_ffw_norm_1, pre_ffw_norm_2 and post_ffw_norm_2", l);
                if (ff > *max_ff) *max_ff = ff;
            }
            if (L->n_expert > *max_expert) *max_expert = L->n_expert;
            if (L->n_expert_used > *max_used) *max_used = L->n_expert_used;
            if (mat_present(&L->sh_gate)) {
                int64_t ff = L->sh_gate.rows;
                CHECK_OK(cb_fw_check_mat(&L->sh_gate, ff, E, "ffn_gate_shexp", l));
                CHECK_OK(cb_fw_check_mat(&L->sh_up, ff, E, "ffn_up_shexp", l));
                CHECK_OK(cb_fw_check_mat(&L->sh_down, E, ff, "ffn_down_shexp", l));
                if (mat_present(&L->sh_gate_inp))
                    CHECK_OK(cb_fw_check_mat(&L->sh_gate_inp, 1, E, "ffn_gate_inp_shexp", l));
                if (ff > *max_ff) *max_ff = ff;
            }
        } else {
            int64_t ff = L->ffn_gate.rows;
            CHECK_OK(cb_fw_check_mat(&L->ffn_gate, ff, E, "ffn_gate", l));
            CHECK_OK(cb_fw_check_mat(&L->ffn_up, ff, E, "ffn_up", l));
            CHECK_OK(cb_fw_check_mat(&L->ffn_down, E, ff, "ffn_down", l));
            if (ff > *max_ff) *max_ff = ff;
        }
    }
    if (m->gating != CB_GATING_SOFTMAX && m->gating != CB_GATING_SIGMOID &&
        m->gating != CB_GATING_SPARSEMIXER && m->gating != CB_GATING_SOFTMAX_WEIGHT)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: unknown gating %d", m->gating);
    return CB_OK;
}

void cb_forward_set_moe_hook(cb_forward_t *f, cb_moe_hook_fn fn, void *user) {
    if (!f) return;
    f->moe_hook = fn;
    f->moe_hook_user = fn ? user : NULL;
}

void cb_forward_free(cb_forward_t *f) {
    if (!f) return;
    void *bufs[] = {f->x,     f->h,     f->q,    f->k,        f->v,      f->att,
                    f->o,     f->o2,    f->kv_off, f->g,      f->u,      f->rlog, f->rw, f->shg,
                    f->lrows, f->rid,   f->lists, f->cnt,     f->start,  f->used,
                    f->fill,  f->pos64, f->seqs, f->seq_len0, f->seq_n,  f->seq_cap,
                    f->seq_base, f->refs, f->ent, f->moe_ws, f->rope_cs, f->rope_sn,
                    f->pli,   f->plt,   f->mla_q, f->mla_t,   f->mla_o, f->qg, f->qgate,
                    f->gdn_x, f->gdn_z, f->gdn_ba, f->gdn_o, f->gdn_tmp, f->gdn_off,
                    f->seq_state};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    if (f->scores)
        for (int t = 0; t < f->n_threads; t++) free(f->scores[t]);
    free(f->scores);
    free(f);
}

static void *zalloc(size_t n, size_t size, int *fail) {
    void *p = cb_calloc(n ? n : 1, size);
    if (!p) *fail = 1;
    return p;
}

cb_status cb_forward_new(const cb_model_desc_t *m, cb_kvcache_t *kv, cb_experts_t *experts,
                         cb_threadpool_t *pool, int32_t max_batch, cb_forward_t **out) {
    if (!out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: out is NULL");
    *out = NULL;
    if (!m || !kv || max_batch < 1 || max_batch > (1 << 20))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: model, cache and 1 <= max_batch "
                                                   "(%d) <= 2^20 are required", (int)max_batch);
    int64_t max_ff = 1;
    int32_t max_expert = 0, max_used = 0;
    int64_t max_nq = 0, max_nkv = 0;
    size_t per_elt = 0; /* K/V values of one token over all layers */
    int64_t max_mla = 0; /* MLA scratch per token */
    size_t state_floats = 0; /* recurrent state per sequence */
    int64_t max_gdn = 0;     /* linear attention channels */
    CHECK_OK(validate(m, &max_ff, &max_expert, &max_used, &max_nq, &max_nkv, &per_elt, &max_mla,
                      &state_floats, &max_gdn));
    if (cb_kvcache_state_bytes(kv) != state_floats * sizeof(float))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "forward: the KV cache holds %zu bytes of recurrent state per sequence, "
                       "this model needs %zu", cb_kvcache_state_bytes(kv),
                       state_floats * sizeof(float));
    if (max_expert > 0 && !experts)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: a MoE model needs an expert store");
    size_t stride = cb_kvcache_token_stride(kv);
    if (per_elt == 0) per_elt = 1; /* no K/V at all: the cache's one dummy value */
    if (stride != per_elt * 4 && stride != per_elt * 2)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "forward: the KV cache's token stride %zu bytes does not fit this model "
                       "(%d layers, %zu K/V values per token)",
                       stride, m->n_layer, per_elt);
    cb_forward_t *f = cb_calloc(1, sizeof *f);
    if (!f) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "forward: no memory");
    f->m = m;
    f->kv = kv;
    f->experts = experts;
    f->pool = pool;
    f->max_batch = max_batch;
    f->n_threads = cb_threadpool_n_threads(pool);
    f->kv_elt = stride / per_elt;
    f->kv_page = cb_kvcache_page_tokens(kv);
    f->kv_row = cb_kvcache_row_elems(kv);
    f->kv_tok = per_elt;
    f->max_ff = max_ff;
    f->max_expert = max_expert;
    f->max_used = max_used;
    const size_t B = (size_t)max_batch, E = (size_t)m->n_embd;
    const size_t nq = (size_t)max_nq, nkv = (size_t)max_nkv;
    const size_t K = (size_t)(max_used > 0 ? max_used : 1), NE = (size_t)(max_expert > 0 ? max_expert : 1);
    int fail = 0;
    f->x = zalloc(B * E, sizeof(float), &fail);
    f->h = zalloc(B * E, sizeof(float), &fail);
    f->q = zalloc(B * nq, sizeof(float), &fail);
    f->k = zalloc(B * nkv, sizeof(float), &fail);
    f->v = zalloc(B * nkv, sizeof(float), &fail);
    f->att = zalloc(B * nq, sizeof(float), &fail);
    f->o = zalloc(B * E, sizeof(float), &fail);
    f->o2 = zalloc(B * E, sizeof(float), &fail);
    if (max_mla > 0) {
        f->mla_q = zalloc(B * (size_t)max_mla, sizeof(float), &fail);
        f->mla_t = zalloc(B * (size_t)max_mla, sizeof(float), &fail);
        f->mla_o = zalloc(B * (size_t)max_mla, sizeof(float), &fail);
    }
    f->kv_off = zalloc((size_t)m->n_layer, sizeof(size_t), &fail);
    f->state_floats = state_floats;
    f->gdn_off = zalloc((size_t)m->n_layer, sizeof(size_t), &fail);
    f->seq_state = zalloc(B, sizeof(float *), &fail);
    for (int l = 0; l < m->n_layer; l++)
        if (m->layers[l].attn_q_gate) {
            f->qg = zalloc(B * 2 * nq, sizeof(float), &fail);
            f->qgate = zalloc(B * nq, sizeof(float), &fail);
            break;
        }
    if (max_gdn > 0) {
        const size_t G = (size_t)max_gdn;
        f->gdn_x = zalloc(B * G, sizeof(float), &fail);
        f->gdn_z = zalloc(B * G, sizeof(float), &fail);
        f->gdn_ba = zalloc(B * G, sizeof(float), &fail);
        f->gdn_o = zalloc(B * G, sizeof(float), &fail);
        f->gdn_tmp = zalloc(G, sizeof(float), &fail);
    }
    f->g = zalloc(B * (size_t)max_ff, sizeof(float), &fail);
    f->u = zalloc(B * (size_t)max_ff, sizeof(float), &fail);
    f->rlog = zalloc(B * NE, sizeof(float), &fail);
    f->rw = zalloc(B * K, sizeof(float), &fail);
    f->shg = zalloc(B, sizeof(float), &fail);
    f->lrows = zalloc(B * E, sizeof(float), &fail);
    const size_t LP = (size_t)m->n_layer * (size_t)(m->n_embd_per_layer > 0 ? m->n_embd_per_layer : 0);
    f->pli = zalloc(B * LP, sizeof(float), &fail);
    f->plt = zalloc(B * LP, sizeof(float), &fail);
    f->rid = zalloc(B * K, sizeof(int32_t), &fail);
    f->lists = zalloc(B * K, sizeof(int32_t), &fail);
    f->cnt = zalloc(NE, sizeof(int32_t), &fail);
    f->start = zalloc(NE + 1, sizeof(int32_t), &fail);
    f->used = zalloc(NE, sizeof(int32_t), &fail);
    f->fill = zalloc(NE, sizeof(int32_t), &fail);
    f->pos64 = zalloc(B, sizeof(int64_t), &fail);
    f->rope_cs = zalloc(B * CB_ROPE_ROW, sizeof(float), &fail);
    f->rope_sn = zalloc(B * CB_ROPE_ROW, sizeof(float), &fail);
    f->seqs = zalloc(B, sizeof(uint32_t), &fail);
    f->seq_len0 = zalloc(B, sizeof(size_t), &fail);
    f->seq_n = zalloc(B, sizeof(int32_t), &fail);
    f->seq_cap = zalloc(B, sizeof(size_t), &fail);
    f->seq_base = zalloc(B, sizeof(uint8_t *), &fail);
    f->refs = zalloc(NE, sizeof(cb_expert_ref_t), &fail);
    f->ent = zalloc(B * K, sizeof(int32_t), &fail);
    f->scores = zalloc((size_t)f->n_threads, sizeof(float *), &fail);
    if (fail) {
        cb_forward_free(f);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY,
                       "forward: no memory for the scratch of a %d-token batch", (int)max_batch);
    }
    for (int l = 0; l < m->n_layer; l++) {
        const cb_layer_desc_t *L = &m->layers[l];
        if (L->n_expert == 0) continue;
        size_t ws = cb_moe_workspace_bytes(&L->exp_gate, &L->exp_up, &L->exp_down,
                                           (int64_t)max_batch * L->n_expert_used, L->n_expert,
                                           f->n_threads);
        if (ws == SIZE_MAX) {
            cb_forward_free(f);
            return cb_fail(CB_STATUS_OUT_OF_MEMORY, "forward: layer %d: the experts' workspace "
                           "for a %d-token batch overflows", l, (int)max_batch);
        }
        if (ws > f->moe_ws_bytes) f->moe_ws_bytes = ws;
    }
    if (f->moe_ws_bytes > 0 && cb_posix_memalign(&f->moe_ws, 64, f->moe_ws_bytes) != 0) {
        f->moe_ws = NULL;
        cb_forward_free(f);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "forward: no memory for the experts' workspace "
                       "of a %d-token batch", (int)max_batch);
    }
    size_t off = 0, soff = 0;
    for (int l = 0; l < m->n_layer; l++) {
        const cb_layer_desc_t *G = &m->layers[l];
        if (G->gdn_v_heads) { /* its state's place; no K/V */
            f->gdn_off[l] = soff;
            soff += (size_t)((G->gdn_conv - 1) * (2 * (int64_t)G->gdn_k_heads * G->gdn_head_k +
                             (int64_t)G->gdn_v_heads * G->gdn_head_v) +
                             (int64_t)G->gdn_v_heads * G->gdn_head_k * G->gdn_head_v);
            continue;
        }
        if (m->layers[l].kv_from) { /* validated: an earlier layer with K/V of its own */
            f->kv_off[l] = f->kv_off[m->layers[l].kv_from - 1];
            continue;
        }
        f->kv_off[l] = off;
        const cb_layer_desc_t *L = &m->layers[l];
        const int mla = L->mla_kv_lora > 0; /* one row of kv_lora + rope values */
        const size_t hd = mla ? (size_t)(L->mla_kv_lora + layer_nrot(m, L)) : (size_t)layer_hd(m, L);
        const size_t rows = mla ? 1 : 2 * (size_t)layer_nkv(m, L);
        /* in pages, a head's values must be one cache row (a row's tokens are not adjacent) */
        for (size_t j = 0; j < rows && f->kv_page > 1; j++)
            if ((off + j * hd) % f->kv_row + hd > f->kv_row) {
                cb_forward_free(f);
                return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                               "forward: layer %d's K/V heads of %zu values are split across rows "
                               "of the KV cache (rows of %zu values in pages of %zu tokens): make the "
                               "cache with page_tokens 1", l, hd, cb_kvcache_row_elems(kv),
                               cb_kvcache_page_tokens(kv));
            }
        off += rows * hd;
    }
    *out = f;
    return CB_OK;
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_ctx {
    cb_forward_t *f;
    const cb_batch_t *b;
    int layer;
    int32_t window;
    int32_t hd, n_kv;     /* this layer's query / K head dim and KV heads */
    int32_t hv;           /* V head dim (the output's): hd, or MLA's kv_lora */
    int v_in_k;           /* MLA: V is the first hv values of the K row, no V heads */
    int32_t attn_chunk;   /* chunked attention (llama4), 0: none */
    int32_t hpt;          /* query heads per task: a divisor of n_head / n_kv */
    /* the split path (attention_split): per (token, K/V head) pair, n_chunks tasks of `chunk`
     * score rows, then n_cols tasks of `cols` value columns */
    int64_t chunk, n_chunks, cols, n_cols;
    cb_status status;
} attn_ctx;

/* Query heads per attention task: the whole group sharing a K/V head (its K and V rows are then
 * read once for all of them; at long contexts they do not stay in cache between heads), halved
 * while that leaves fewer than two tasks per thread; at most CB_ATTN_MAX_HPT (the scores'
 * scratch). Every head's numbers are the same whatever the grouping. Where it halves a group of
 * few pairs, the split path (attention_split) runs instead. */
#define CB_ATTN_MAX_HPT 8
static int32_t attn_heads_per_task(int64_t n_tokens, int n_head, int n_kv, int n_threads) {
    int32_t g = n_head / n_kv, hpt = g;
    while (hpt > CB_ATTN_MAX_HPT || (hpt % 2 == 0 && n_tokens * (n_head / hpt) < 2 * n_threads))
        if (hpt % 2 == 0) hpt /= 2;
        else { hpt = 1; break; }
    return hpt;
}


/* Token t's K rows (out NULL: G heads' scores sc[h * sst + j] = scale * q_h . k_(lo + j)) or V
 * rows (out: the heads' outputs += sc * v) of positions [lo, lo + n) at element el of a token,
 * a page's rows at a time: they are contiguous there (with pages of one token the rows are a
 * token apart, all in one call). The same numbers as one call over all rows: each row's score
 * is its own, and the V sum runs in row order. */
static cb_status attn_rows(const cb_forward_t *f, int64_t t, int64_t lo, int64_t n, size_t el,
                           const float *q, int64_t hd, int64_t cols, int G, float *sc, int64_t sst,
                           float *out) {
    const size_t P = f->kv_page;
    const int64_t rs = P == 1 ? (int64_t)f->kv_tok : (int64_t)f->kv_row; /* row stride */
    for (int64_t j = lo, end = lo + n; j < end;) {
        const int64_t page_end = (j / (int64_t)P + 1) * (int64_t)P;
        const int64_t e = P == 1 || page_end > end ? end : page_end;
        const void *rows = kv_at(f, t, (size_t)j, el);
        cb_status s;
        if (!out)
            s = f->kv_elt == 4 ? cb_dot_rows_multi_f32(q, hd, G, rows, e - j, rs, hd, f->m->attn_scale, sc + (j - lo), sst)
                               : cb_dot_rows_multi_f16(q, hd, G, rows, e - j, rs, hd, f->m->attn_scale, sc + (j - lo), sst);
        else
            s = f->kv_elt == 4 ? cb_axpy_rows_multi_f32(sc + (j - lo), sst, G, rows, e - j, rs, cols, out, hd)
                               : cb_axpy_rows_multi_f16(sc + (j - lo), sst, G, rows, e - j, rs, cols, out, hd);
        if (s != CB_OK) return s;
        j = e;
    }
    return CB_OK;
}

/* Token t's attended positions [*lo, *lo + n): all before it, or the window's. */
static int64_t attn_span(const attn_ctx *c, int64_t t, int64_t *lo) {
    const int64_t p = c->b->pos[t];
    *lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
    if (c->attn_chunk > 0) *lo = p / c->attn_chunk * c->attn_chunk;
    return p - *lo + 1;
}

/* The query of an f16 cache is rounded to f16 for the K products and the probabilities for the V
 * sum, as llama.cpp does (an f16 cache then reproduces llama.cpp's numerics). */
static const float *attn_query(const cb_forward_t *f, const float *q, int64_t n, float *qh) {
    if (f->kv_elt != 2) return q;
    memcpy(qh, q, (size_t)n * sizeof(float));
    cb_f16_round(qh, n);
    return qh;
}

/* sink (gpt-oss): a logit the softmax includes with no value (sc holds n + 1 floats) */
static void attn_softmax(const cb_forward_t *f, float *sc, int64_t n, const float *sink) {
    if (f->m->attn_softcap > 0) cb_softcap(sc, n, f->m->attn_softcap);
    if (sink) sc[n] = *sink;
    cb_softmax(sc, n + (sink != NULL));
    if (f->kv_elt == 2) cb_f16_round(sc, n);
}

static void attn_task(void *vctx, int task, int thread) {
    attn_ctx *c = vctx;
    cb_forward_t *f = c->f;
    const cb_model_desc_t *m = f->m;
    const int groups = m->n_head / c->hpt, G = c->hpt;
    const int t = task / groups, hq0 = (task % groups) * G;
    const int hk = hq0 / (m->n_head / c->n_kv);
    const int64_t hd = c->hd, hv = c->hv;
    int64_t lo;
    const int64_t n = attn_span(c, t, &lo);
    float *out0 = f->att + (size_t)t * m->n_head * hv + (size_t)hq0 * hv;
    float *sc0 = f->scores[thread];
    const int64_t sst = (int64_t)f->scores_cap; /* head h's scores at sc0 + h * sst */
    const size_t kel = f->kv_off[c->layer] + (size_t)hk * hd; /* K's element in a token */
    const size_t vel = c->v_in_k ? kel : kel + (size_t)c->n_kv * hd;
    float qh[CB_ATTN_MAX_HPT * CB_FORWARD_MAX_HEAD_DIM];
    const float *q0 = attn_query(f, f->q + (size_t)t * m->n_head * hd + (size_t)hq0 * hd, G * hd, qh);
    cb_status s = attn_rows(f, t, lo, n, kel, q0, hd, hd, G, sc0, sst, NULL);
    if (s != CB_OK) {
        c->status = s;
        return;
    }
    const float *sinks = m->layers[c->layer].attn_sinks;
    for (int h = 0; h < G; h++) attn_softmax(f, sc0 + h * sst, n, sinks ? sinks + hq0 + h : NULL);
    memset(out0, 0, (size_t)G * (size_t)hv * sizeof(float));
    s = attn_rows(f, t, lo, n, vel, q0, hv, hv, G, sc0, sst, out0);
    if (s != CB_OK) c->status = s;
}

/* The split path, for few (token, K/V head) pairs on more threads (one decoded token of a model
 * with fewer K/V heads than threads: Gemma 3 has one): splitting the query heads of a group
 * between tasks would have each task read all of the group's K and V rows again. Instead the
 * score tasks split the rows (each task: all of the group's heads over `chunk` rows, into the
 * pair's scores, f->scores[pair]), the caller runs the softmaxes, and the value tasks split the
 * head dimension (each task: `cols` of every head's output, over all rows). Each K and V byte is
 * read once, and the numbers are the one-task path's: a score is its own row's, and each output
 * value sums its rows in row order (cols is hd or a multiple of 64, so the kernels' lanes do
 * not change). */
static void attn_split_task(attn_ctx *c, int task, int values) {
    cb_forward_t *f = c->f;
    const cb_model_desc_t *m = f->m;
    const int64_t per = values ? c->n_cols : c->n_chunks, pair = task / per, piece = task % per;
    const int64_t t = pair / c->n_kv, hk = pair % c->n_kv, G = m->n_head / c->n_kv, hd = c->hd;
    const int64_t hv = c->hv;
    const size_t kel = f->kv_off[c->layer] + (size_t)(hk * hd); /* K's element in a token */
    int64_t lo;
    const int64_t n = attn_span(c, t, &lo);
    cb_status s;
    if (values) { /* columns [c0, c0 + cols) of every head's output, over all rows */
        const int64_t c0 = piece * c->cols;
        float *out0 = f->att + (size_t)(t * m->n_head + hk * G) * (size_t)hv + (size_t)c0;
        for (int64_t h = 0; h < G; h++) memset(out0 + h * hv, 0, (size_t)c->cols * sizeof(float));
        s = attn_rows(f, t, lo, n, kel + (size_t)((c->v_in_k ? 0 : c->n_kv * hd) + c0), NULL, hv,
                      c->cols, (int)G, f->scores[pair], (int64_t)f->scores_cap, out0);
    } else { /* the scores of rows [j0, j0 + chunk) for every head */
        const int64_t j0 = piece * c->chunk;
        if (j0 >= n) return;
        float qh[CB_ATTN_MAX_HPT * CB_FORWARD_MAX_HEAD_DIM];
        const float *q0 = attn_query(f, f->q + (size_t)(t * m->n_head + hk * G) * (size_t)hd, G * hd, qh);
        s = attn_rows(f, t, lo + j0, n - j0 < c->chunk ? n - j0 : c->chunk, kel, q0, hd, hd, (int)G,
                      f->scores[pair] + j0, (int64_t)f->scores_cap, NULL);
    }
    if (s != CB_OK) c->status = s;
}

static void attn_score_task(void *vctx, int task, int thread) {
    (void)thread;
    attn_split_task(vctx, task, 0);
}

static void attn_value_task(void *vctx, int task, int thread) {
    (void)thread;
    attn_split_task(vctx, task, 1);
}

/* Whether the split path runs this layer: its query heads were split between tasks (hpt below
 * the group) and the pairs fit the score scratch (one thread's, CB_ATTN_MAX_HPT heads, per
 * pair). It paid from the shortest contexts measured (40 positions) on. */
static int attn_split_applies(const attn_ctx *c, int64_t n_tokens) {
    const int32_t g = c->f->m->n_head / c->n_kv;
    return c->hpt < g && g <= CB_ATTN_MAX_HPT && n_tokens * c->n_kv <= c->f->n_threads;
}

static cb_status attention_split(attn_ctx *c, int64_t n_tokens) {
    cb_forward_t *f = c->f;
    const int64_t pairs = n_tokens * c->n_kv, G = f->m->n_head / c->n_kv;
    int64_t max_rows = 0, lo; /* the longest span of the batch */
    for (int64_t t = 0; t < n_tokens; t++) {
        const int64_t n = attn_span(c, t, &lo);
        if (n > max_rows) max_rows = n;
    }
    const int64_t want = (2 * f->n_threads + pairs - 1) / pairs; /* tasks per pair */
    c->chunk = ((max_rows + want - 1) / want + 7) / 8 * 8;
    c->n_chunks = (max_rows + c->chunk - 1) / c->chunk;
    c->n_cols = want;
    while (c->n_cols > 1 && (c->hv % c->n_cols || (c->hv / c->n_cols) % 64)) c->n_cols--;
    c->cols = c->hv / c->n_cols;
    CHECK_OK(cb_threadpool_run(f->pool, attn_score_task, c, (int)(pairs * c->n_chunks)));
    if (c->status != CB_OK) return c->status;
    for (int64_t pr = 0; pr < pairs; pr++) {
        int64_t lo;
        const int64_t n = attn_span(c, pr / c->n_kv, &lo);
        const float *sk = f->m->layers[c->layer].attn_sinks;
        for (int64_t h = 0; h < G; h++)
            attn_softmax(f, f->scores[pr] + h * (int64_t)f->scores_cap, n,
                         sk ? sk + (pr % c->n_kv) * G + h : NULL);
    }
    CHECK_OK(cb_threadpool_run(f->pool, attn_value_task, c, (int)(pairs * c->n_cols)));
    return c->status;
}

static int same_rope(const cb_rope_params_t *a, const cb_rope_params_t *b) {
    return a->n_dims == b->n_dims && a->mode == b->mode && a->freq_base == b->freq_base &&
           a->freq_scale == b->freq_scale && a->ext_factor == b->ext_factor &&
           a->attn_factor == b->attn_factor && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->n_ctx_orig == b->n_ctx_orig &&
           a->freq_factors == b->freq_factors;
}


/* The pre-norm of a block (attention, FFN, output): RMSNorm, or LayerNorm with its bias when
 * the model says so (phimoe). */
static cb_status pre_norm(const cb_model_desc_t *m, const float *x, int64_t n, const float *w,
                          const float *bias, float *out) {
    const int64_t E = m->n_embd;
    if (m->layer_norm) return cb_layernorm_rows(x, E, n, E, w, bias, m->norm_eps, out, E);
    return cb_rmsnorm_rows(x, E, n, E, w, m->norm_eps, 0, out, E);
}

/* The layer's RoPE parameters, and their cos/sin of the batch's positions in f->rope_cs /
 * rope_sn (kept from the previous layer when the same). hd: the rotated heads' dim. */
static cb_status rope_prepare(cb_forward_t *f, const cb_layer_desc_t *L, int64_t n, int64_t hd,
                              cb_rope_params_t *rp) {
    const cb_model_desc_t *m = f->m;
    *rp = cb_rope_default_params();
    rp->n_dims = layer_nrot(m, L);
    rp->mode = m->rope_mode;
    rp->freq_base = L->rope_base;
    rp->freq_scale = L->rope_freq_scale;
    rp->freq_factors = L->rope_freqs;
    if (L->rope_attn_factor > 0.0f) rp->attn_factor = L->rope_attn_factor;
    if (L->rope_ext_factor > 0.0f) { /* YaRN */
        rp->ext_factor = L->rope_ext_factor;
        rp->beta_fast = L->rope_beta_fast;
        rp->beta_slow = L->rope_beta_slow;
        rp->n_ctx_orig = L->rope_n_ctx_orig;
    }
    if (!f->rope_ok || f->rope_hd != hd || !same_rope(&f->rope_key, rp)) {
        f->rope_ok = 0;
        CHECK_OK(cb_rope_cache_batch(n, f->pos64, hd, rp, f->rope_cs, f->rope_sn, CB_ROPE_ROW));
        f->rope_key = *rp;
        f->rope_hd = hd;
        f->rope_ok = 1;
    }
    return CB_OK;
}

/* Queries into f->q, the batch's K/V into the cache (every kind but MLA). */
static cb_status qkv(cb_forward_t *f, const cb_batch_t *b, int l, const cb_rope_params_t *rp) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t n = b->n_tokens, E = m->n_embd, hd = layer_hd(m, L), n_kv = layer_nkv(m, L);
    const int64_t nq = (int64_t)m->n_head * hd, nkv = n_kv * hd;
    /* a layer sharing an earlier layer's K/V (kv_from) computes only its queries: nk = 0 */
    const int64_t nk = L->kv_from ? 0 : n_kv;
    if (L->attn_q_gate) { /* each head's query, then its gate */
        CHECK_OK(fmm(f, &L->wq, f->h, n, E, f->qg, 2 * nq));
        for (int64_t t = 0; t < n; t++)
            for (int64_t h = 0; h < m->n_head; h++) {
                const float *src = f->qg + t * 2 * nq + h * 2 * hd;
                memcpy(f->q + t * nq + h * hd, src, (size_t)hd * sizeof(float));
                memcpy(f->qgate + t * nq + h * hd, src + hd, (size_t)hd * sizeof(float));
            }
    } else {
        CHECK_OK(fmm(f, &L->wq, f->h, n, E, f->q, nq));
    }
    if (nk) {
        CHECK_OK(fmm(f, &L->wk, f->h, n, E, f->k, nkv));
        if (L->v_from_k)
            memcpy(f->v, f->k, (size_t)(n * nkv) * sizeof(float));
        else
            CHECK_OK(fmm(f, &L->wv, f->h, n, E, f->v, nkv));
    }
    for (int64_t t = 0; t < n; t++) {
        if (L->bq) cb_add(f->q + t * nq, L->bq, nq, f->q + t * nq);
        if (L->bk && nk) cb_add(f->k + t * nkv, L->bk, nkv, f->k + t * nkv);
        if (L->bv && nk) cb_add(f->v + t * nkv, L->bv, nkv, f->v + t * nkv);
    }
    if (m->qk_norm == CB_QK_NORM_HEAD) {
        CHECK_OK(cb_rmsnorm_rows(f->q, hd, n * m->n_head, hd, L->q_norm, m->norm_eps, 0, f->q, hd));
        CHECK_OK(cb_rmsnorm_rows(f->k, hd, n * nk, hd, L->k_norm, m->norm_eps, 0, f->k, hd));
    } else if (m->qk_norm == CB_QK_NORM_FULL) {
        CHECK_OK(cb_rmsnorm_rows(f->q, nq, n, nq, L->q_norm, m->norm_eps, 0, f->q, nq));
        if (nk) CHECK_OK(cb_rmsnorm_rows(f->k, nkv, n, nkv, L->k_norm, m->norm_eps, 0, f->k, nkv));
    }
    if (L->v_norm && nk) CHECK_OK(cb_rmsnorm_rows(f->v, hd, n * n_kv, hd, NULL, m->norm_eps, 0, f->v, hd));
    const int64_t nd = rp->n_dims ? rp->n_dims : hd;
    for (int64_t t = 0; t < n && !L->no_rope; t++) {
        const float *cs = f->rope_cs + t * CB_ROPE_ROW, *sn = f->rope_sn + t * CB_ROPE_ROW;
        CHECK_OK(cb_rope_apply(f->q + t * nq, m->n_head, hd, hd, nd, rp->mode, cs, sn));
        CHECK_OK(cb_rope_apply(f->k + t * nkv, nk, hd, hd, nd, rp->mode, cs, sn));
    }
    for (int64_t t = 0; t < n && L->attn_temp_scale > 0.0f; t++) /* llama4's temperature */
        cb_scale(f->q + t * nq, nq, logf(floorf(((float)b->pos[t] + 1.0f) / L->attn_temp_floor)
                                         + 1.0f) * L->attn_temp_scale + 1.0f);
    if (L->qk_rms) {
        CHECK_OK(cb_rmsnorm_rows(f->q, hd, n * m->n_head, hd, NULL, m->norm_eps, 0, f->q, hd));
        CHECK_OK(cb_rmsnorm_rows(f->k, hd, n * nk, hd, NULL, m->norm_eps, 0, f->k, hd));
    }
    if (m->qk_norm == CB_QK_NORM_HEAD_POST) { /* hunyuan-moe: the head norms after RoPE */
        CHECK_OK(cb_rmsnorm_rows(f->q, hd, n * m->n_head, hd, L->q_norm, m->norm_eps, 0, f->q, hd));
        CHECK_OK(cb_rmsnorm_rows(f->k, hd, n * nk, hd, L->k_norm, m->norm_eps, 0, f->k, hd));
    }
    /* K/V of every token of the batch into the cache before any query reads */
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < 2 * nk; h++) { /* K heads, then V heads */
            const float *src = (h < n_kv ? f->k + t * nkv : f->v + t * nkv) + (h % n_kv) * hd;
            kv_store(kv_at(f, t, (size_t)b->pos[t], f->kv_off[l] + (size_t)(h * hd)), src, hd, f->kv_elt);
        }
    return CB_OK;
}

static cb_status residual(cb_forward_t *f, const cb_layer_desc_t *L, int64_t n);

static cb_status attention(cb_forward_t *f, const cb_batch_t *b, int l) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t n = b->n_tokens, E = m->n_embd;
    const int mla = L->mla_kv_lora > 0; /* forward_mla.c: one K head, V inside it */
    const int64_t hd = mla ? L->mla_kv_lora + layer_nrot(m, L) : layer_hd(m, L);
    const int64_t hv = mla ? L->mla_kv_lora : hd, n_kv = mla ? 1 : layer_nkv(m, L);
    CHECK_OK(pre_norm(m, f->x, n, L->attn_norm, L->attn_norm_b, f->h));
    if (L->gdn_v_heads) {
        CHECK_OK(cb_gdn_forward(f, b, l));
        return residual(f, L, n);
    }
    cb_rope_params_t rp;
    CHECK_OK(rope_prepare(f, L, n, mla ? layer_nrot(m, L) : hd, &rp));
    CHECK_OK(mla ? cb_mla_qkv(f, b, l) : qkv(f, b, l, &rp));
    const int32_t hpt = attn_heads_per_task(n, m->n_head, (int)n_kv, f->n_threads);
    attn_ctx c = {f, b, l, L->sliding_window, (int32_t)hd, (int32_t)n_kv, (int32_t)hv, mla,
                  L->attn_chunk, hpt, 0, 0, 0, 0, CB_OK};
    if (attn_split_applies(&c, n))
        CHECK_OK(attention_split(&c, n));
    else
        CHECK_OK(cb_threadpool_run(f->pool, attn_task, &c, (int)(n * (m->n_head / hpt))));
    if (c.status != CB_OK) return c.status;
    if (mla) {
        CHECK_OK(cb_mla_out(f, l, n));
        CHECK_OK(fmm(f, &L->wo, f->mla_o, n, (int64_t)m->n_head * L->mla_v_dim, f->o, E));
    } else {
        if (L->attn_q_gate)
            for (int64_t i = 0; i < n * m->n_head * hd; i++)
                f->att[i] *= 1.0f / (1.0f + expf(-f->qgate[i]));
        CHECK_OK(fmm(f, &L->wo, f->att, n, (int64_t)m->n_head * hd, f->o, E));
    }
    return residual(f, L, n);
}

/* x += the block's output f->o (its bias, post-norm and residual scale first) */
static cb_status residual(cb_forward_t *f, const cb_layer_desc_t *L, int64_t n) {
    const cb_model_desc_t *m = f->m;
    const int64_t E = m->n_embd;
    for (int64_t t = 0; t < n; t++) {
        float *o = f->o + t * E;
        if (L->bo) cb_add(o, L->bo, E, o);
        if (L->attn_post_norm) CHECK_OK(cb_rmsnorm(o, L->attn_post_norm, E, m->norm_eps, 0, o));
        if (m->residual_scale != 0.0f && m->residual_scale != 1.0f) cb_scale(o, E, m->residual_scale);
        cb_add(f->x + t * E, o, E, f->x + t * E);
    }
    return CB_OK;
}

/* ---- feed-forward ------------------------------------------------------------------------- */

/* out[rows of h] = down(act(gate h) * up h), for n tokens (rows of h, E floats). g/u: n x ff. */
cb_status cb_fwd_dense_ffn(cb_forward_t *f, const cb_matrix_t *gate, const cb_matrix_t *up,
                           const cb_matrix_t *down, int64_t n, float *out) {
    const int64_t E = f->m->n_embd, ff = gate->rows;
    CHECK_OK(fmm(f, gate, f->h, n, E, f->g, ff));
    CHECK_OK(fmm(f, up, f->h, n, E, f->u, ff));
    CHECK_OK(cb_glu(f->m->act, f->g, f->u, n * ff, f->g));
    return fmm(f, down, f->g, n, ff, out, E);
}

static cb_status ffn(cb_forward_t *f, int l, int64_t n) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t E = m->n_embd;
    CHECK_OK(pre_norm(m, f->x, n, L->ffn_norm, L->ffn_norm_b, f->h));
    const int both = L->n_expert > 0 && mat_present(&L->ffn_gate);
    if (both) {
        /* gemma4: the dense FFN into o2 (post_ffw_norm_1), then the router's own input */
        CHECK_OK(cb_fwd_dense_ffn(f, &L->ffn_gate, &L->ffn_up, &L->ffn_down, n, f->o2));
        CHECK_OK(cb_rmsnorm_rows(f->o2, E, n, E, L->ffn_post_norm_1, m->norm_eps, 0, f->o2, E));
        if (L->router_in_scale) {
            CHECK_OK(cb_rmsnorm_rows(f->x, E, n, E, NULL, m->norm_eps, 0, f->h, E));
            const float s = 1.0f / sqrtf((float)E);
            for (int64_t t = 0; t < n; t++) {
                float *h = f->h + t * E;
                cb_mul(h, L->router_in_scale, E, h);
                cb_scale(h, E, s);
            }
        }
    }
    if (L->n_expert > 0)
        CHECK_OK(cb_fwd_moe_ffn(f, l, n));
    else
        CHECK_OK(cb_fwd_dense_ffn(f, &L->ffn_gate, &L->ffn_up, &L->ffn_down, n, f->o));
    if (both) {
        CHECK_OK(cb_rmsnorm_rows(f->o, E, n, E, L->ffn_post_norm_2, m->norm_eps, 0, f->o, E));
        cb_add(f->o, f->o2, n * E, f->o);
    }
    for (int64_t t = 0; t < n; t++) {
        float *o = f->o + t * E;
        if (L->ffn_post_norm) CHECK_OK(cb_rmsnorm(o, L->ffn_post_norm, E, m->norm_eps, 0, o));
        if (m->residual_scale != 0.0f && m->residual_scale != 1.0f) cb_scale(o, E, m->residual_scale);
        cb_add(f->x + t * E, o, E, f->x + t * E);
    }
    if (m->n_embd_per_layer > 0) { /* gemma4's per-layer embedding block */
        const int64_t P = m->n_embd_per_layer, LP = (int64_t)m->n_layer * P;
        CHECK_OK(fmm(f, &L->pl_inp_gate, f->x, n, E, f->plt, P));
        for (int64_t t = 0; t < n; t++)
            CHECK_OK(cb_glu(CB_ACT_GELU_TANH, f->plt + t * P, f->pli + t * LP + l * P, P,
                            f->plt + t * P));
        CHECK_OK(fmm(f, &L->pl_proj, f->plt, n, P, f->o, E));
        CHECK_OK(cb_rmsnorm_rows(f->o, E, n, E, L->pl_post_norm, m->norm_eps, 0, f->o, E));
        CHECK_OK(cb_add(f->x, f->o, n * E, f->x));
    }
    if (L->out_scale) cb_scale(f->x, n * E, L->out_scale[0]);
    return CB_OK;
}

/* gemma4's per-layer inputs of the batch (forward.h, n_embd_per_layer) from its token ids and
 * scaled embeddings f->x, into f->pli. */
static cb_status per_layer_inputs(cb_forward_t *f, const cb_batch_t *b, int64_t n) {
    const cb_model_desc_t *m = f->m;
    const int64_t E = m->n_embd, P = m->n_embd_per_layer, LP = (int64_t)m->n_layer * P;
    if (!b->tokens)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: a model with per-layer embeddings "
                                                   "needs token ids, not input embeddings");
    CHECK_OK(fmm(f, &m->per_layer_model_proj, f->x, n, E, f->pli, LP));
    cb_scale(f->pli, n * LP, 1.0f / sqrtf((float)E));
    CHECK_OK(cb_rmsnorm_rows(f->pli, P, n * m->n_layer, P, m->per_layer_proj_norm, m->norm_eps,
                             0, f->pli, P));
    CHECK_OK(cb_get_rows(&m->per_layer_tok_embd, b->tokens, n, f->plt));
    const float ts = sqrtf((float)P), s2 = 1.0f / sqrtf(2.0f);
    for (int64_t i = 0; i < n * LP; i++) f->pli[i] = (f->pli[i] + f->plt[i] * ts) * s2;
    return CB_OK;
}

/* ---- non-finite values ---------------------------------------------------------------------- */

/* Index of the first NaN or Inf among x[0..n), or -1. The common all-finite case is one pass
 * of integer compares on the exponent bits, which the compiler vectorises (no float
 * exceptions, no -ffast-math dependence); the slow search runs only when it fires. */
static int64_t first_nonfinite(const float *x, int64_t n) {
    uint32_t any = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    if (!any) return -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

/* CB_STATUS_NOT_FINITE naming where the batch's values first went non-finite: checked after
 * every layer's attention and FFN/MoE block (n * n_embd values each, noise next to the
 * matmuls that produced them), so the first part to fail is the one named. */
static cb_status check_finite(const float *x, int64_t n, int64_t width, const char *part, int l,
                              const cb_model_desc_t *m) {
    int64_t i = first_nonfinite(x, n * width);
    if (i < 0) return CB_OK;
    const char *what = isnan(x[i]) ? "NaN" : "Inf";
    if (l < 0)
        return cb_fail(CB_STATUS_NOT_FINITE,
                       "forward: the logits went non-finite (%s at token %lld of the batch, "
                       "vocabulary entry %lld) although every layer's output was finite: the "
                       "output norm or output projection weights are likely corrupt (a GGUF "
                       "file has no checksum)",
                       what, (long long)(i / width), (long long)(i % width));
    return cb_fail(CB_STATUS_NOT_FINITE,
                   "forward: layer %d of %d is the first whose output went non-finite (%s after "
                   "its %s, token %lld of the batch): its weights are likely corrupt (a GGUF "
                   "file has no checksum)",
                   l, m->n_layer, what, part, (long long)(i / width));
}

/* ---- the batch ---------------------------------------------------------------------------- */

/* Groups the batch by sequence, checks positions, reserves KV room and computes slots. */
static cb_status prepare(cb_forward_t *f, const cb_batch_t *b, int32_t *n_seqs_out,
                         int64_t *max_ctx) {
    const int64_t n = b->n_tokens;
    int32_t ns = 0;
    *max_ctx = 0;
    f->rope_ok = 0; /* new positions */
    for (int64_t t = 0; t < n; t++) {
        uint32_t s = b->seq[t];
        int32_t i = 0;
        while (i < ns && f->seqs[i] != s) i++;
        if (i == ns) {
            size_t len;
            CHECK_OK(cb_kvcache_seq_len(f->kv, s, &len));
            f->seqs[ns] = s;
            f->seq_len0[ns] = len;
            f->seq_n[ns] = 0;
            ns++;
        }
        int64_t want = (int64_t)f->seq_len0[i] + f->seq_n[i];
        if (b->pos[t] != want)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "forward: token %lld of sequence %u is at position %d, expected %lld "
                           "(tokens of a sequence append at consecutive positions)",
                           (long long)t, s, b->pos[t], (long long)want);
        f->seq_n[i]++;
        f->pos64[t] = b->pos[t];
        if (b->pos[t] + 1 > *max_ctx) *max_ctx = b->pos[t] + 1;
    }
    for (int32_t i = 0; i < ns; i++)
        CHECK_OK(cb_kvcache_seq_reserve(f->kv, f->seqs[i], f->seq_len0[i] + (size_t)f->seq_n[i]));
    /* pointers only after every reserve (a reserve may move that sequence's block) */
    for (int64_t t = 0; t < n; t++) {
        void *p0;
        CHECK_OK(cb_kvcache_seq_block(f->kv, b->seq[t], &p0, &f->seq_cap[t]));
        f->seq_base[t] = p0;
        if (f->state_floats) {
            CHECK_OK(cb_kvcache_seq_state(f->kv, b->seq[t], &p0));
            f->seq_state[t] = p0;
        }
    }
    *n_seqs_out = ns;
    return CB_OK;
}

static cb_status ensure_scores(cb_forward_t *f, int64_t max_ctx) {
    if ((size_t)max_ctx <= f->scores_cap) return CB_OK;
    size_t cap = f->scores_cap ? f->scores_cap : 256;
    while (cap < (size_t)max_ctx) cap *= 2;
    for (int t = 0; t < f->n_threads; t++) {
        float *p = cb_realloc(f->scores[t], cap * CB_ATTN_MAX_HPT * sizeof(float));
        if (!p) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "forward: no memory for %zu scores", cap);
        f->scores[t] = p;
    }
    f->scores_cap = cap;
    return CB_OK;
}

cb_status cb_forward_run(cb_forward_t *f, const cb_batch_t *b, float *logits_out) {
    if (!f || !b || !logits_out || !b->seq || !b->pos || (!b->tokens && !b->embd))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "forward: batch needs seq, pos, tokens or embd, and an output");
    const cb_model_desc_t *m = f->m;
    const int64_t n = b->n_tokens, E = m->n_embd;
    if (n < 1 || n > f->max_batch)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: batch of %lld tokens (1..%d)",
                       (long long)n, f->max_batch);
    for (int64_t t = 0; t < n; t++)
        if (b->pos[t] < 0)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: negative position %d",
                           b->pos[t]);
    int32_t ns = 0;
    int64_t max_ctx = 0;
    CHECK_OK(prepare(f, b, &ns, &max_ctx));
    CHECK_OK(ensure_scores(f, max_ctx + 1)); /* + a sink */
    if (b->tokens) {
        CHECK_OK(cb_get_rows(&m->tok_embd, b->tokens, n, f->x));
        if (m->embd_scale != 1.0f && m->embd_scale != 0.0f) cb_scale(f->x, n * E, m->embd_scale);
    } else {
        for (int64_t i = 0; i < n * E; i++)
            if (!isfinite(b->embd[i]))
                return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                               "forward: input embedding of token %lld is not finite",
                               (long long)(i / E));
        memcpy(f->x, b->embd, (size_t)(n * E) * sizeof(float));
    }
    if (m->n_embd_per_layer > 0) CHECK_OK(per_layer_inputs(f, b, n));
    for (int l = 0; l < m->n_layer; l++) {
        CHECK_OK(attention(f, b, l));
        CHECK_OK(check_finite(f->x, n, E, "attention", l, m));
        CHECK_OK(ffn(f, l, n));
        CHECK_OK(check_finite(f->x, n, E, m->layers[l].n_expert > 0 ? "FFN (MoE block)" : "FFN", l, m));
    }
    int64_t nw = 0;
    for (int64_t t = 0; t < n; t++) {
        if (b->logits && !b->logits[t]) continue;
        CHECK_OK(pre_norm(m, f->x + t * E, 1, m->output_norm, m->output_norm_b, f->lrows + nw * E));
        nw++;
    }
    if (nw > 0) {
        CHECK_OK(fmm(f, &m->output, f->lrows, nw, E, logits_out, m->n_vocab));
        if (m->output_b)
            for (int64_t t = 0; t < nw; t++)
                CHECK_OK(cb_add(logits_out + t * m->n_vocab, m->output_b, m->n_vocab,
                                logits_out + t * m->n_vocab));
        if (m->logit_scale != 0.0f && m->logit_scale != 1.0f)
            cb_scale(logits_out, nw * m->n_vocab, m->logit_scale);
        if (m->final_softcap > 0) cb_softcap(logits_out, nw * m->n_vocab, m->final_softcap);
        CHECK_OK(check_finite(logits_out, nw, m->n_vocab, "output", -1, m));
    }
    for (int32_t i = 0; i < ns; i++)
        CHECK_OK(cb_kvcache_seq_set_len(f->kv, f->seqs[i], f->seq_len0[i] + (size_t)f->seq_n[i]));
    return CB_OK;
}
