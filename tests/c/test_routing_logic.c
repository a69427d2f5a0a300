/* cuda/routing_logic.h compiled as plain C11: softmax and sigmoid gating, top-k with ties
 * broken by the lower id, the selection bias choosing without weighting, renormalisation,
 * scale, and rejection of bad arguments. Expected values come from a double-precision
 * brute-force reference written here (selection by repeated arg-max), not from the header. */
#include <math.h>
#include <string.h>

#include "../../cuda/routing_logic.h"
#include "testutil.h"

/* Brute-force reference in double: k rounds of "largest selection value not taken yet,
 * lowest id on ties". */
static void ref_route(const float *logits, int n, int k, int gating, const float *bias,
                      int renorm, double scale, int *ids, double *w) {
    double score[CB_ROUTE_MAX_EXPERTS];
    int taken[CB_ROUTE_MAX_EXPERTS];
    double mx = logits[0], sum = 0.0, total = 0.0;
    for (int e = 0; e < n; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < n; e++) {
        score[e] = gating == CB_GATING_SOFTMAX ? exp((double)logits[e] - mx)
                                               : 1.0 / (1.0 + exp(-(double)logits[e]));
        sum += score[e];
        taken[e] = 0;
    }
    if (gating == CB_GATING_SOFTMAX)
        for (int e = 0; e < n; e++) score[e] /= sum;
    for (int i = 0; i < k; i++) {
        int best = -1;
        double bv = 0.0;
        for (int e = 0; e < n; e++) {
            double v = score[e] + (bias ? (double)bias[e] : 0.0);
            if (!taken[e] && (best < 0 || v > bv)) {
                best = e;
                bv = v;
            }
        }
        taken[best] = 1;
        ids[i] = best;
        w[i] = score[best];
        total += w[i];
    }
    for (int i = 0; i < k; i++) w[i] = (renorm ? w[i] / total : w[i]) * scale;
}

