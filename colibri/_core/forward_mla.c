/* Multi-head latent attention (DeepSeek-V2/V3, Kimi K2: forward.h, mla_kv_lora), the absorbed
 * form llama.cpp runs: MLA becomes multi-query attention with one K/V head of kv_lora + rope
 * values, V the first kv_lora of them.
 *
 * Per token: q = wq h (or wq_b (rmsnorm(wq_a h) * q_a_norm)), n_head heads of nope + rope
 * values; c|k_pe = wkv_a h; c = rmsnorm(c) * kv_a_norm; k_pe and every head's q_pe rotated
 * (the layer's RoPE, one head for k_pe). The cache row of the token is c|k_pe. Head h's query
 * becomes (wk_b_h q_nope_h)|q_pe_h (kv_lora + rope values): its scores against a cached row are
 * q_nope_h . (wk_b_h^T c) + q_pe_h . k_pe, the ones of the full keys, without expanding the
 * keys. forward.c's attention then gives each head sum_j p_j c_j (kv_lora values), and
 * cb_mla_out turns it into the head's value wv_b_h (sum_j p_j c_j) = sum_j p_j (wv_b_h c_j).
 *
 * The per-head products (wk_b_h, wv_b_h) are one matmul per head over the batch's tokens, each
 * head's rows gathered into a contiguous block first: a token's numbers do not depend on the
 * batch (the matmuls are batch-invariant), as everywhere in the forward pass.
 */
#include <stddef.h>
#include <string.h>

#include "forward_impl.h"

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

cb_status cb_mla_validate(const cb_model_desc_t *m, const cb_layer_desc_t *L, int l,
                          int64_t *nq, size_t *kv_elems, int64_t *scratch) {
    const int64_t H = m->n_head, E = m->n_embd, R = layer_nrot(m, L), C = L->mla_kv_lora;
    const int64_t N = L->mla_nope, V = L->mla_v_dim, hd = layer_hd(m, L);
    if (C <= 0 || N <= 0 || V <= 0 || R <= 0 || R % 2 || hd != N + R || L->kv_from ||
        L->sliding_window != 0 || C + R > CB_FORWARD_MAX_HEAD_DIM || V > CB_FORWARD_MAX_HEAD_DIM)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "forward: layer %d: MLA sizes not supported (kv_lora %lld, nope %lld, rope "
                       "%lld, head_dim %lld, v %lld, kv_from %d, window %d; kv_lora + rope and v "
                       "at most %d)", l, (long long)C, (long long)N, (long long)R, (long long)hd,
                       (long long)V, L->kv_from, L->sliding_window, CB_FORWARD_MAX_HEAD_DIM);
    if (!L->kv_a_norm || (L->wq_a.data && !L->q_a_norm))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: MLA norms missing", l);
    int64_t q_lora = 0;
    if (L->wq_a.data) {
        q_lora = L->wq_a.rows;
        CHECK_OK(cb_fw_check_mat(&L->wq_a, q_lora, E, "attn_q_a", l));
        CHECK_OK(cb_fw_check_mat(&L->wq_b, H * hd, q_lora, "attn_q_b", l));
    } else {
        CHECK_OK(cb_fw_check_mat(&L->wq, H * hd, E, "attn_q", l));
    }
    CHECK_OK(cb_fw_check_mat(&L->wkv_a, C + R, E, "attn_kv_a_mqa", l));
    CHECK_OK(cb_fw_check_mat(&L->wk_b, H * C, N, "attn_k_b", l));
    CHECK_OK(cb_fw_check_mat(&L->wv_b, H * V, C, "attn_v_b", l));
    CHECK_OK(cb_fw_check_mat(&L->wo, E, H * V, "attn_output", l));
    *nq = H * (C + R);
    *kv_elems = (size_t)(C + R);
    *scratch = max64(max64(H * hd, H * V), max64(q_lora, max64(C + R, N)));
    return CB_OK;
}

/* rows [n x cols] of x (row stride xs, from column c0) into out [n x cols] */
static void gather(const float *x, int64_t n, int64_t xs, int64_t c0, int64_t cols, float *out) {
    for (int64_t t = 0; t < n; t++)
        memcpy(out + t * cols, x + t * xs + c0, (size_t)cols * sizeof(float));
}

/* head h's block of rows (rows rows from row h*rows) of a per-head stacked matrix */
static cb_matrix_t head_rows(const cb_matrix_t *w, int64_t h, int64_t rows) {
    cb_matrix_t s = *w;
    s.rows = rows;
    s.data = (const uint8_t *)w->data + (size_t)(h * rows) * w->row_bytes;
    return s;
}

cb_status cb_mla_qkv(cb_forward_t *f, const cb_batch_t *b, int l) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t n = b->n_tokens, E = m->n_embd, H = m->n_head, R = layer_nrot(m, L);
    const int64_t C = L->mla_kv_lora, N = L->mla_nope, hd = N + R, W = C + R;
    /* queries [n x H x hd] into mla_q */
    if (L->wq_a.data) {
        const int64_t QL = L->wq_a.rows;
        CHECK_OK(fmm(f, &L->wq_a, f->h, n, E, f->mla_t, QL));
        CHECK_OK(cb_rmsnorm_rows(f->mla_t, QL, n, QL, L->q_a_norm, m->norm_eps, 0, f->mla_t, QL));
        CHECK_OK(fmm(f, &L->wq_b, f->mla_t, n, QL, f->mla_q, H * hd));
    } else {
        CHECK_OK(fmm(f, &L->wq, f->h, n, E, f->mla_q, H * hd));
    }
    /* latent and rope key [n x W] into f->k */
    CHECK_OK(fmm(f, &L->wkv_a, f->h, n, E, f->k, W));
    CHECK_OK(cb_rmsnorm_rows(f->k, W, n, C, L->kv_a_norm, m->norm_eps, 0, f->k, W));
    const cb_rope_mode mode = m->rope_mode;
    for (int64_t t = 0; t < n; t++) {
        const float *cs = f->rope_cs + t * CB_ROPE_ROW, *sn = f->rope_sn + t * CB_ROPE_ROW;
        CHECK_OK(cb_rope_apply(f->mla_q + t * H * hd + N, H, hd, R, R, mode, cs, sn));
        CHECK_OK(cb_rope_apply(f->k + t * W + C, 1, W, R, R, mode, cs, sn));
        kv_store(kv_at(f, t, (size_t)b->pos[t], f->kv_off[l]), f->k + t * W, W, f->kv_elt);
    }
    /* absorbed queries [n x H x W] into f->q: (wk_b_h q_nope_h) | q_pe_h */
    for (int64_t h = 0; h < H; h++) {
        gather(f->mla_q, n, H * hd, h * hd, N, f->mla_t);
        const cb_matrix_t kb = head_rows(&L->wk_b, h, C);
        CHECK_OK(fmm(f, &kb, f->mla_t, n, N, f->q + h * W, H * W));
        for (int64_t t = 0; t < n; t++)
            memcpy(f->q + (t * H + h) * W + C, f->mla_q + (t * H + h) * hd + N, (size_t)R * sizeof(float));
    }
    return CB_OK;
}

cb_status cb_mla_out(cb_forward_t *f, int l, int64_t n) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t H = m->n_head, C = L->mla_kv_lora, V = L->mla_v_dim;
    for (int64_t h = 0; h < H; h++) {
        gather(f->att, n, H * C, h * C, C, f->mla_t);
        const cb_matrix_t vb = head_rows(&L->wv_b, h, V);
        CHECK_OK(fmm(f, &vb, f->mla_t, n, C, f->mla_o + h * V, H * V));
    }
    return CB_OK;
}
