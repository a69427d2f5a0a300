/* The routed experts of a MoE layer in four dispatches (moe.c, cb_moe_run) against one
 * cb_matmul_ex per expert and projection (the forward's former loop: gate and up gathered through
 * token_ids, cb_glu per token, down accumulated with the routing weights in ascending expert id):
 * bit-identical outputs for weight types with and without packed rows, gate and up of different
 * types, token counts on both sides of the packed-row thresholds, every SIMD level of the machine
 * down to scalar, and 1-3 threads; each token's row alone equals its row in the batch; a
 * workspace too small fails cleanly. The wait hook (the expert store's started acquire): each
 * expert waited for once, before its weights are read (they arrive in the hook here); a failed
 * wait is the run's result, with its detail, however many threads. */
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/quant.h"
#include "moe_impl.h"
#include "testutil.h"

/* splitmix64 */
static uint64_t seed = 42;
static uint32_t rnd(void) {
    uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static float rndf(void) { return (float)(rnd() >> 8) / 8388608.0f - 1.0f; } /* [-1, 1) */

/* Random weights: random block bytes whose scale fields are then made small and finite (the
 * f16 d at byte 0, and the f16 min / dmin at byte 2 where the type has one; Q6_K's d at 208;
 * MXFP4's e8m0 exponent), or random values in [-1, 1) for the float types. */
static void random_weights(int type, uint8_t *raw, size_t bytes) {
    const size_t bb = cb_type_block_bytes(type);
    for (uint8_t *p = raw; p + bb <= raw + bytes; p += bb) {
        for (size_t i = 0; i < bb; i++) p[i] = (uint8_t)rnd();
        uint16_t d = cb_f32_to_f16(0.004f + 0.03f * (float)(rnd() % 64) / 64.0f);
        float v = rndf();
        switch (type) {
        case CB_TYPE_F32: memcpy(p, &v, 4); break;
        case CB_TYPE_F16: d = cb_f32_to_f16(v); memcpy(p, &d, 2); break;
        case CB_TYPE_MXFP4: p[0] = (uint8_t)(118 + rnd() % 10); break;
        case CB_TYPE_Q6_K: memcpy(p + 208, &d, 2); break;
        case CB_TYPE_Q4_1: case CB_TYPE_Q5_1: case CB_TYPE_Q4_K: case CB_TYPE_Q5_K:
            memcpy(p + 2, &d, 2);
            memcpy(p, &d, 2);
            break;
        default: memcpy(p, &d, 2); break;
        }
    }
}

enum { NE = 12, K = 3, E = 256, FF = 512, MAXN = 24 };

typedef struct {
    cb_matrix_t gate, up, down; /* templates (data NULL) */
    uint8_t *wg[NE], *wu[NE], *wd[NE];
    float h[MAXN * E];
    int32_t rid[MAXN * K];
    float rw[MAXN * K];
} layer_t;

static void make_layer(layer_t *L, int tg, int tu, int td) {
    size_t rg, ru, rd;
    CHECK(cb_type_row_bytes(tg, E, &rg) == CB_OK && cb_type_row_bytes(tu, E, &ru) == CB_OK &&
          cb_type_row_bytes(td, FF, &rd) == CB_OK);
    L->gate = (cb_matrix_t){tg, FF, E, rg, NULL};
    L->up = (cb_matrix_t){tu, FF, E, ru, NULL};
    L->down = (cb_matrix_t){td, E, FF, rd, NULL};
    for (int e = 0; e < NE; e++) {
        L->wg[e] = malloc(rg * FF);
        L->wu[e] = malloc(ru * FF);
        L->wd[e] = malloc(rd * E);
        random_weights(tg, L->wg[e], rg * FF);
        random_weights(tu, L->wu[e], ru * FF);
        random_weights(td, L->wd[e], rd * E);
    }
    for (int i = 0; i < MAXN * E; i++) L->h[i] = rndf() * 2.0f;
    /* routing: K distinct experts per token, skewed so that a few experts get many tokens
     * (packed rows) and others one or two (direct tiles) */
    for (int t = 0; t < MAXN; t++)
        for (int k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(rnd() % 4 < 2 ? rnd() % 3 : rnd() % NE);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= L->rid[t * K + j] == e;
            } while (dup);
            L->rid[t * K + k] = e;
            L->rw[t * K + k] = 0.1f + 0.8f * (float)(rnd() % 1000) / 1000.0f;
        }
}

