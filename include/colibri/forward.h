/* The forward pass: one C implementation for every supported architecture.
 *
 * Architectures are data. Python reads the GGUF metadata and fills a cb_model_desc_t: sizes,
 * per-layer tensor pointers and types, and the family's quirks as fields (norm placement,
 * q/k norm kind, RoPE ordering and bases, sliding windows, softcaps, embedding scale, MoE
 * gating). This file computes logits for a batch of tokens drawn from several sequences at
 * once, each at its own position, with K/V in a cb_kvcache_t.
 *
 * One layer, for the batch (x: the residual stream, [n_tokens x n_embd] float32):
 *   h = rmsnorm(x) * attn_norm (layer_norm: LayerNorm with attn_norm_b; likewise every pre-norm)
 *   q = Wq h (+bq), k = Wk h (+bk), v = Wv h (+bv)
 *   (gemma4 attention_k_eq_v: no Wv, v = the K projection)
 *   q/k norm: per head ([head_dim] weights, qwen3/gemma3/gemma4) or over the whole projection
 *             (olmoe); gemma4: v RMS-normed per head without weight; then RoPE at each
 *             token's position (normal or NeoX pairing, the layer's base, rotated dims and
 *             optional rope_freqs divisors)
 *   K/V of each token written into its sequence's KV block; then causal attention of each
 *   query over its sequence's positions 0..pos (only pos-window+1..pos on a sliding-window
 *   layer), scaled by attn_scale, optional tanh softcap, softmax, weighted sum of V
 *   a = Wo attn (+bo); with attn_post_norm: a = rmsnorm(a) * attn_post_norm
 *   x += a
 *   h = rmsnorm(x) * ffn_norm
 *   dense: f = Wdown (act(Wgate h) * Wup h)
 *   MoE:   router logits = Wr h; per token top-k (routing_logic.h: gating, selection bias,
 *          renormalisation, scale); tokens grouped by expert so each chosen expert's weights
 *          stream once per batch; f = sum_k w_k * expert_k(h); plus the shared expert (scaled
 *          by sigmoid(Wsg h) when that gate exists)
 *   gemma4 (experts and a dense FFN in one layer): f = post_norm_1(dense(h)) +
 *          post_norm_2(moe(pre_norm_2(x))), routed on rmsnorm(x) * router_in_scale / sqrt(E),
 *          expert weights times exp_down_scale[e] (see cb_layer_desc_t)
 *   with ffn_post_norm: f = rmsnorm(f) * ffn_post_norm
 *   x += f; with out_scale: x *= out_scale[0]
 * Each layer may have its own head_dim / KV heads / rotated dims (gemma4's sliding and global
 * layers); a token's K/V in the cache are the layers' [K heads][V heads] one after another.
 * then logits = Wout (rmsnorm(x) * output_norm) (+ output_b) for the tokens that want logits,
 * with an optional final tanh softcap.
 *
 * Ownership: the description and everything it points to are borrowed by cb_forward_t for its
 * whole life (Python keeps the file mapping and arrays alive). The KV cache, expert store and
 * thread pool are borrowed too. cb_forward_t owns its scratch buffers, sized at creation for
 * max_batch tokens (the attention score buffer grows with the longest sequence seen).
 *
 * Threads: cb_forward_run uses the pool for matmuls and attention; one run at a time per
 * cb_forward_t (the Cython wrapper releases the GIL around it).
 */
#ifndef COLIBRI_FORWARD_H
#define COLIBRI_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/arena.h"
#include "colibri/experts.h"
#include "colibri/ops.h"
#include "colibri/quant.h"
#include "colibri/status.h"
#include "colibri/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cb_qk_norm {
    CB_QK_NORM_NONE = 0,
    CB_QK_NORM_HEAD = 1, /* RMSNorm of each head, weights [head_dim] (qwen3, gemma3) */
    CB_QK_NORM_FULL = 2, /* RMSNorm over the whole q / k projection (olmoe) */
    CB_QK_NORM_HEAD_POST = 3, /* per head as HEAD, after RoPE instead of before (hunyuan-moe) */
} cb_qk_norm;

