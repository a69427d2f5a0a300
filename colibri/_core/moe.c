/* The routed experts of one MoE layer in four thread-pool dispatches (see moe_impl.h).
 *
 * Layout: entries are (token, expert) routings in the forward's counting-sort order (expert
 * after expert, ascending id; tokens in batch order within one), so each expert's entries are
 * one run of rows in every per-entry buffer: the prepared activations xg (xu when up has another
 * type than gate), the gate and up outputs g and u [entries x n_ff] (g becomes act(g) * u) and
 * g's prepared rows xd for the down weights. Prepared rows are cb_mm_act_bound bytes apart
 * whatever path an expert takes, so one buffer holds direct and packed-row layouts.
 * Ownership: the workspace is the caller's (the forward's, sized at its creation); the pool's
 * lock is held for the four dispatches, as cb_matmul_ex holds it for its two.
 * Reads (cache store misses): an expert's gate/up waits for its bytes and so overlaps the
 * later experts' reads, but down starts after the last read (the per-expert loop this
 * replaced also overlapped each expert's down). Splitting the experts into waves of phases
 * 2-4 (ascending ranges keep the sum order) would win that back at 3 dispatches a wave.
 */
#include "moe_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "matmul_impl.h"
#include "threadpool_impl.h"

#define MOE_TASKS_PER_THREAD 16

typedef struct {
    int32_t first;     /* its first entry */
    uint8_t rp[3];     /* gate, up, down: packed rows */
} moe_exp;

/* Byte offsets of the workspace's parts for n entries and n_used experts; the total, or
 * SIZE_MAX on overflow. */
typedef struct {
    size_t g, u, xg, xu, xd, pack, eexp, ex, ready, total;
    size_t sg, su, sd, pack_stride; /* row strides of xg, xu, xd; one thread's pack buffer */
} moe_layout;

static size_t add_part(size_t *at, size_t count, size_t size) {
    if (*at == SIZE_MAX || (size && count > SIZE_MAX / size)) return *at = SIZE_MAX;
    size_t bytes = (count * size + 63) / 64 * 64;
    if (bytes < count * size || *at > SIZE_MAX - bytes) return *at = SIZE_MAX;
    size_t off = *at;
    *at += bytes;
    return off;
}

static moe_layout layout(const cb_matrix_t *gate, const cb_matrix_t *up, const cb_matrix_t *down,
                         int64_t n, int32_t n_used, int n_threads) {
    moe_layout o;
    memset(&o, 0, sizeof o);
    const size_t ne = (size_t)n, ff = (size_t)gate->rows;
    o.sg = cb_mm_act_bound(gate->type, gate->cols);
    o.su = up->type != gate->type ? cb_mm_act_bound(up->type, up->cols) : 0;
    o.sd = cb_mm_act_bound(down->type, down->cols);
    o.pack_stride = cb_mm_pack_bound(gate->type, gate->cols);
    size_t pu = cb_mm_pack_bound(up->type, up->cols), pd = cb_mm_pack_bound(down->type, down->cols);
    if (pu > o.pack_stride) o.pack_stride = pu;
    if (pd > o.pack_stride) o.pack_stride = pd;
    size_t at = ff && ne > SIZE_MAX / ff ? SIZE_MAX : 0;
    o.g = add_part(&at, ne * ff, sizeof(float));
    o.u = add_part(&at, ne * ff, sizeof(float));
    o.xg = add_part(&at, ne, o.sg);
    o.xu = add_part(&at, ne, o.su);
    o.xd = add_part(&at, ne, o.sd);
    o.pack = add_part(&at, (size_t)n_threads, o.pack_stride);
    o.eexp = add_part(&at, ne, sizeof(int32_t));
    o.ex = add_part(&at, (size_t)n_used, sizeof(moe_exp));
    o.ready = add_part(&at, (size_t)n_used, 1);
    o.total = at;
    return o;
}

size_t cb_moe_workspace_bytes(const cb_matrix_t *gate, const cb_matrix_t *up,
                              const cb_matrix_t *down, int64_t max_entries, int32_t max_used,
                              int n_threads) {
    if (max_entries < 0 || max_used < 0 || n_threads < 1) return SIZE_MAX;
    return layout(gate, up, down, max_entries, max_used, n_threads).total;
}

