/* Gated DeltaNet linear attention (Qwen3-Next: forward.h, gdn_v_heads), the recurrent form
 * llama.cpp and transformers' torch_recurrent_gated_delta_rule compute, one token at a time.
 *
 * Per token: x = gdn_qkv h (q | k | v channels), z = gdn_z h, b | a = gdn_ba h. The causal
 * depthwise conv reads the sequence's last gdn_conv - 1 inputs (its conv state) and x, then
 * SiLU; the state shifts in x. Value head j (its k head j / (v_heads / k_heads)): q, k
 * L2-normed (eps: the model's norm_eps), q / sqrt(head_k); decay = exp(gdn_a[j] *
 * softplus(a_j + gdn_dt[j])), beta = sigmoid(b_j); with the head's state S [head_k x head_v]:
 * S *= decay; d = beta (v - S^T k); S += k d^T; o = S^T q. Then o = rmsnorm(o) * gdn_norm *
 * silu(z_j), and wo over the heads.
 *
 * State of a layer in the sequence's state (f->gdn_off[l] floats in): [gdn_conv - 1][channels]
 * conv inputs, oldest first, then [v_heads][head_k][head_v]. It is the state after the
 * sequence's length tokens (arena.h): the batch's tokens of a sequence advance it in batch order
 * (their positions are consecutive: prepare()).
 *
 * Parallel over value heads (each task owns its head's state in every sequence, so the tasks
 * never share a write); a head runs the batch's tokens in order. A token's numbers depend only
 * on its sequence's state and its own inputs: batching leaves them bit-identical.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "forward_impl.h"

cb_status cb_gdn_validate(const cb_model_desc_t *m, const cb_layer_desc_t *L, int l,
                          size_t *state, int64_t *scratch) {
    const int64_t nk = L->gdn_k_heads, nv = L->gdn_v_heads, dk = L->gdn_head_k;
    const int64_t dv = L->gdn_head_v, K = L->gdn_conv, E = m->n_embd;
    if (nk <= 0 || nv <= 0 || nv % nk || dk <= 0 || dv <= 0 || dk > CB_FORWARD_MAX_HEAD_DIM ||
        dv > CB_FORWARD_MAX_HEAD_DIM || K < 1 || K > 16 || L->kv_from || L->mla_kv_lora)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "forward: layer %d: linear attention sizes not supported (%lld k heads of "
                       "%lld, %lld v heads of %lld, conv %lld; v heads a multiple of k heads, "
                       "heads at most %d, conv 1..16)", l, (long long)nk, (long long)dk,
                       (long long)nv, (long long)dv, (long long)K, CB_FORWARD_MAX_HEAD_DIM);
    if (!L->gdn_conv_w || !L->gdn_a || !L->gdn_dt || !L->gdn_norm)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "forward: layer %d: linear attention "
                       "vectors (conv, a, dt, norm) missing", l);
    const int64_t C = 2 * nk * dk + nv * dv;
    CHECK_OK(cb_fw_check_mat(&L->gdn_qkv, C, E, "attn_qkv", l));
    CHECK_OK(cb_fw_check_mat(&L->gdn_z, nv * dv, E, "attn_gate", l));
    CHECK_OK(cb_fw_check_mat(&L->gdn_ba, 2 * nv, E, "ssm_ba", l));
    CHECK_OK(cb_fw_check_mat(&L->wo, E, nv * dv, "ssm_out", l));
    *state = (size_t)((K - 1) * C + nv * dk * dv);
    *scratch = C;
    return CB_OK;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* x[0..n) * 1/sqrt(sum x^2 + eps) * scale into out */
static void l2norm(const float *x, int64_t n, float eps, float scale, float *out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = scale / sqrtf(ss + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r;
}

/* The conv over every token of the batch, in batch order: f->gdn_x becomes SiLU(conv). */
static void conv(cb_forward_t *f, const cb_layer_desc_t *L, size_t off, int64_t n) {
    const int64_t K = L->gdn_conv;
    const int64_t C = 2 * (int64_t)L->gdn_k_heads * L->gdn_head_k + (int64_t)L->gdn_v_heads * L->gdn_head_v;
    const float *w = L->gdn_conv_w;
    float *y = f->gdn_tmp;
    for (int64_t t = 0; t < n; t++) {
        float *st = f->seq_state[t] + off, *x = f->gdn_x + t * C;
        for (int64_t c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K - 1; k++) acc += w[c * K + k] * st[k * C + c];
            acc += w[c * K + K - 1] * x[c];
            y[c] = acc / (1.0f + expf(-acc));
        }
        if (K > 1) {
            memmove(st, st + C, (size_t)((K - 2) * C) * sizeof(float));
            memcpy(st + (K - 2) * C, x, (size_t)C * sizeof(float));
        }
        memcpy(x, y, (size_t)C * sizeof(float));
    }
}