/* The description is written once, as the two field tables below (X-macros): each X(KIND,
 * name) line declares one struct member of the C type CB_DESC_T_<KIND>, and the same tables
 * give cb_desc_fields() its (name, offset, kind) entries, through which Python fills the
 * structs by name (colibri/_core/_forward.pxi, colibri/arch.py). Adding a field is one line
 * here plus the reader in colibri/arch.py that sets it. */
typedef enum cb_desc_kind {
    CB_DESC_I32 = 0,  /* int32_t (flags are 0 / 1) */
    CB_DESC_I64 = 1,  /* int64_t */
    CB_DESC_F32 = 2,  /* float */
    CB_DESC_ENUM = 3, /* a C enum (cb_act, cb_qk_norm, cb_rope_mode): int-sized */
    CB_DESC_VEC = 4,  /* const float *: a float32 vector, NULL when absent */
    CB_DESC_MAT = 5,  /* cb_matrix_t; no data (type F32, data NULL) means "absent" */
} cb_desc_kind;

#define CB_DESC_T_I32 int32_t
#define CB_DESC_T_I64 int64_t
#define CB_DESC_T_F32 float
#define CB_DESC_T_VEC const float *
#define CB_DESC_T_MAT cb_matrix_t
#define CB_DESC_T_ACT cb_act
#define CB_DESC_T_QKNORM cb_qk_norm
#define CB_DESC_T_ROPE cb_rope_mode
#define CB_DESC_K_I32 CB_DESC_I32
#define CB_DESC_K_I64 CB_DESC_I64
#define CB_DESC_K_F32 CB_DESC_F32
#define CB_DESC_K_VEC CB_DESC_VEC
#define CB_DESC_K_MAT CB_DESC_MAT
#define CB_DESC_K_ACT CB_DESC_ENUM
#define CB_DESC_K_QKNORM CB_DESC_ENUM
#define CB_DESC_K_ROPE CB_DESC_ENUM