static void free_layer(layer_t *L) {
    for (int e = 0; e < NE; e++) {
        free(L->wg[e]);
        free(L->wu[e]);
        free(L->wd[e]);
    }
}

/* gpt-oss's experts: biases ([expert][rows], NULL: none) and the clamped SwiGLU, for both paths */
static cb_act g_act = CB_ACT_SILU;
static float *g_gate_b, *g_up_b, *g_down_b;

/* The forward's grouping of tokens t0 .. t0+n-1: entries expert after expert (ascending), in
 * batch order within one; used experts, their entry counts and refs. */
typedef struct {
    int32_t lists[MAXN * K], ent[MAXN * K], used[NE], n_tok[NE], n_used;
    float lw[MAXN * K];
    cb_expert_ref_t refs[NE];
} groups_t;

static void group(const layer_t *L, int t0, int n, groups_t *g) {
    int32_t cnt[NE] = {0}, start[NE + 1], fill_at[NE];
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++) cnt[L->rid[(t0 + t) * K + k]]++;
    g->n_used = 0;
    start[0] = 0;
    for (int e = 0; e < NE; e++) {
        start[e + 1] = start[e] + cnt[e];
        fill_at[e] = start[e];
        if (cnt[e]) {
            g->refs[g->n_used] = (cb_expert_ref_t){L->wg[e], L->wu[e], L->wd[e]};
            g->n_tok[g->n_used] = cnt[e];
            g->used[g->n_used++] = e;
        }
    }
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++) {
            int32_t at = fill_at[L->rid[(t0 + t) * K + k]]++;
            g->lists[at] = t;
            g->ent[t * K + k] = at;
            g->lw[at] = L->rw[(t0 + t) * K + k];
        }
}

/* the former per-expert loop of the forward */
static void reference(const layer_t *L, int t0, int n, cb_threadpool_t *pool, float *out) {
    groups_t g;
    group(L, t0, n, &g);
    float *gb = malloc(sizeof(float) * MAXN * FF), *ub = malloc(sizeof(float) * MAXN * FF);
    memset(out, 0, sizeof(float) * (size_t)n * E);
    for (int32_t i = 0, first = 0; i < g.n_used; first += g.n_tok[i], i++) {
        const int32_t *ids = g.lists + first;
        cb_matrix_t wg = L->gate, wu = L->up, wd = L->down;
        wg.data = g.refs[i].gate;
        wu.data = g.refs[i].up;
        wd.data = g.refs[i].down;
        cb_matmul_opts_t op = cb_matmul_default_opts();
        op.token_ids = ids;
        op.n_rows_xy = n;
        CHECK(cb_matmul_ex(&wg, L->h + (size_t)t0 * E, g.n_tok[i], E, gb, FF, &op, pool) == CB_OK);
        CHECK(cb_matmul_ex(&wu, L->h + (size_t)t0 * E, g.n_tok[i], E, ub, FF, &op, pool) == CB_OK);
        const int32_t e = g.used[i];
        for (int32_t j = 0; j < g.n_tok[i]; j++) {
            float *gr = gb + (size_t)ids[j] * FF, *ur = ub + (size_t)ids[j] * FF;
            if (g_gate_b) cb_moe_add_bias(gr, g_gate_b + (size_t)e * FF, 1.0f, FF);
            if (g_up_b) cb_moe_add_bias(ur, g_up_b + (size_t)e * FF, 1.0f, FF);
            CHECK(cb_glu(g_act, gr, ur, FF, gr) == CB_OK);
        }
        cb_matmul_opts_t od = op;
        od.accumulate = 1;
        od.token_scale = g.lw + first;
        CHECK(cb_matmul_ex(&wd, gb, g.n_tok[i], FF, out, E, &od, pool) == CB_OK);
        for (int32_t j = 0; j < g.n_tok[i] && g_down_b; j++)
            cb_moe_add_bias(out + (size_t)ids[j] * E, g_down_b + (size_t)e * E, g.lw[first + j], E);
    }
    free(gb);
    free(ub);
}

/* The wait hook's state: the weights of used expert i are copied into late[i] (zeroed before)
 * when it is waited for; fail_at fails that wait. */
typedef struct {
    const groups_t *g;
    size_t bytes[3];
    uint8_t *late[NE][3];
    int calls[NE];
    int32_t fail_at;
} waiter_t;

