/* routing_logic.h: the routing math of one token, shared by the CUDA routing kernel
 * (cuda/routing.cu, compiled by nvcc) and the CPU router (C11, compiled by gcc).
 *
 * Written in the common subset of C11 and CUDA C++: no C++ features, no dynamic memory, no
 * globals. Every function is `static inline` and marked CB_HD, which is
 * `__host__ __device__` under nvcc and empty for a plain C compiler.
 *
 * The routing of one token (n_experts router logits -> k expert ids and k weights):
 *   1. gating: softmax over all experts, or sigmoid per expert -> score[e] (in (0, 1]);
 *   2. selection value sel[e] = score[e] + bias[e] when a selection bias is given
 *      (DeepSeek-V3 "aux-loss-free" balancing), else score[e]; the bias only chooses
 *      experts, it never enters the weights;
 *   3. top-k of sel, ties broken by the lower expert id; ids come out in descending order of
 *      sel (equal values: ascending id);
 *   4. weights w_i = score[id_i] (unbiased); with renorm, w_i /= sum_i w_i;
 *   5. w_i *= scale (DeepSeek-V3's routed_scaling_factor; 1 for most models).
 * Group-limited (DeepSeek-V3, Ling/Bailing: n_group > 1, cb_route_token_grouped, CPU only):
 * experts in n_group equal groups of consecutive ids; a group's score is the sum of its two
 * largest selection values; only the group_used best groups (ties: lower group) compete in 3.
 * Sparsemixer (PhiMoE, its inference form): experts chosen by raw logit (plus bias); w_i is the
 * softmax, at id_i, over the experts not chosen before whose logits l are within the jitter
 * band of l[id_i] = m: (m - l) / max(|l|, m) <= 2 * CB_SPARSEMIXER_EPS; then steps 4-5.
 * All arithmetic is float32 with expf; host and device results can differ by a few ulp in the
 * weights (different expf implementations), never in the ids unless two selection values
 * are within that rounding of each other.
 *
 * Validity: n_experts in [1, CB_ROUTE_MAX_EXPERTS], k in [1, min(n_experts, CB_ROUTE_MAX_K)],
 * gating one of CB_GATING_*, every logit (and bias) finite. cb_route_token returns
 * CB_ROUTE_OK or a negative CB_ROUTE_E* code and then writes ids = -1, weights = 0 (when the
 * output pointers are non-NULL), so a device kernel can flag the error without trapping.
 *
 * Pointers (all borrowed, none retained): logits [n_experts] float32, bias [n_experts]
 * float32 or NULL, ids [k] int32 out, weights [k] float32 out.
 */
#ifndef COLIBRI_CUDA_ROUTING_LOGIC_H
#define COLIBRI_CUDA_ROUTING_LOGIC_H

#ifdef __CUDACC__
#define CB_HD __host__ __device__
#else
#define CB_HD
#include <math.h>
#endif

#define CB_ROUTE_MAX_EXPERTS 1024
#define CB_ROUTE_MAX_K 32
/* the most experts the device routes with a warp per token (routing.cu keeps 8 a lane in
 * registers); above it a thread routes each token */
#define CB_ROUTE_WARP_MAX_EXPERTS 256

#define CB_GATING_SOFTMAX 0
#define CB_GATING_SIGMOID 1
#define CB_GATING_SPARSEMIXER 2
/* gpt-oss: experts chosen by raw logit (plus bias); w_i = softmax over the k chosen logits */
#define CB_GATING_SOFTMAX_WEIGHT 3
/* PhiMoE's router_jitter_noise (its published configs; GGUF files do not carry it) */
#define CB_SPARSEMIXER_EPS 0.01f

#define CB_ROUTE_OK 0
#define CB_ROUTE_EARG (-1)    /* n_experts, k or gating out of range */
#define CB_ROUTE_ENONFINITE (-2) /* a logit or bias is NaN or infinite */

/* 1 if x is finite, without isfinite() (which is a macro in C and a function in CUDA C++):
 * NaN fails the first comparison, +-inf the second. */
CB_HD static inline int cb_route_finite(float x) {
    return x == x && x - x == 0.0f;
}