/* One layer. */
#define CB_LAYER_DESC_FIELDS(X)                                                                  \
    X(VEC, attn_norm)       /* [n_embd] */                                                       \
    X(MAT, wq)              /* [n_head*head_dim x n_embd] */                                     \
    X(MAT, wk)              /* [n_kv*head_dim x n_embd] */                                       \
    X(MAT, wv)              /* [n_kv*head_dim x n_embd] (absent with v_from_k) */                \
    X(MAT, wo)              /* [n_embd x n_head*head_dim] */                                     \
    X(VEC, bq) X(VEC, bk) X(VEC, bv) X(VEC, bo) /* biases or NULL */                             \
    X(VEC, q_norm) X(VEC, k_norm) /* see qk_norm; NULL when NONE */                              \
    X(VEC, attn_post_norm)  /* [n_embd] or NULL */                                               \
    X(I32, sliding_window)  /* 0: global attention; else attend to pos-w+1..pos */               \
    X(F32, rope_base)       /* frequency base of this layer */                                   \
    X(F32, rope_freq_scale) /* linear scaling: positions multiplied by this (1 = none) */        \
    X(VEC, ffn_norm)        /* [n_embd] */                                                       \
    X(VEC, ffn_post_norm)   /* [n_embd] or NULL */                                               \
    /* dense FFN (n_expert == 0) */                                                              \
    X(MAT, ffn_gate) X(MAT, ffn_up) X(MAT, ffn_down)                                             \
    /* MoE (n_expert > 0): experts come from the expert store, layer index = this layer */       \
    X(I32, n_expert) X(I32, n_expert_used)                                                       \
    X(MAT, router)          /* [n_expert x n_embd] */                                            \
    X(VEC, router_bias)     /* [n_expert] selection bias or NULL */                              \
    X(I64, n_ff_exp)        /* expert FFN width */                                               \
    /* type, shape and row stride of ONE expert's gate [n_ff_exp x n_embd], up (same) and down   \
     * [n_embd x n_ff_exp]; data is ignored (the expert store provides it per expert) */         \
    X(MAT, exp_gate) X(MAT, exp_up) X(MAT, exp_down)                                             \
    /* shared expert (absent: data NULL) and its optional scalar sigmoid gate [1 x n_embd] */    \
    X(MAT, sh_gate) X(MAT, sh_up) X(MAT, sh_down) X(MAT, sh_gate_inp)                            \
    /* Per-layer attention shape (gemma4: sliding and global layers differ). 0 = the model's    \
     * n_head_kv / head_dim / rope_n_dims. The layer's K/V take 2*n_head_kv*head_dim values     \
     * per token in the cache, the layers one after another. */                                  \
    X(I32, n_head_kv) X(I32, head_dim) X(I32, rope_n_dims)                                       \
    X(VEC, rope_freqs)      /* [rope_n_dims/2] RoPE frequency divisors or NULL */                \
    X(F32, rope_attn_factor) /* cos/sin magnitude, q and k both (LongRoPE); 0 or 1: none */     \
    X(I32, v_norm)          /* RMSNorm of each V head, no weight (gemma4) */                     \
    X(I32, v_from_k)        /* wv absent: V = the K projection before its norm */                \
    X(VEC, out_scale)       /* [1]: the layer's output x is multiplied by it, or NULL */         \
    /* The MoE block beside the dense FFN (gemma4; n_expert > 0 and ffn_gate present):          \
     *   f = rmsnorm(dense(rmsnorm(x) * ffn_norm)) * ffn_post_norm_1                             \
     *     + rmsnorm(moe(rmsnorm(x) * ffn_pre_norm_2)) * ffn_post_norm_2                         \
     * router input rmsnorm(x) * router_in_scale / sqrt(n_embd) (no weight on the norm);         \
     * expert e's output is multiplied by exp_down_scale[e]. */                                  \
    X(VEC, ffn_post_norm_1) X(VEC, ffn_pre_norm_2) X(VEC, ffn_post_norm_2) /* [n_embd] */        \
    X(VEC, router_in_scale) /* [n_embd] or NULL (router reads the FFN input) */                  \
    X(VEC, exp_down_scale)  /* [n_expert] or NULL */                                         \
    X(VEC, attn_norm_b) X(VEC, ffn_norm_b) /* LayerNorm biases (layer_norm) or NULL */         \
    /* per-layer embeddings (n_embd_per_layer > 0, gemma4), after the FFN's residual add:       \
     * x += rmsnorm(pl_proj (gelu(pl_inp_gate x) * pli_l)) * pl_post_norm */                    \
    X(MAT, pl_inp_gate)     /* [n_embd_per_layer x n_embd] */                                    \
    X(MAT, pl_proj)         /* [n_embd x n_embd_per_layer] */                                    \
    X(VEC, pl_post_norm)    /* [n_embd] */                                                     \
    X(I32, kv_from)         /* 0: own K/V; else 1 + the earlier layer whose cached K/V it      \
                               attends to (gemma4 KV sharing: no K/V projection, no cache) */  \
    /* YaRN (ext_factor > 0; ops.h cb_rope_params_t): the mix, its ramp and original context */ \
    X(F32, rope_ext_factor) X(F32, rope_beta_fast) X(F32, rope_beta_slow)                      \
    X(I32, rope_n_ctx_orig)                                                                    \
    /* Multi-head latent attention (mla_kv_lora > 0, deepseek2): head_dim = nope + rope dims    \
     * (rope_n_dims), n_head_kv 1. q = wq h, or wq_b (rmsnorm(wq_a h) * q_a_norm); c|k_pe =     \
     * wkv_a h; c = rmsnorm(c) * kv_a_norm; k_pe and each head's last rope dims rotated. The     \
     * cache keeps c|k_pe per token (kv_lora + rope values, not full K and V); each head       \
     * attends with the absorbed query (wk_b_h q_nope_h)|q_pe_h over those rows, its output    \
     * wv_b_h (sum p c), then wo over the heads' values. */                                     \
    X(I32, mla_kv_lora) X(I32, mla_nope) X(I32, mla_v_dim)                                     \
    X(MAT, wq_a)            /* [q_lora x n_embd] or absent (then wq) */                        \
    X(VEC, q_a_norm)        /* [q_lora] */                                                     \
    X(MAT, wq_b)            /* [n_head*(nope+rope) x q_lora] */                                \
    X(MAT, wkv_a)           /* [kv_lora+rope x n_embd] */                                      \
    X(VEC, kv_a_norm)       /* [kv_lora] */                                                    \
    X(MAT, wk_b)            /* [n_head*kv_lora x nope]: head h's rows h*kv_lora.. */           \
    X(MAT, wv_b)            /* [n_head*v_dim x kv_lora] */                                     \
    /* gpt-oss: per-head attention sinks (a logit each head's softmax includes, with no value), \
     * the router's bias (added to its logits) and the experts' biases, [n_expert x rows]:      \
     * gate and up before the activation, down times the routing weight after */               \
    X(VEC, attn_sinks)      /* [n_head] or NULL */                                             \
    X(VEC, router_b)        /* [n_expert] or NULL */                                           \
    X(VEC, exp_gate_b) X(VEC, exp_up_b) /* [n_expert x n_ff_exp] or NULL */                    \
    X(VEC, exp_down_b)      /* [n_expert x n_embd] or NULL */                                  \
    /* llama4: chunked attention (a query at p attends to its chunk's positions p/c*c..p), no    \
     * RoPE on the global layers but the queries times log(floor((p+1)/floor)+1)*scale+1, and   \
     * q/k heads RMS-normed (no weight) after RoPE */                                          \
    X(I32, attn_chunk)      /* 0: none */                                                      \
    X(I32, no_rope)                                                                            \
    X(F32, attn_temp_scale) X(F32, attn_temp_floor) /* 0: none */                              \
    X(I32, qk_rms)                                                                             \
    /* qwen3next: attn_q_gate: wq is [n_head*2*head_dim x n_embd], each head's query then its   \
     * gate; the attention output of the head times sigmoid(gate) before wo.                   \
     * Gated DeltaNet linear attention (gdn_v_heads > 0; forward_gdn.c): no q/k/v tensors and   \
     * no K/V in the cache but a recurrent state per sequence (the cache's state_bytes):        \
     * x = conv(gdn_qkv h) (causal depthwise, gdn_conv taps, SiLU) = q | k (gdn_k_heads heads   \
     * of gdn_head_k) | v (gdn_v_heads of gdn_head_v); q, k L2-normed, q / sqrt(head_k); value \
     * head j reads q/k head j / (v_heads / k_heads); b | a per k head group from gdn_ba h;    \
     * decay exp(gdn_a * softplus(a + gdn_dt)), beta sigmoid(b); the delta rule on the head's  \
     * [head_k x head_v] state S: S *= decay, S += k (beta (v - S^T k))^T, o = S^T q; then      \
     * rmsnorm(o) * gdn_norm * silu(gdn_z h) per head, and wo [n_embd x v_heads*head_v].        \
     * State per layer: the last gdn_conv-1 conv inputs, then the v_heads S matrices (floats). */ \
    X(I32, attn_q_gate)                                                                        \
    X(I32, gdn_k_heads) X(I32, gdn_v_heads) X(I32, gdn_head_k) X(I32, gdn_head_v)              \
    X(I32, gdn_conv)                                                                           \
    X(MAT, gdn_qkv)         /* [2*k_heads*head_k + v_heads*head_v x n_embd] */                 \
    X(MAT, gdn_z)           /* [v_heads*head_v x n_embd] */                                    \
    X(MAT, gdn_ba)          /* [2*v_heads x n_embd] */                                         \
    X(VEC, gdn_conv_w)      /* [conv channels x gdn_conv] */                                   \
    X(VEC, gdn_a) X(VEC, gdn_dt) /* [v_heads]: -exp(A_log), the dt bias */                     \
    X(VEC, gdn_norm)        /* [head_v] */

