/* Internals of the forward pass shared by forward.c and forward_mla.c (not installed). */
#ifndef COLIBRI_FORWARD_IMPL_H
#define COLIBRI_FORWARD_IMPL_H

#include <string.h>

#include "colibri/forward.h"

#define CB_FORWARD_MAX_HEAD_DIM 1024

#define CHECK_OK(expr)                  \
    do {                                \
        cb_status _s = (expr);          \
        if (_s != CB_OK) return _s;     \
    } while (0)

struct cb_forward {
    const cb_model_desc_t *m;
    cb_kvcache_t *kv;
    cb_experts_t *experts;
    cb_threadpool_t *pool;
    int32_t max_batch;
    int n_threads;
    size_t kv_elt;        /* 4 (f32) or 2 (f16) */
    size_t kv_page, kv_row, kv_tok; /* the cache's page tokens, row and token values (arena.h) */
    size_t *kv_off;       /* [n_layer] element offset of each layer's K/V inside a token */
    int64_t max_ff;       /* widest FFN (dense, expert or shared) */
    int32_t max_expert, max_used;
    /* scratch, [max_batch x ...] */
    float *x, *h, *q, *k, *v, *att, *o, *o2, *g, *u, *rlog, *rw, *shg, *lrows;
    float *pli, *plt;     /* per-layer inputs [max_batch x n_layer*P] and their scratch */
    float *mla_q, *mla_t, *mla_o; /* MLA scratch (forward_mla.c) */
    float *qg, *qgate;    /* gated queries: wq's [n x 2 nq] and the gates [n x nq] */
    float *gdn_x, *gdn_z, *gdn_ba, *gdn_o, *gdn_tmp; /* gated DeltaNet scratch (forward_gdn.c) */
    size_t *gdn_off;      /* [n_layer] float offset of each linear layer's state */
    size_t state_floats;  /* recurrent state floats per sequence (0: none) */
    float **seq_state;    /* per token: its sequence's recurrent state */
    int32_t *rid, *lists, *cnt, *start, *used, *fill, *ent;
    int64_t *pos64;
    uint32_t *seqs;       /* distinct sequences of the batch */
    size_t *seq_len0;     /* their lengths before the batch */
    int32_t *seq_n;       /* their token counts in the batch */
    size_t *seq_cap;      /* per token: its sequence's capacity (the block's layout) */
    uint8_t **seq_base;   /* per token: its sequence's block */
    cb_expert_ref_t *refs;
    void *moe_ws;         /* the routed experts' workspace (moe_impl.h), 64-byte aligned */
    size_t moe_ws_bytes;
    float **scores;       /* per thread */
    size_t scores_cap;    /* positions per head: each thread holds CB_ATTN_MAX_HPT heads */
    cb_moe_hook_fn moe_hook; /* routed experts elsewhere (a GPU), or NULL */
    void *moe_hook_user;
    int fast;             /* !deterministic: cb_matmul_opts_t.fast */
    /* RoPE's cos/sin of the batch's positions [max_batch x CB_ROPE_ROW], kept from layer to
     * layer while the parameters stay (every layer of most models; Gemma 3's local and global
     * layers alternate): the same numbers as cb_rope_batch, computed once instead of twice a
     * layer (pow and sincos were ~1% of Gemma's decode, on the caller while workers wait) */
    float *rope_cs, *rope_sn;
    cb_rope_params_t rope_key;
    int64_t rope_hd;
    int rope_ok;          /* 0: none yet in this forward run */
};

#define CB_ROPE_ROW (CB_FORWARD_MAX_HEAD_DIM / 2)

static inline cb_status fmm(const cb_forward_t *f, const cb_matrix_t *w, const float *x,
                            int64_t n, int64_t xs, float *y, int64_t ys) {
    cb_matmul_opts_t o = cb_matmul_default_opts();
    o.fast = f->fast;
    return cb_matmul_ex(w, x, n, xs, y, ys, &o, f->pool);
}