/* Gating score of expert e: softmax uses the row maximum `mx` and the reciprocal of the
 * sum of exp(l - mx) `inv_sum`; sigmoid ignores both. */
CB_HD static inline float cb_route_score(float logit, int gating, float mx, float inv_sum) {
    if (gating == CB_GATING_SOFTMAX) return expf(logit - mx) * inv_sum;
    return 1.0f / (1.0f + expf(-logit));
}

/* Route one token (see the top of the file) with experts outside the allowed groups skipped:
 * group_of_mask bit g set = group g competes, group size n_experts / n_group (n_group 1: all
 * compete). Returns CB_ROUTE_OK or a CB_ROUTE_E* code. */
CB_HD static inline int cb_route_token_masked(const float *logits, int n_experts, int k,
                                              int gating, const float *bias, int renorm,
                                              float scale, int n_group,
                                              unsigned long long group_mask, int *ids,
                                              float *weights) {
    float sel[CB_ROUTE_MAX_K];
    int i, e, n = 0;
    float mx = 0.0f, inv_sum = 1.0f;
    int status = CB_ROUTE_OK;
    const int per_group = n_group > 1 ? n_experts / n_group : n_experts;
    if (logits == 0 || ids == 0 || weights == 0 || n_experts < 1 ||
        n_experts > CB_ROUTE_MAX_EXPERTS || k < 1 || k > n_experts || k > CB_ROUTE_MAX_K ||
        (gating != CB_GATING_SOFTMAX && gating != CB_GATING_SIGMOID &&
         gating != CB_GATING_SPARSEMIXER && gating != CB_GATING_SOFTMAX_WEIGHT) ||
        !cb_route_finite(scale)) {
        status = CB_ROUTE_EARG;
        goto fail;
    }
    for (e = 0; e < n_experts; e++) {
        if (!cb_route_finite(logits[e]) || (bias != 0 && !cb_route_finite(bias[e]))) {
            status = CB_ROUTE_ENONFINITE;
            goto fail;
        }
    }
    if (gating == CB_GATING_SOFTMAX) {
        float sum = 0.0f;
        mx = logits[0];
        for (e = 1; e < n_experts; e++) mx = logits[e] > mx ? logits[e] : mx;
        for (e = 0; e < n_experts; e++) sum += expf(logits[e] - mx);
        inv_sum = 1.0f / sum; /* sum >= 1: the maximum contributes exp(0) */
    }
    /* Top-k by insertion into a sorted list of at most k entries. Experts arrive in ascending
     * id order and an entry only moves ahead of strictly smaller values, so equal values keep
     * the lower id first. */
    for (e = 0; e < n_experts; e++) {
        if (n_group > 1 && !((group_mask >> (e / per_group)) & 1ull)) continue;
        float v = gating >= CB_GATING_SPARSEMIXER ? logits[e]
                                                  : cb_route_score(logits[e], gating, mx, inv_sum);
        if (bias != 0) v += bias[e];
        if (n == k && !(v > sel[k - 1])) continue;
        i = n < k ? n++ : k - 1;
        while (i > 0 && v > sel[i - 1]) {
            sel[i] = sel[i - 1];
            ids[i] = ids[i - 1];
            i--;
        }
        sel[i] = v;
        ids[i] = e;
    }
    {
        float total = 0.0f;
        for (i = 0; i < k; i++) {
            if (gating == CB_GATING_SPARSEMIXER) {
                const float m = logits[ids[i]];
                float sum = 0.0f;
                for (e = 0; e < n_experts; e++) {
                    int j, taken = 0;
                    for (j = 0; j < i; j++) taken |= ids[j] == e;
                    const float a = logits[e] < 0.0f ? -logits[e] : logits[e];
                    /* (a NaN quotient, 0 / 0, is not "above": the expert stays in) */
                    if (taken || (m - logits[e]) / (a > m ? a : m) > 2.0f * CB_SPARSEMIXER_EPS)
                        continue;
                    sum += expf(logits[e] - m);
                }
                weights[i] = 1.0f / sum; /* sum >= 1: expert id_i contributes exp(0) */
            } else if (gating == CB_GATING_SOFTMAX_WEIGHT) {
                weights[i] = expf(logits[ids[i]] - logits[ids[0]]); /* normalised below */
            } else {
                weights[i] = cb_route_score(logits[ids[i]], gating, mx, inv_sum);
            }
            total += weights[i];
        }
        /* total > 0 unless every selected sigmoid underflowed to 0 (logits below about -88):
         * then the weights stay 0 rather than becoming NaN. */
        float f = ((renorm || gating == CB_GATING_SOFTMAX_WEIGHT) && total > 0.0f) ? scale / total
                                                                                : scale;
        for (i = 0; i < k; i++) weights[i] *= f;
    }
    return CB_ROUTE_OK;
fail:
    if (ids != 0 && weights != 0 && k >= 1 && k <= CB_ROUTE_MAX_K) {
        for (i = 0; i < k; i++) {
            ids[i] = -1;
            weights[i] = 0.0f;
        }
    }
    return status;
}