/* The model (plus `layers`, the [n_layer] layer table, set by whoever assembles it). */
#define CB_MODEL_DESC_FIELDS(X)                                                                  \
    X(I32, n_embd) X(I32, n_layer) X(I32, n_head) X(I32, n_head_kv) X(I32, head_dim)             \
    X(I32, n_vocab)                                                                              \
    X(F32, norm_eps)        /* RMSNorm epsilon */                                                \
    X(ACT, act)             /* FFN activation (ops.h / cuda/kernel_abi.h) */                     \
    X(QKNORM, qk_norm)                                                                           \
    X(ROPE, rope_mode)      /* ops.h: CB_ROPE_NORMAL (llama) or CB_ROPE_NEOX (qwen, gemma) */    \
    X(I32, rope_n_dims)     /* rotated dims per head (<= head_dim); a layer may override */     \
    X(F32, embd_scale)      /* token embeddings are multiplied by this (gemma: sqrt(n_embd)) */  \
    X(F32, attn_scale)      /* score scale (1/sqrt(head_dim) usually) */                         \
    X(F32, attn_softcap)    /* 0 = none */                                                       \
    X(F32, final_softcap)   /* 0 = none */                                                       \
    X(F32, residual_scale)  /* attention and FFN outputs times this before the residual add     \
                               (granite; 0 or 1 = none) */                                       \
    X(F32, logit_scale)     /* logits times this (granite: 1 / logits_scaling; 0 or 1 = none) */ \
    X(I32, gating)          /* CB_GATING_SOFTMAX or CB_GATING_SIGMOID (routing_logic.h) */      \
    X(I32, expert_renorm)   /* renormalise the top-k weights */                                  \
    X(F32, expert_scale)    /* weights multiplied by this (1 = none) */                          \
    X(I32, expert_groups)   /* group-limited routing (routing_logic.h): groups, 0 or 1 = none */ \
    X(I32, expert_groups_used) /* the groups that compete */                                     \
    X(I32, expert_weight_in) /* llama4: the routing weight scales the expert's input, not its    \
                               output (top-1 only) */                                            \
    X(MAT, tok_embd)        /* [n_vocab x n_embd] */                                             \
    X(VEC, output_norm)     /* [n_embd] */                                                       \
    X(MAT, output)          /* [n_vocab x n_embd] (tok_embd when tied) */                        \
    X(VEC, output_b)        /* [n_vocab] head bias or NULL (phimoe) */                           \
    X(I32, layer_norm)      /* 1: the attention, FFN and output norms are LayerNorms with       \
                               optional biases (attn_norm_b, ffn_norm_b, output_norm_b) (phimoe) */ \
    X(VEC, output_norm_b)   /* [n_embd] or NULL */                                               \
    /* per-layer embeddings (gemma4): P = n_embd_per_layer (0: none); each token's inputs of     \
     * every layer, pli = (rmsnorm_P(per_layer_model_proj e / sqrt(n_embd)) * per_layer_proj_norm \
     * + per_layer_tok_embd[token] * sqrt(P)) / sqrt(2), e the scaled token embedding,          \
     * [n_layer x P] per token */                                                                \
    X(I32, n_embd_per_layer)                                                                     \
    X(MAT, per_layer_tok_embd)   /* [n_vocab x n_layer*P] */                                     \
    X(MAT, per_layer_model_proj) /* [n_layer*P x n_embd] */                                      \
    X(VEC, per_layer_proj_norm)  /* [P] */