typedef struct gdn_ctx {
    cb_forward_t *f;
    const cb_layer_desc_t *L;
    size_t off;
    int64_t n;
    float eps;
} gdn_ctx;

static void head_task(void *vctx, int j, int thread) {
    (void)thread;
    const gdn_ctx *c = vctx;
    const cb_layer_desc_t *L = c->L;
    cb_forward_t *f = c->f;
    const int64_t nk = L->gdn_k_heads, nv = L->gdn_v_heads, dk = L->gdn_head_k, dv = L->gdn_head_v;
    const int64_t K = L->gdn_conv, C = 2 * nk * dk + nv * dv, r = nv / nk, kh = j / r;
    float q[CB_FORWARD_MAX_HEAD_DIM], k[CB_FORWARD_MAX_HEAD_DIM], d[CB_FORWARD_MAX_HEAD_DIM];
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < c->n; t++) {
        const float *x = f->gdn_x + t * C, *ba = f->gdn_ba + t * 2 * nv;
        float *S = f->seq_state[t] + c->off + (K - 1) * C + (size_t)j * dk * dv;
        l2norm(x + kh * dk, dk, c->eps, qscale, q);
        l2norm(x + nk * dk + kh * dk, dk, c->eps, 1.0f, k);
        const float *v = x + 2 * nk * dk + j * dv;
        const float bj = ba[kh * 2 * r + j % r], aj = ba[kh * 2 * r + r + j % r];
        const float decay = expf(L->gdn_a[j] * softplus(aj + L->gdn_dt[j]));
        const float beta = sigmoid(bj);
        for (int64_t e = 0; e < dv; e++) d[e] = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            float *row = S + i * dv;
            const float ki = k[i];
            for (int64_t e = 0; e < dv; e++) {
                row[e] *= decay;
                d[e] += row[e] * ki;
            }
        }
        for (int64_t e = 0; e < dv; e++) d[e] = (v[e] - d[e]) * beta;
        float *o = f->gdn_o + t * nv * dv + j * dv;
        for (int64_t e = 0; e < dv; e++) o[e] = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            float *row = S + i * dv;
            const float ki = k[i], qi = q[i];
            for (int64_t e = 0; e < dv; e++) {
                row[e] += ki * d[e];
                o[e] += row[e] * qi;
            }
        }
        /* the gated RMSNorm of the head */
        float ss = 0.0f;
        for (int64_t e = 0; e < dv; e++) ss += o[e] * o[e];
        const float rn = 1.0f / sqrtf(ss / (float)dv + c->eps);
        const float *z = f->gdn_z + t * nv * dv + j * dv;
        for (int64_t e = 0; e < dv; e++)
            o[e] = o[e] * rn * L->gdn_norm[e] * (z[e] / (1.0f + expf(-z[e])));
    }
}

cb_status cb_gdn_forward(cb_forward_t *f, const cb_batch_t *b, int l) {
    const cb_model_desc_t *m = f->m;
    const cb_layer_desc_t *L = &m->layers[l];
    const int64_t n = b->n_tokens, E = m->n_embd, nv = L->gdn_v_heads, dv = L->gdn_head_v;
    const int64_t C = 2 * (int64_t)L->gdn_k_heads * L->gdn_head_k + nv * dv;
    CHECK_OK(fmm(f, &L->gdn_qkv, f->h, n, E, f->gdn_x, C));
    CHECK_OK(fmm(f, &L->gdn_z, f->h, n, E, f->gdn_z, nv * dv));
    CHECK_OK(fmm(f, &L->gdn_ba, f->h, n, E, f->gdn_ba, 2 * nv));
    conv(f, L, f->gdn_off[l], n);
    gdn_ctx c = {f, L, f->gdn_off[l], n, m->norm_eps};
    CHECK_OK(cb_threadpool_run(f->pool, head_task, &c, (int)nv));
    return fmm(f, &L->wo, f->gdn_o, n, nv * dv, f->o, E);
}