static cb_status wait_hook(void *user, int32_t i) {
    waiter_t *w = user;
    w->calls[i]++;
    if (i == w->fail_at) return cb_fail(CB_STATUS_IO, "test read of expert %d failed", i);
    memcpy(w->late[i][0], w->g->refs[i].gate, w->bytes[0]);
    memcpy(w->late[i][1], w->g->refs[i].up, w->bytes[1]);
    memcpy(w->late[i][2], w->g->refs[i].down, w->bytes[2]);
    return CB_OK;
}

static cb_status fused_w(const layer_t *L, int t0, int n, cb_threadpool_t *pool, void *ws,
                         size_t ws_bytes, float *out, waiter_t *w) {
    groups_t g;
    group(L, t0, n, &g);
    memset(out, 0, sizeof(float) * (size_t)n * E);
    cb_moe_run_t r = {&L->gate, &L->up, &L->down, g_act, 0, L->h + (size_t)t0 * E, n, K,
                      g.n_used, g.n_tok, g.refs, g.lists, g.lw, g.ent, out, ws, ws_bytes,
                      NULL, NULL, g.used, g_gate_b, g_up_b, g_down_b};
    cb_expert_ref_t late[NE];
    if (w) {
        w->g = &g;
        w->bytes[0] = L->gate.row_bytes * FF;
        w->bytes[1] = L->up.row_bytes * FF;
        w->bytes[2] = L->down.row_bytes * E;
        for (int32_t i = 0; i < g.n_used; i++) {
            for (int p = 0; p < 3; p++) memset(w->late[i][p], 0, w->bytes[p]);
            late[i] = (cb_expert_ref_t){w->late[i][0], w->late[i][1], w->late[i][2]};
            w->calls[i] = 0;
        }
        r.refs = late;
        r.wait = wait_hook;
        r.wait_user = w;
    }
    cb_status s = cb_moe_run(&r, pool);
    if (w) /* every expert waited for once at most; all of them on success */
        for (int32_t i = 0; i < g.n_used; i++)
            CHECK(w->calls[i] == (s == CB_OK) || (s != CB_OK && w->calls[i] <= 1));
    return s;
}

static cb_status fused(const layer_t *L, int t0, int n, cb_threadpool_t *pool, void *ws,
                       size_t ws_bytes, float *out) {
    return fused_w(L, t0, n, pool, ws, ws_bytes, out, NULL);
}

static int n_checked = 0;

static void check_layer(int tg, int tu, int td, cb_threadpool_t *pools[3]) {
    layer_t *L = malloc(sizeof *L);
    make_layer(L, tg, tu, td);
    size_t ws_bytes = cb_moe_workspace_bytes(&L->gate, &L->up, &L->down, MAXN * K, NE, 3);
    CHECK(ws_bytes != SIZE_MAX && ws_bytes > 0);
    void *ws = NULL;
    CHECK(posix_memalign(&ws, 64, ws_bytes) == 0);
    float *want = malloc(sizeof(float) * MAXN * E), *got = malloc(sizeof(float) * MAXN * E);
    float *one = malloc(sizeof(float) * E);
    static const int ns[] = {1, 2, 5, 9, MAXN};
    const cb_simd_level top = cb_cpu_detect();
    for (int lv = (int)top; lv >= 0; lv--) {
        cb_cpu_set_max_level((cb_simd_level)lv);
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
            const int n = ns[a];
            reference(L, 0, n, pools[1], want);
            for (int p = 0; p < 3; p++) {
                CHECK(fused(L, 0, n, pools[p], ws, ws_bytes, got) == CB_OK);
                if (memcmp(got, want, sizeof(float) * (size_t)n * E) != 0) {
                    fprintf(stderr, "moe %s/%s/%s %s n=%d threads=%d: differs from per-expert "
                            "matmuls\n", cb_type_name(tg), cb_type_name(tu), cb_type_name(td),
                            cb_simd_level_str((cb_simd_level)lv), n, p + 1);
                    CHECK(0);
                }
                n_checked++;
            }
            /* batch invariance: every token alone gives its row of the batch */
            for (int t = 0; t < n; t++) {
                CHECK(fused(L, t, 1, pools[2], ws, ws_bytes, one) == CB_OK);
                CHECK(memcmp(one, want + (size_t)t * E, sizeof(float) * E) == 0);
            }
        }
    }
    cb_cpu_set_max_level(top);
    /* the weights arrive in the wait hook: the same results; a failed wait fails the run */
    waiter_t *w = calloc(1, sizeof *w);
    for (int e = 0; e < NE; e++)
        for (int p = 0; p < 3; p++)
            w->late[e][p] = malloc(p < 2 ? (p ? L->up.row_bytes : L->gate.row_bytes) * FF
                                         : L->down.row_bytes * E);
    for (int p = 0; p < 3; p++) {
        w->fail_at = -1;
        reference(L, 0, MAXN, pools[p], want);
        CHECK(fused_w(L, 0, MAXN, pools[p], ws, ws_bytes, got, w) == CB_OK);
        CHECK(memcmp(got, want, sizeof(float) * MAXN * E) == 0);
        w->fail_at = 2 + p;
        CHECK(fused_w(L, 0, MAXN, pools[p], ws, ws_bytes, got, w) == CB_STATUS_IO);
        CHECK(strstr(cb_last_error(), "test read of expert") != NULL);
        CHECK(w->calls[2 + p] == 1);
    }
    for (int e = 0; e < NE; e++)
        for (int p = 0; p < 3; p++) free(w->late[e][p]);
    free(w);
    /* a workspace short of one byte is refused before anything is computed */
    groups_t g;
    group(L, 0, MAXN, &g);
    memset(got, 0, sizeof(float) * MAXN * E);
    CHECK(fused(L, 0, MAXN, pools[0], ws,
                cb_moe_workspace_bytes(&L->gate, &L->up, &L->down, MAXN * K, g.n_used, 1) - 1,
                got) == CB_STATUS_INTERNAL);
    for (int i = 0; i < MAXN * E; i++) CHECK(got[i] == 0.0f);
    free(ws);
    free(want);
    free(got);
    free(one);
    free_layer(L);
    free(L);
}