#define CB_DESC_MEMBER_(kind, name) CB_DESC_T_##kind name;

typedef struct cb_layer_desc {
    CB_LAYER_DESC_FIELDS(CB_DESC_MEMBER_)
} cb_layer_desc_t;

typedef struct cb_model_desc {
    CB_MODEL_DESC_FIELDS(CB_DESC_MEMBER_)
    const cb_layer_desc_t *layers; /* [n_layer] */
} cb_model_desc_t;

/* One entry of a description's field table. */
typedef struct cb_desc_field {
    const char *name;
    size_t offset; /* offsetof in cb_model_desc_t or cb_layer_desc_t */
    int32_t kind;  /* cb_desc_kind */
} cb_desc_field_t;

/* The field table of cb_model_desc_t (layer = 0, without `layers`) or of cb_layer_desc_t
 * (layer != 0), in declaration order: *out points to static storage; returns the count. */
int32_t cb_desc_fields(int layer, const cb_desc_field_t **out);

typedef struct cb_forward cb_forward_t;

typedef struct cb_batch {
    int32_t n_tokens;
    const int32_t *tokens;   /* [n_tokens] token ids, or NULL when embd is given */
    const float *embd;       /* [n_tokens x n_embd] input embeddings (used as-is), or NULL */
    const uint32_t *seq;     /* [n_tokens] KV cache sequence of each token */
    const int32_t *pos;      /* [n_tokens] position of each token in its sequence */
    const int8_t *logits;    /* [n_tokens] non-zero: compute this token's logits; NULL = all */
} cb_batch_t;