/* A layer's attention shape: its own values, or the model's where the layer says 0. */
static inline int32_t layer_hd(const cb_model_desc_t *m, const cb_layer_desc_t *L) {
    return L->head_dim > 0 ? L->head_dim : m->head_dim;
}
static inline int32_t layer_nkv(const cb_model_desc_t *m, const cb_layer_desc_t *L) {
    return L->n_head_kv > 0 ? L->n_head_kv : m->n_head_kv;
}
static inline int32_t layer_nrot(const cb_model_desc_t *m, const cb_layer_desc_t *L) {
    int32_t r = L->rope_n_dims > 0 ? L->rope_n_dims : m->rope_n_dims;
    return r > 0 ? r : layer_hd(m, L);
}

/* Address of element elem (counted in a position-major token) of token pos of token t's
 * sequence: the cache's layout (arena.h). */
static inline uint8_t *kv_at(const cb_forward_t *f, int64_t t, size_t pos, size_t elem) {
    return f->seq_base[t] + cb_kvcache_row_elem(pos, f->seq_cap[t], f->kv_page, f->kv_tok, f->kv_row, elem) * f->kv_elt;
}

static inline void kv_store(uint8_t *dst, const float *src, int64_t n, size_t elt) {
    if (elt == 4) memcpy(dst, src, (size_t)n * sizeof(float));
    else cb_f32_to_f16_n(src, n, (uint16_t *)(void *)dst);
}

static inline int mat_present(const cb_matrix_t *w) { return w->data != NULL; }

/* out[rows of f->h] = down(act(gate h) * up h) for n tokens (forward.c) */
cb_status cb_fwd_dense_ffn(cb_forward_t *f, const cb_matrix_t *gate, const cb_matrix_t *up,
                           const cb_matrix_t *down, int64_t n, float *out);
/* the MoE block of layer l into f->o (forward_moe.c) */
cb_status cb_fwd_moe_ffn(cb_forward_t *f, int l, int64_t n);

/* Multi-head latent attention (forward_mla.c; forward.h, mla_kv_lora): */
/* checks an MLA layer's tensors; *nq: its query values per token after absorption, *kv_elems:
 * its cache values per token, *scratch: the per-token floats of its own scratch */
cb_status cb_mla_validate(const cb_model_desc_t *m, const cb_layer_desc_t *L, int l,
                          int64_t *nq, size_t *kv_elems, int64_t *scratch);
/* the absorbed queries [n x n_head x (kv_lora + rope)] into f->q, each token's latent and
 * rotated key into the cache; rp: the layer's RoPE (its cos/sin in f->rope_cs / rope_sn) */
cb_status cb_mla_qkv(cb_forward_t *f, const cb_batch_t *b, int l);
/* the heads' latent outputs f->att [n x n_head x kv_lora] to values [n x n_head x v_dim] in
 * f->mla_o */
cb_status cb_mla_out(cb_forward_t *f, int l, int64_t n);

/* Gated DeltaNet (forward_gdn.c; forward.h, gdn_v_heads): checks a linear layer's tensors;
 * *state: its state floats per sequence, *scratch: the per-token floats of each of its four
 * scratch rows (conv channels at most) */
/* forward.c: the matrix is present, rows x cols, and valid (cb_matrix_check); else an error
 * naming the layer and the tensor */
cb_status cb_fw_check_mat(const cb_matrix_t *w, int64_t rows, int64_t cols, const char *what,
                          int layer);
cb_status cb_gdn_validate(const cb_model_desc_t *m, const cb_layer_desc_t *L, int l,
                          size_t *state, int64_t *scratch);
/* the layer's output [n x n_embd] into f->o from the normed input f->h, each token's state
 * advanced in batch order */
cb_status cb_gdn_forward(cb_forward_t *f, const cb_batch_t *b, int l);

#endif