typedef struct {
    const cb_moe_run_t *r;
    cb_mm_ctx g[2], u[2], d[2]; /* the kernels: [0] direct, [1] packed rows */
    int same[3];                /* gate, up, down: [0] and [1] prepare rows alike */
    moe_exp *ex;
    int32_t *eexp;              /* entry -> used expert */
    float *gb, *ub;
    uint8_t *xg, *xu, *xd;
    moe_layout lo;
    int64_t ff, n_embd, n_entries;
    int64_t tok_per_task, ent_per_task, gu_rows, gu_chunks, dn_rows;
    uint8_t *ready;             /* [n_used] 1 once r->wait(i) returned CB_OK (atomic) */
    pthread_mutex_t mu;         /* serializes r->wait and the first failure's record */
    int status;                 /* the first failed task's cb_status (atomic) */
    char err[256];              /* and its detail (a task's cb_last_error is its thread's) */
} moe_ctx;

/* The first failure of a task is the run's: its status and detail (mu held). */
static void record_locked(moe_ctx *c, cb_status s) {
    if (c->status != CB_OK) return;
    snprintf(c->err, sizeof c->err, "%s", cb_last_error());
    __atomic_store_n(&c->status, (int)s, __ATOMIC_RELEASE);
}

static void task_fail(moe_ctx *c, cb_status s) {
    pthread_mutex_lock(&c->mu);
    record_locked(c, s);
    pthread_mutex_unlock(&c->mu);
}

/* Whether expert i's weights are readable: at once without r->wait; else its first task waits
 * for them (one wait at a time, in about the order of the tasks, so of the experts); 0 after a
 * failure (this wait's or an earlier task's). */