/* Route one token (see the top of the file). Returns CB_ROUTE_OK or a CB_ROUTE_E* code. */
CB_HD static inline int cb_route_token(const float *logits, int n_experts, int k, int gating,
                                       const float *bias, int renorm, float scale, int *ids,
                                       float *weights) {
    return cb_route_token_masked(logits, n_experts, k, gating, bias, renorm, scale, 1, 0ull,
                                 ids, weights);
}

#define CB_ROUTE_MAX_GROUPS 64
#ifndef __CUDACC__
/* Group-limited routing (see the top): n_group in [2, CB_ROUTE_MAX_GROUPS] dividing n_experts
 * into groups of at least 2, group_used in [1, n_group], softmax or sigmoid gating; the rest
 * as cb_route_token. Host only (the device routes without groups). */
static inline int cb_route_token_grouped(const float *logits, int n_experts, int k, int gating,
                                         const float *bias, int renorm, float scale,
                                         int n_group, int group_used, int *ids,
                                         float *weights) {
    float gs[CB_ROUTE_MAX_GROUPS];
    unsigned long long mask = 0ull;
    int g, e, j;
    if (n_group <= 1)
        return cb_route_token(logits, n_experts, k, gating, bias, renorm, scale, ids, weights);
    if (logits == 0 || n_group > CB_ROUTE_MAX_GROUPS || n_experts < 2 * n_group ||
        n_experts % n_group || group_used < 1 || group_used > n_group ||
        k > group_used * (n_experts / n_group) ||
        (gating != CB_GATING_SOFTMAX && gating != CB_GATING_SIGMOID) ||
        n_experts > CB_ROUTE_MAX_EXPERTS || !cb_route_finite(scale))
        return cb_route_token_masked(logits, n_experts, k, -1, bias, renorm, scale, 1, 0ull,
                                     ids, weights); /* CB_ROUTE_EARG, outputs cleared */
    const int per = n_experts / n_group;
    float mx = 0.0f, inv_sum = 1.0f;
    if (gating == CB_GATING_SOFTMAX) {
        float sum = 0.0f;
        mx = logits[0];
        for (e = 1; e < n_experts; e++) mx = logits[e] > mx ? logits[e] : mx;
        for (e = 0; e < n_experts; e++) sum += expf(logits[e] - mx);
        inv_sum = 1.0f / sum;
    }
    for (g = 0; g < n_group; g++) { /* the two largest selection values of each group */
        float a = -INFINITY, b = -INFINITY;
        for (e = g * per; e < (g + 1) * per; e++) {
            float v = cb_route_score(logits[e], gating, mx, inv_sum) + (bias ? bias[e] : 0.0f);
            if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
        }
        gs[g] = a + b;
    }
    for (j = 0; j < group_used; j++) { /* the best groups, ties to the lower id */
        int best = -1;
        for (g = 0; g < n_group; g++)
            if (!((mask >> g) & 1ull) && (best < 0 || gs[g] > gs[best])) best = g;
        mask |= 1ull << best;
    }
    return cb_route_token_masked(logits, n_experts, k, gating, bias, renorm, scale, n_group,
                                 mask, ids, weights);
}
#endif

/* Round n up to a multiple of tile (tile >= 1). */
CB_HD static inline int cb_route_pad(int n, int tile) {
    return (n + tile - 1) / tile * tile;
}

#endif