int main(void) {
    cb_threadpool_t *pools[3] = {NULL, NULL, NULL};
    CHECK(cb_threadpool_new(2, &pools[1]) == CB_OK);
    CHECK(cb_threadpool_new(3, &pools[2]) == CB_OK);
    check_layer(CB_TYPE_Q4_K, CB_TYPE_Q4_K, CB_TYPE_Q6_K, pools); /* Q4_K_M's experts */
    check_layer(CB_TYPE_Q8_0, CB_TYPE_Q8_0, CB_TYPE_Q8_0, pools);
    check_layer(CB_TYPE_Q4_0, CB_TYPE_Q5_0, CB_TYPE_Q5_K, pools); /* gate and up differ */
    check_layer(CB_TYPE_F32, CB_TYPE_F16, CB_TYPE_MXFP4, pools);
    /* gpt-oss: biased experts with the clamped SwiGLU (gate and up pushed past +-7 by the
     * large inputs), MXFP4 and Q8_0 */
    g_act = CB_ACT_SWIGLU_OAI;
    g_gate_b = malloc(sizeof(float) * NE * FF);
    g_up_b = malloc(sizeof(float) * NE * FF);
    g_down_b = malloc(sizeof(float) * NE * E);
    for (int i = 0; i < NE * FF; i++) g_gate_b[i] = 4.0f * rndf(), g_up_b[i] = 4.0f * rndf();
    for (int i = 0; i < NE * E; i++) g_down_b[i] = rndf();
    check_layer(CB_TYPE_MXFP4, CB_TYPE_MXFP4, CB_TYPE_MXFP4, pools);
    check_layer(CB_TYPE_Q8_0, CB_TYPE_Q8_0, CB_TYPE_Q8_0, pools);
    free(g_gate_b);
    free(g_up_b);
    free(g_down_b);
    /* sizes: overflow is SIZE_MAX, never a wrapped small number */
    cb_matrix_t g = {CB_TYPE_Q4_K, (int64_t)1 << 40, 256, 144, NULL};
    cb_matrix_t d = {CB_TYPE_Q4_K, 256, (int64_t)1 << 40, 144, NULL};
    CHECK(cb_moe_workspace_bytes(&g, &g, &d, (int64_t)1 << 40, NE, 2) == SIZE_MAX);
    CHECK(cb_moe_workspace_bytes(&g, &g, &d, -1, NE, 2) == SIZE_MAX);
    CHECK(n_checked > 0);
    cb_threadpool_free(pools[1]);
    cb_threadpool_free(pools[2]);
    TEST_MAIN_END("test_moe");
}