static unsigned rng_state = 12345u;
static float frand(void) { /* uniform in [-4, 4), xorshift32 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return (float)((rng_state >> 8) * (8.0 / 16777216.0) - 4.0);
}

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * (fabs(b) + 1e-30); }

static void test_random(void) {
    float logits[300], bias[300];
    int ids[CB_ROUTE_MAX_K], rids[CB_ROUTE_MAX_K];
    float w[CB_ROUTE_MAX_K];
    double rw[CB_ROUTE_MAX_K];
    const int sizes[] = {1, 2, 8, 64, 128, 257};
    for (int trial = 0; trial < 400; trial++) {
        int n = sizes[trial % 6];
        int k = 1 + (int)(rng_state % (unsigned)(n < 8 ? n : 8));
        int gating = (trial / 6) % 2;
        int use_bias = (trial / 12) % 2;
        int renorm = (trial / 24) % 2;
        float scale = (trial / 48) % 2 ? 2.5f : 1.0f;
        for (int e = 0; e < n; e++) {
            logits[e] = frand();
            bias[e] = 0.05f * frand();
        }
        const float *b = use_bias ? bias : 0;
        CHECK(cb_route_token(logits, n, k, gating, b, renorm, scale, ids, w) == CB_ROUTE_OK);
        ref_route(logits, n, k, gating, b, renorm, scale, rids, rw);
        for (int i = 0; i < k; i++) {
            CHECK(ids[i] == rids[i]);
            CHECK(close_rel(w[i], rw[i], 2e-5));
        }
    }
}

static void test_ties_and_bias(void) {
    /* All equal: the lowest ids win, in ascending order, weights 1/n each. */
    float logits[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int ids[4];
    float w[4];
    CHECK(cb_route_token(logits, 8, 4, CB_GATING_SOFTMAX, 0, 0, 1.0f, ids, w) == CB_ROUTE_OK);
    for (int i = 0; i < 4; i++) {
        CHECK(ids[i] == i);
        CHECK(fabsf(w[i] - 0.125f) < 1e-7f);
    }
    /* A tie between ids 5 and 2 at the top: 2 first. */
    float l2[6] = {0.0f, 1.0f, 3.0f, -1.0f, 2.0f, 3.0f};
    CHECK(cb_route_token(l2, 6, 3, CB_GATING_SIGMOID, 0, 0, 1.0f, ids, w) == CB_ROUTE_OK);
    CHECK(ids[0] == 2 && ids[1] == 5 && ids[2] == 4);
    /* Renormalised sigmoid weights sum to scale. */
    CHECK(cb_route_token(l2, 6, 3, CB_GATING_SIGMOID, 0, 1, 2.5f, ids, w) == CB_ROUTE_OK);
    CHECK(fabsf(w[0] + w[1] + w[2] - 2.5f) < 1e-5f);
    CHECK(fabsf(w[0] - w[1]) < 1e-7f);
    /* The bias makes expert 0 win, but its weight stays its unbiased sigmoid. */
    float bias[6] = {10.0f, 0, 0, 0, 0, 0};
    CHECK(cb_route_token(l2, 6, 1, CB_GATING_SIGMOID, bias, 0, 1.0f, ids, w) == CB_ROUTE_OK);
    CHECK(ids[0] == 0 && fabsf(w[0] - 0.5f) < 1e-7f);
    /* Very negative sigmoid logits with renorm: weights 0, not NaN. */
    float low[2] = {-200.0f, -300.0f};
    CHECK(cb_route_token(low, 2, 2, CB_GATING_SIGMOID, 0, 1, 1.0f, ids, w) == CB_ROUTE_OK);
    CHECK(ids[0] == 0 && ids[1] == 1 && w[0] == 0.0f && w[1] == 0.0f);
    /* Large logits do not overflow softmax. */
    float big[3] = {1000.0f, 999.0f, -1000.0f};
    CHECK(cb_route_token(big, 3, 2, CB_GATING_SOFTMAX, 0, 0, 1.0f, ids, w) == CB_ROUTE_OK);
    CHECK(ids[0] == 0 && ids[1] == 1 && close_rel(w[0], 1.0 / (1.0 + exp(-1.0)), 1e-6));
}

static void test_errors(void) {
    float logits[4] = {0, 1, 2, 3};
    int ids[8] = {7, 7, 7, 7, 7, 7, 7, 7}; /* room for k = 5: failures still write k entries */
    float w[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    CHECK(cb_route_token(logits, 4, 5, CB_GATING_SOFTMAX, 0, 0, 1.0f, ids, w) == CB_ROUTE_EARG);
    CHECK(cb_route_token(logits, 4, 0, CB_GATING_SOFTMAX, 0, 0, 1.0f, ids, w) == CB_ROUTE_EARG);
    CHECK(cb_route_token(logits, 0, 1, CB_GATING_SOFTMAX, 0, 0, 1.0f, ids, w) == CB_ROUTE_EARG);
    CHECK(cb_route_token(logits, 4, 2, 7, 0, 0, 1.0f, ids, w) == CB_ROUTE_EARG);
    CHECK(ids[0] == -1 && ids[1] == -1 && w[0] == 0.0f && w[1] == 0.0f);
    CHECK(cb_route_token(logits, 4, 2, CB_GATING_SOFTMAX, 0, 0, NAN, ids, w) == CB_ROUTE_EARG);
    CHECK(cb_route_token(0, 4, 2, CB_GATING_SOFTMAX, 0, 0, 1.0f, ids, w) == CB_ROUTE_EARG);
    logits[2] = NAN;
    CHECK(cb_route_token(logits, 4, 2, CB_GATING_SOFTMAX, 0, 0, 1.0f, ids, w) ==
          CB_ROUTE_ENONFINITE);
    logits[2] = INFINITY;
    CHECK(cb_route_token(logits, 4, 2, CB_GATING_SIGMOID, 0, 0, 1.0f, ids, w) ==
          CB_ROUTE_ENONFINITE);
    logits[2] = 2.0f;
    float bias[4] = {0, -INFINITY, 0, 0};
    CHECK(cb_route_token(logits, 4, 2, CB_GATING_SIGMOID, bias, 0, 1.0f, ids, w) ==
          CB_ROUTE_ENONFINITE);
    CHECK(cb_route_pad(0, 16) == 0 && cb_route_pad(1, 16) == 16 && cb_route_pad(32, 16) == 32);
}

/* gpt-oss (CB_GATING_SOFTMAX_WEIGHT): the k largest logits, weighted by the softmax over them
 * alone (whatever renorm says), times scale */
static void test_softmax_weight(void) {
    float logits[64], w[CB_ROUTE_MAX_K];
    int ids[CB_ROUTE_MAX_K], rids[CB_ROUTE_MAX_K];
    double rw[CB_ROUTE_MAX_K];
    for (int trial = 0; trial < 200; trial++) {
        const int n = 2 + trial % 63, k = 1 + trial % (n < 6 ? n : 6), renorm = trial % 2;
        for (int e = 0; e < n; e++) logits[e] = frand();
        CHECK(cb_route_token(logits, n, k, CB_GATING_SOFTMAX_WEIGHT, 0, renorm, 1.5f, ids, w) ==
              CB_ROUTE_OK);
        /* selection: by logit = by sigmoid (monotonic); weights: exp over the chosen */
        ref_route(logits, n, k, CB_GATING_SIGMOID, 0, 0, 1.0, rids, rw);
        double sum = 0.0;
        for (int i = 0; i < k; i++) sum += exp((double)logits[rids[i]] - logits[rids[0]]);
        for (int i = 0; i < k; i++) {
            CHECK(ids[i] == rids[i]);
            CHECK(close_rel(w[i], 1.5 * exp((double)logits[rids[i]] - logits[rids[0]]) / sum, 2e-5));
        }
    }
}

int main(void) {
    test_random();
    test_softmax_weight();
    test_ties_and_bias();
    test_errors();
    TEST_MAIN_END("test_routing_logic");
}