/* Validates the description (sizes, matrix shapes against the sizes, types supported) and
 * allocates scratch for up to max_batch tokens. kv must hold this model's K/V values per token
 * (n_layer, n_head_kv and head_dim, or one flat row per token); with page_tokens > 1 each K/V
 * head must lie inside one of its rows (INVALID_ARGUMENT naming page_tokens 1 otherwise).
 * experts may be NULL for a dense model. pool may be NULL. */
cb_status cb_forward_new(const cb_model_desc_t *model, cb_kvcache_t *kv, cb_experts_t *experts,
                         cb_threadpool_t *pool, int32_t max_batch, cb_forward_t **out);

void cb_forward_free(cb_forward_t *f);

/* A replacement for the routed experts of every MoE layer (used by Model(device="cuda") to run
 * routing and the expert FFN on a GPU). The forward computes the router logits on the CPU and
 * calls fn(user, layer, h, logits, n_tokens, out) with h [n_tokens x n_embd] (the normed FFN
 * input), logits [n_tokens x n_expert] and out [n_tokens x n_embd] zeroed: fn writes the
 * routed experts' weighted sum into out, each expert's output times its per-expert scale
 * (exp_down_scale) when the layer has one (shared experts are still added by the forward) and
 * returns CB_OK or a failure (which aborts the run). All pointers are borrowed for the call;
 * fn runs on the thread calling cb_forward_run. NULL fn: experts from the expert store. */
typedef cb_status (*cb_moe_hook_fn)(void *user, int32_t layer, const float *h,
                                    const float *logits, int64_t n_tokens, float *out);
void cb_forward_set_moe_hook(cb_forward_t *f, cb_moe_hook_fn fn, void *user);

/* Batch invariance (the default, deterministic != 0): a token's logits are bit-identical
 * whatever else its batch holds (other sequences, a longer or shorter chunk of its own), since
 * every matmul sums a row the same way whatever the token count (cb_matmul_opts_t.fast = 0),
 * attention reads only the token's own sequence, and the MoE adds experts in ascending id.
 * 0: the matmuls may use the faster kernels that are not invariant (last bits differ). */
void cb_forward_set_deterministic(cb_forward_t *f, int deterministic);

/* Runs one batch. Positions: for every sequence, its tokens in the batch must be at
 * consecutive positions, in batch order, starting at the sequence's current length (they
 * append; cb_kvcache_seq_set_len truncates first to rewrite). The K/V block is reserved as
 * needed. logits_out receives [n_wanted x n_vocab] rows, in batch order of the tokens that
 * want logits. On error nothing of the cache's lengths has changed. The hidden state is
 * checked for NaN/Inf after every layer's attention and FFN/MoE block, and the logits at the
 * end: CB_STATUS_NOT_FINITE names the first layer and part whose output went non-finite (or
 * the output layer), the sign of corrupt weights. A recurrent state (gdn layers) advances
 * during the run: after an error the batch's sequences with one must restart (length 0). */
cb_status cb_forward_run(cb_forward_t *f, const cb_batch_t *batch, float *logits_out);

#ifdef __cplusplus
}
#endif
#endif