static int expert_ready(moe_ctx *c, int32_t i) {
    if (!c->r->wait || __atomic_load_n(&c->ready[i], __ATOMIC_ACQUIRE)) return 1;
    pthread_mutex_lock(&c->mu);
    int ok = c->status == CB_OK;
    if (ok && !c->ready[i]) {
        cb_status s = c->r->wait(c->r->wait_user, i);
        if (s == CB_OK) {
            __atomic_store_n(&c->ready[i], 1, __ATOMIC_RELEASE);
        } else {
            record_locked(c, s);
            ok = 0;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

/* 1: token rows of h prepared for gate (and up when its type differs), copied to entries */
static void prep_h_task(void *vctx, int task, int thread) {
    (void)thread;
    moe_ctx *c = vctx;
    const cb_moe_run_t *r = c->r;
    int64_t t0 = (int64_t)task * c->tok_per_task;
    int64_t t1 = t0 + c->tok_per_task < r->n_tokens ? t0 + c->tok_per_task : r->n_tokens;
    for (int which = 0; which < (c->xu ? 2 : 1); which++) {
        const cb_mm_ctx *kc = which ? c->u : c->g;
        uint8_t *xb = which ? c->xu : c->xg;
        const size_t stride = which ? c->lo.su : c->lo.sg;
        for (int64_t t = t0; t < t1; t++) {
            const int32_t *ent = r->ent + t * r->k;
            for (int32_t j = 0; j < r->k; j++) {
                int lay = c->same[which] ? 0 : c->ex[c->eexp[ent[j]]].rp[which];
                uint8_t *dst = xb + (size_t)ent[j] * stride;
                int32_t p = 0; /* an earlier entry of this token with this layout */
                while (p < j && (c->same[which] ? 0 : c->ex[c->eexp[ent[p]]].rp[which]) != lay) p++;
                if (p < j)
                    memcpy(dst, xb + (size_t)ent[p] * stride, kc[lay].act_stride);
                else
                    cb_mm_prep_row(&kc[lay], r->h + t * c->n_embd, dst);
            }
        }
    }
}

/* The kernels of one kind (packed rows or not) for an expert's n_tok prepared rows at xa; the
 * per-thread pack buffers are the workspace's, pack_stride bytes apart for every type. */
static cb_mm_ctx expert_mm(const cb_mm_ctx *kinds, int rp, const uint8_t *w, int32_t n_tok,
                           const uint8_t *xa, size_t xa_stride, uint8_t *pack,
                           size_t pack_stride) {
    cb_mm_ctx m = kinds[rp];
    m.w = w;
    m.n_tokens = n_tok;
    m.xa = xa;
    m.xa_stride = xa_stride;
    m.pack = pack;
    m.pack_stride = pack_stride;
    return m;
}

/* 2: rows [r0, r1) of expert i's gate and up for its entries, then act(gate) * up */
static void gate_up_task(void *vctx, int task, int thread) {
    moe_ctx *c = vctx;
    const cb_moe_run_t *r = c->r;
    const int32_t i = (int32_t)(task / c->gu_chunks);
    const int64_t r0 = (task % c->gu_chunks) * c->gu_rows;
    const int64_t r1 = r0 + c->gu_rows < c->ff ? r0 + c->gu_rows : c->ff;
    if (__atomic_load_n(&c->status, __ATOMIC_ACQUIRE) != CB_OK || !expert_ready(c, i)) return;
    const moe_exp *x = &c->ex[i];
    const int32_t n = r->n_tok[i];
    uint8_t *pack = (uint8_t *)r->ws + c->lo.pack;
    cb_mm_ctx m = expert_mm(c->g, x->rp[0], r->refs[i].gate, n, c->xg + (size_t)x->first * c->lo.sg,
                            c->lo.sg, pack, c->lo.pack_stride);
    m.y = c->gb + x->first * c->ff;
    m.y_stride = c->ff;
    cb_mm_rows(&m, r0, r1, thread);
    /* up reads gate's prepared rows unless its type differs */
    const uint8_t *xu = c->xu ? c->xu + (size_t)x->first * c->lo.su : m.xa;
    m = expert_mm(c->u, x->rp[1], r->refs[i].up, n, xu, c->xu ? c->lo.su : c->lo.sg, pack,
                  c->lo.pack_stride);
    m.y = c->ub + x->first * c->ff;
    m.y_stride = c->ff;
    cb_mm_rows(&m, r0, r1, thread);
    const int64_t id = r->expert_id ? r->expert_id[i] : 0;
    for (int64_t e = x->first; e < x->first + n; e++) {
        float *g = c->gb + e * c->ff + r0, *u = c->ub + e * c->ff + r0;
        if (r->gate_b) cb_moe_add_bias(g, r->gate_b + id * c->ff + r0, 1.0f, r1 - r0);
        if (r->up_b) cb_moe_add_bias(u, r->up_b + id * c->ff + r0, 1.0f, r1 - r0);
        cb_status s = cb_glu(r->act, g, u, r1 - r0, g);
        if (s != CB_OK) task_fail(c, s);
    }
}

/* 3: the entries' g rows prepared for down */
static void prep_g_task(void *vctx, int task, int thread) {
    (void)thread;
    moe_ctx *c = vctx;
    int64_t e0 = (int64_t)task * c->ent_per_task;
    int64_t e1 = e0 + c->ent_per_task < c->n_entries ? e0 + c->ent_per_task : c->n_entries;
    for (int64_t e = e0; e < e1; e++)
        cb_mm_prep_row(&c->d[c->ex[c->eexp[e]].rp[2]], c->gb + e * c->ff,
                       c->xd + (size_t)e * c->lo.sd);
}

/* 4: rows [r0, r1) of the output: every expert's down, ascending id, accumulated */
static void down_task(void *vctx, int task, int thread) {
    moe_ctx *c = vctx;
    const cb_moe_run_t *r = c->r;
    const int64_t r0 = (int64_t)task * c->dn_rows;
    const int64_t r1 = r0 + c->dn_rows < c->n_embd ? r0 + c->dn_rows : c->n_embd;
    uint8_t *pack = (uint8_t *)r->ws + c->lo.pack;
    for (int32_t i = 0; i < r->n_used; i++) {
        const moe_exp *x = &c->ex[i];
        cb_mm_ctx m = expert_mm(c->d, x->rp[2], r->refs[i].down, r->n_tok[i],
                                c->xd + (size_t)x->first * c->lo.sd, c->lo.sd, pack,
                                c->lo.pack_stride);
        m.y = r->out;
        m.y_stride = c->n_embd;
        m.accumulate = 1;
        m.token_scale = r->scale + x->first;
        m.token_ids = r->tok + x->first;
        cb_mm_rows(&m, r0, r1, thread);
        if (r->down_b) /* after the expert's down, before the next expert's */
            for (int32_t j = 0; j < r->n_tok[i]; j++)
                cb_moe_add_bias(r->out + (size_t)r->tok[x->first + j] * c->n_embd + r0,
                                r->down_b + (size_t)r->expert_id[i] * c->n_embd + r0,
                                r->scale[x->first + j], r1 - r0);
    }
}

__attribute__((optimize("fp-contract=off"))) void cb_moe_add_bias(float *y, const float *b,
                                                                   float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float t = s * b[i];
        y[i] += t;
    }
}

static int same_prep(const cb_mm_ctx k[2]) {
    return k[0].act == k[1].act && k[0].rp == k[1].rp && k[0].act_stride == k[1].act_stride;
}

/* Rows per task of a matrix with `rows` rows split into `chunks` tasks: a multiple of
 * CB_RP_MAX_ROWS (every packed-row group size, whole direct tiles). */
static int64_t rows_per(int64_t rows, int64_t chunks) {
    int64_t r = (rows + chunks - 1) / chunks;
    return (r + CB_RP_MAX_ROWS - 1) / CB_RP_MAX_ROWS * CB_RP_MAX_ROWS;
}

cb_status cb_moe_run(const cb_moe_run_t *r, cb_threadpool_t *pool) {
    const int n_threads = cb_threadpool_n_threads(pool);
    const int64_t n_entries = r->n_tokens * r->k;
    if (r->n_used == 0 || n_entries == 0) return CB_OK;
    moe_ctx c;
    memset(&c, 0, sizeof c);
    c.r = r;
    c.lo = layout(r->gate, r->up, r->down, n_entries, r->n_used, n_threads);
    if (c.lo.total > r->ws_bytes)
        return cb_fail(CB_STATUS_INTERNAL, "moe: %lld entries of %d experts need %zu workspace "
                       "bytes, %zu given", (long long)n_entries, (int)r->n_used, c.lo.total,
                       r->ws_bytes);
    uint8_t *ws = r->ws;
    c.gb = (float *)(ws + c.lo.g);
    c.ub = (float *)(ws + c.lo.u);
    c.xg = ws + c.lo.xg;
    c.xu = r->up->type != r->gate->type ? ws + c.lo.xu : NULL;
    c.xd = ws + c.lo.xd;
    c.eexp = (int32_t *)(ws + c.lo.eexp);
    c.ex = (moe_exp *)(ws + c.lo.ex);
    c.ready = ws + c.lo.ready;
    memset(c.ready, 0, (size_t)r->n_used);
    c.ff = r->gate->rows;
    c.n_embd = r->down->rows;
    c.n_entries = n_entries;
    const cb_matrix_t *mats[3] = {r->gate, r->up, r->down};
    cb_mm_ctx *kinds[3] = {c.g, c.u, c.d};
    for (int w = 0; w < 3; w++) {
        cb_mm_plan(&kinds[w][0], mats[w], r->fast, 0);
        cb_mm_plan(&kinds[w][1], mats[w], r->fast, 1);
        c.same[w] = same_prep(kinds[w]);
    }
    int32_t first = 0;
    for (int32_t i = 0; i < r->n_used; i++) {
        c.ex[i].first = first;
        for (int w = 0; w < 3; w++)
            c.ex[i].rp[w] = (uint8_t)cb_mm_packed(mats[w]->type, r->n_tok[i], 0);
        for (int32_t j = 0; j < r->n_tok[i]; j++) c.eexp[first + j] = i;
        first += r->n_tok[i];
    }
    if (first != n_entries)
        return cb_fail(CB_STATUS_INTERNAL, "moe: %d entries over the experts, %lld expected",
                       (int)first, (long long)n_entries);
    /* tasks: tokens / entries in 4 per thread; gate/up chunks so that every thread gets about
     * MOE_TASKS_PER_THREAD tasks when few experts are used; down rows likewise. One thread
     * needs no balance: an expert's gate/up whole and one down task (each expert's rows in one
     * pass, not 16 row ranges of 8 experts: 2-3% faster MoE bench decode at 1 thread, the same
     * rows and sums) */
    const int64_t want = n_threads == 1 ? 1 : (int64_t)n_threads * MOE_TASKS_PER_THREAD;
    c.tok_per_task = (r->n_tokens + 4 * n_threads - 1) / (4 * n_threads);
    c.ent_per_task = (n_entries + 4 * n_threads - 1) / (4 * n_threads);
    c.gu_rows = rows_per(c.ff, (want + r->n_used - 1) / r->n_used);
    c.gu_chunks = (c.ff + c.gu_rows - 1) / c.gu_rows;
    c.dn_rows = rows_per(c.n_embd, want);
    const int64_t n_gu = c.gu_chunks * r->n_used, n_dn = (c.n_embd + c.dn_rows - 1) / c.dn_rows;
    if (n_gu > INT32_MAX || n_dn > INT32_MAX)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "moe: too many tasks");
    if (pthread_mutex_init(&c.mu, NULL) != 0)
        return cb_fail(CB_STATUS_INTERNAL, "moe: pthread_mutex_init failed");
    cb_status s = cb_threadpool_lock(pool);
    if (s != CB_OK) {
        pthread_mutex_destroy(&c.mu);
        return s;
    }
    s = cb_threadpool_run_locked(pool, prep_h_task, &c,
                                 (int)((r->n_tokens + c.tok_per_task - 1) / c.tok_per_task));
    if (s == CB_OK) s = cb_threadpool_run_locked(pool, gate_up_task, &c, (int)n_gu);
    if (s == CB_OK && c.status != CB_OK) s = cb_fail((cb_status)c.status, "%s", c.err);
    if (s == CB_OK)
        s = cb_threadpool_run_locked(pool, prep_g_task, &c,
                                     (int)((n_entries + c.ent_per_task - 1) / c.ent_per_task));
    if (s == CB_OK) s = cb_threadpool_run_locked(pool, down_task, &c, (int)n_dn);
    cb_threadpool_unlock(pool);
    pthread_mutex_destroy(&c.mu);
    return s;
}
