/* Allocation-failure testing (SQLite's method): each workload runs once clean, then once for
 * every k = 1, 2, ... with the k-th allocation of the core failing (colibri/_core/alloc.h's
 * fault counter: malloc, calloc, realloc, posix_memalign, mmap for memory, pthread_create), in
 * two modes: the k-th call alone fails (one-shot), or it and every later one (persistent), until
 * a run completes without reaching the k-th call. A failing step must return
 * CB_STATUS_OUT_OF_MEMORY with a detail, leave *out NULL for a constructor, and leave its object
 * usable: the step is run again with the fault removed and must succeed, and the workload's
 * results (token ids, text, expert bytes, logits) must equal the clean run's. Nothing may leak
 * (LSan: detect_leaks=1) and ASan/UBSan must stay silent.
 *
 * Workloads: arena + KV cache (anonymous and /dev/shm backing; sequences created, grown, freed);
 * tokenizers (SPM with byte fallback and a special token, byte-level BPE with merges; encode,
 * decode, the stream decoder, UTF-8 sanitize); the expert store (cache mode, both read layouts,
 * parallel readers, prefetch thread, pin; mmap mode); the thread pool with a quantized matmul
 * (scratch growth); and the forward pass of a tiny two-layer MoE model whose experts are read
 * from a file by a cache store with prefetch, two sequences, prompt then decode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "colibri/arena.h"
#include "colibri/experts.h"
#include "colibri/forward.h"
#include "colibri/quant.h"
#include "colibri/threadpool.h"
#include "colibri/tokenizer.h"
#include "routing_logic.h"
#include "testutil.h"

#ifndef CB_FAULT_INJECTION
#error "test_oom needs the core built with -DCB_FAULT_INJECTION (tests/c/Makefile)"
#endif

static long cur_k;          /* the armed k (0: clean run) */
static long n_hit_steps;    /* steps that failed and recovered, over all k */
static int run_hit;         /* a step of this run failed (its recovery disarmed the counter) */

/* A step of a workload: when it fails it must be the injected fault (OUT_OF_MEMORY with a
 * detail; a constructor leaves its *out NULL); then the fault is removed and the same step must
 * succeed. */
#define STEP_IMPL(expr, out_ok)                                                              \
    do {                                                                                     \
        cb_status s_ = (expr);                                                               \
        if (s_ != CB_OK) {                                                                   \
            if (s_ != CB_STATUS_OUT_OF_MEMORY || cb_fault_failed() == 0)                     \
                fprintf(stderr, "k=%ld: %s: status %d: %s\n", cur_k, #expr, (int)s_,         \
                        cb_last_error());                                                    \
            CHECK(s_ == CB_STATUS_OUT_OF_MEMORY);                                            \
            CHECK(cb_fault_failed() > 0);                                                    \
            CHECK(cb_last_error()[0] != '\0');                                               \
            CHECK(out_ok);                                                                   \
            cb_fault_arm(0, 0);                                                              \
            n_hit_steps++;                                                                   \
            run_hit = 1;                                                                     \
            s_ = (expr);                                                                     \
            if (s_ != CB_OK)                                                                 \
                fprintf(stderr, "k=%ld: %s again: status %d: %s\n", cur_k, #expr, (int)s_,   \
                        cb_last_error());                                                    \
            CHECK(s_ == CB_OK);                                                              \
            if (s_ != CB_OK) goto out;                                                       \
        }                                                                                    \
    } while (0)
#define STEP(expr) STEP_IMPL(expr, 1)
#define STEP_NEW(expr, ptr) STEP_IMPL(expr, (ptr) == NULL)

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)rng_state;
}
static float rndf(void) { return (float)((int)(rnd() % 2001) - 1000) / 1000.0f; }

/* ---- workload 1: arena + KV cache ---------------------------------------------------------- */

static uint64_t work_kv(void) {
    uint64_t sum = 0;
    cb_arena_t *a = NULL, *shm = NULL;
    cb_kvcache_t *kv = NULL;
    cb_arena_params ap = cb_arena_default_params();
    ap.capacity = 256 << 10;
    ap.min_block = 1024;
    STEP_NEW(cb_arena_new(&ap, &a), a);
    cb_arena_params sp = ap;
    sp.backing = CB_BACKING_SHM;
    STEP_NEW(cb_arena_new(&sp, &shm), shm);
    cb_kvcache_params kp = cb_kvcache_default_params();
    kp.n_layers = 2;
    kp.n_kv_heads = 2;
    kp.head_dim = 8;
    kp.max_sequences = 8;
    kp.chunk_tokens = 4;
    kp.state_bytes = 100; /* a recurrent state per sequence: allocated at seq_new */
    STEP_NEW(cb_kvcache_new(a, &kp, &kv), kv);
    uint32_t seq[3];
    for (int i = 0; i < 3; i++) STEP(cb_kvcache_seq_new(kv, &seq[i]));
    for (size_t n = 1; n <= 40; n += 7)
        for (int i = 0; i < 3; i++) {
            STEP(cb_kvcache_seq_reserve(kv, seq[i], n * (size_t)(i + 1)));
            STEP(cb_kvcache_seq_set_len(kv, seq[i], n));
            void *p;
            STEP(cb_kvcache_row_ptr(kv, seq[i], n - 1, 1, 1, 0, &p));
            ((uint16_t *)p)[0] = (uint16_t)(n * 31 + (size_t)i);
        }
    STEP(cb_kvcache_seq_free(kv, seq[1]));
    STEP(cb_kvcache_seq_new(kv, &seq[1]));
    STEP(cb_kvcache_seq_reserve(kv, seq[1], 100));
    for (int i = 0; i < 3; i++) {
        size_t len, cap;
        STEP(cb_kvcache_seq_len(kv, seq[i], &len));
        STEP(cb_kvcache_seq_capacity(kv, seq[i], &cap));
        sum = sum * 31 + len * 1000 + cap;
    }
    void *p;
    STEP(cb_kvcache_row_ptr(kv, seq[2], 36, 1, 1, 0, &p));
    sum = sum * 31 + ((uint16_t *)p)[0];
    size_t off;
    STEP(cb_arena_alloc(shm, 5000, &off));
    STEP(cb_arena_grow(shm, off, 50000, &off));
    STEP(cb_arena_check(a));
    STEP(cb_arena_check(shm));
out:
    cb_kvcache_free(kv);
    cb_arena_free(a);
    cb_arena_free(shm);
    return sum;
}

/* ---- workload 2: tokenizers ---------------------------------------------------------------- */

typedef struct vocab {
    uint8_t text[8192];
    int64_t off[400];
    float score[400];
    uint32_t attr[400];
    int n;
    uint8_t mtext[1024];
    int64_t moff[64];
    int nm;
} vocab_t;

static void add_tok(vocab_t *v, const char *s, size_t len, float score, uint32_t attr) {
    if (v->n == 0) v->off[0] = 0;
    memcpy(v->text + v->off[v->n], s, len);
    v->off[v->n + 1] = v->off[v->n] + (int64_t)len;
    v->score[v->n] = score;
    v->attr[v->n] = attr;
    v->n++;
}

static void add_merge(vocab_t *v, const char *s) {
    if (v->nm == 0) v->moff[0] = 0;
    size_t len = strlen(s);
    memcpy(v->mtext + v->moff[v->nm], s, len);
    v->moff[v->nm + 1] = v->moff[v->nm] + (int64_t)len;
    v->nm++;
}

static size_t put_utf8(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    o[0] = (char)(0xC0 | (c >> 6));
    o[1] = (char)(0x80 | (c & 63));
    return 2;
}

static vocab_t vs, vb;

static void build_vocabs(void) {
    /* SPM: <unk> <s> </s>, byte tokens, pieces with scores, a control token */
    memset(&vs, 0, sizeof vs);
    add_tok(&vs, "<unk>", 5, 0, CB_TOKEN_ATTR_UNKNOWN);
    add_tok(&vs, "<s>", 3, 0, CB_TOKEN_ATTR_CONTROL);
    add_tok(&vs, "</s>", 4, 0, CB_TOKEN_ATTR_CONTROL);
    add_tok(&vs, "<|im_start|>", 12, 0, CB_TOKEN_ATTR_CONTROL);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        add_tok(&vs, name, 6, 0, CB_TOKEN_ATTR_BYTE);
    }
    static const char *const pieces[] = {"\xe2\x96\x81", "h", "e", "l", "o", "w", "r", "d",
                                         "\xe2\x96\x81h", "he", "ll", "llo", "\xe2\x96\x81hello",
                                         "\xe2\x96\x81w", "or", "\xe2\x96\x81world", "\xc3\xa9"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        add_tok(&vs, pieces[i], strlen(pieces[i]), -(float)i, CB_TOKEN_ATTR_NORMAL);
    /* byte-level BPE: the 256 byte tokens of GPT-2's alphabet, some merges */
    memset(&vb, 0, sizeof vb);
    uint32_t n_extra = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)
                          ? (uint32_t)b : 256 + n_extra++;
        char u[4];
        size_t len = put_utf8(cp, u);
        add_tok(&vb, u, len, 0, CB_TOKEN_ATTR_NORMAL);
    }
    static const char *const merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "or",
                                         "\xc4\xa0wor", "\xc4\xa0world"};
    static const char *const merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "o r",
                                          "\xc4\xa0w or", "\xc4\xa0wor ld"};
    for (size_t i = 0; i < sizeof merged / sizeof merged[0]; i++) {
        add_tok(&vb, merged[i], strlen(merged[i]), 0, CB_TOKEN_ATTR_NORMAL);
        add_merge(&vb, merges[i]);
    }
    add_tok(&vb, "ld", 2, 0, CB_TOKEN_ATTR_NORMAL);
    add_tok(&vb, "<|endoftext|>", 13, 0, CB_TOKEN_ATTR_CONTROL);
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t work_tokenizer(void) {
    uint64_t h = 1469598103934665603ull;
    cb_tokenizer_t *spm = NULL, *bpe = NULL;
    cb_tok_stream_t *stream = NULL;
    int32_t *ids = NULL;
    uint8_t *text = NULL, *clean = NULL;
    cb_tokenizer_params p = cb_tokenizer_default_params();
    p.model = CB_TOKENIZER_SPM;
    p.n_tokens = vs.n;
    p.text = vs.text;
    p.text_offsets = vs.off;
    p.scores = vs.score;
    p.attrs = vs.attr;
    p.bos_id = 1;
    p.eos_id = 2;
    p.add_bos = 1;
    p.add_space_prefix = 1;
    STEP_NEW(cb_tokenizer_new(&p, &spm), spm);
    cb_tokenizer_params q = cb_tokenizer_default_params();
    q.model = CB_TOKENIZER_BPE;
    q.pre = CB_PRE_GPT2;
    q.n_tokens = vb.n;
    q.text = vb.text;
    q.text_offsets = vb.off;
    q.attrs = vb.attr;
    q.n_merges = vb.nm;
    q.merges = vb.mtext;
    q.merge_offsets = vb.moff;
    q.eos_id = vb.n - 1;
    STEP_NEW(cb_tokenizer_new(&q, &bpe), bpe);
    static const char input[] = "hello world<|im_start|> h\xc3\xa9llo \xf0\x9f\x99\x82 wor\xff"
                                "ld  hello<|endoftext|>world's 123 ok";
    const cb_tokenizer_t *toks[2] = {spm, bpe};
    for (int t = 0; t < 2; t++) {
        size_t n_ids = 0, n_text = 0;
        STEP(cb_tokenizer_encode(toks[t], (const uint8_t *)input, sizeof input - 1,
                                 CB_ENCODE_ADD_SPECIAL | CB_ENCODE_PARSE_SPECIAL |
                                     CB_ENCODE_LENIENT, &ids, &n_ids));
        h = hash_bytes(h, ids, n_ids * sizeof *ids);
        STEP(cb_tokenizer_decode(toks[t], ids, n_ids, CB_DECODE_SPECIAL, &text, &n_text));
        h = hash_bytes(h, text, n_text);
        STEP_NEW(cb_tok_stream_new(toks[t], 0, &stream), stream);
        for (size_t i = 0; i < n_ids; i++) {
            const uint8_t *o;
            size_t on;
            STEP(cb_tok_stream_feed(stream, ids[i], &o, &on));
            h = hash_bytes(h, o, on);
        }
        const uint8_t *o;
        size_t on;
        STEP(cb_tok_stream_flush(stream, &o, &on));
        h = hash_bytes(h, o, on);
        cb_tok_stream_free(stream);
        stream = NULL;
        cb_tokenizer_buffer_free(ids);
        cb_tokenizer_buffer_free(text);
        ids = NULL;
        text = NULL;
    }
    size_t n_clean = 0;
    STEP(cb_utf8_sanitize((const uint8_t *)input, sizeof input - 1, &clean, &n_clean, NULL));
    h = hash_bytes(h, clean, n_clean);
out:
    cb_tokenizer_buffer_free(ids);
    cb_tokenizer_buffer_free(text);
    cb_tokenizer_buffer_free(clean);
    cb_tok_stream_free(stream);
    cb_tokenizer_free(spm);
    cb_tokenizer_free(bpe);
    return h;
}

/* ---- the expert file: layer 0 stacked like GGUF (three reads), layer 1 one block per expert
 * like the container (one read); Q8_0 matrices [FF x E] (gate, up) and [E x FF] (down) ---- */

enum { E = 32, FF = 32, NEXP = 4, NUSED = 2, NLAYER = 2, NVOCAB = 40, NHEAD = 2, HD = 16 };
enum { MAT = FF * 34, BLK = 4096, HEAD = 4096 };

static char exp_path[64];
static uint8_t *exp_bytes;
static size_t exp_size;
static cb_experts_layer_t exp_layers[NLAYER];

static void build_expert_file(void) {
    const size_t l1 = HEAD + 3 * NEXP * MAT + 512;
    exp_size = l1 + NEXP * BLK;
    exp_bytes = calloc(1, exp_size);
    float x[FF * E];
    for (int l = 0; l < NLAYER; l++)
        for (int e = 0; e < NEXP; e++)
            for (int m = 0; m < 3; m++) {
                for (int i = 0; i < FF * E; i++) x[i] = rndf() * 0.3f;
                size_t at = l == 0 ? HEAD + ((size_t)m * NEXP + (size_t)e) * MAT
                                   : l1 + (size_t)e * BLK + (size_t)m * 1152;
                CHECK(cb_quantize_q8_0(x, FF * E, exp_bytes + at) == CB_OK);
            }
    for (int l = 0; l < NLAYER; l++) {
        cb_experts_layer_t *L = &exp_layers[l];
        memset(L, 0, sizeof *L);
        L->n_expert = NEXP;
        L->type_gate = L->type_up = L->type_down = CB_TYPE_Q8_0;
        L->n_embd = E;
        L->n_ff = FF;
        if (l == 0) {
            L->gate_off = HEAD;
            L->up_off = HEAD + NEXP * MAT;
            L->down_off = HEAD + 2 * NEXP * MAT;
            L->gate_stride = L->up_stride = L->down_stride = MAT;
        } else {
            L->gate_off = l1;
            L->up_off = l1 + 1152;
            L->down_off = l1 + 2304;
            L->gate_stride = L->up_stride = L->down_stride = BLK;
            L->gate_bytes = L->up_bytes = L->down_bytes = MAT;
        }
        L->gate_base = exp_bytes + L->gate_off;
        L->up_base = exp_bytes + L->up_off;
        L->down_base = exp_bytes + L->down_off;
    }
    snprintf(exp_path, sizeof exp_path, "/tmp/cb_test_oom_XXXXXX");
    int fd = mkstemp(exp_path);
    CHECK(fd >= 0);
    CHECK(write(fd, exp_bytes, exp_size) == (ssize_t)exp_size);
    close(fd);
}

/* ---- workload 3: the expert store ---------------------------------------------------------- */

static uint64_t hash_refs(uint64_t h, const cb_expert_ref_t *r, int n) {
    for (int i = 0; i < n; i++) {
        h = hash_bytes(h, r[i].gate, MAT);
        h = hash_bytes(h, r[i].up, MAT);
        h = hash_bytes(h, r[i].down, MAT);
    }
    return h;
}

static uint64_t work_experts(void) {
    uint64_t h = 1469598103934665603ull;
    cb_experts_t *s = NULL, *m = NULL;
    cb_experts_params_t p = cb_experts_default_params();
    p.mode = CB_EXPERTS_CACHE;
    p.policy = CB_EXPERTS_LFRU;
    p.path = exp_path;
    p.budget_bytes = 5 * 6 * BLK; /* five slots of O_DIRECT's layout (3 x (4 KiB + 4 KiB)) */
    p.min_slots = 3;
    p.prefetch = 1;
    STEP_NEW(cb_experts_new(&p, exp_layers, NLAYER, &s), s);
    cb_experts_params_t pm = p;
    pm.mode = CB_EXPERTS_MMAP;
    pm.policy = CB_EXPERTS_LRU;
    STEP_NEW(cb_experts_new(&pm, exp_layers, NLAYER, &m), m);
    STEP(cb_experts_pin(s, 1, 3));
    static const int32_t calls[][4] = {{0, 1, 2, -1}, {3, 2, -1, -1}, {1, 3, 0, -1},
                                       {2, 0, 1, -1}, {0, 3, -1, -1}, {1, 2, 3, -1}};
    for (int c = 0; c < 12; c++) {
        const int32_t *ids = calls[c % 6];
        int n = 0;
        while (n < 4 && ids[n] >= 0) n++;
        int layer = c % 2;
        cb_expert_ref_t r[4];
        STEP(cb_experts_acquire(s, layer, ids, n, NULL, r));
        h = hash_refs(h, r, n);
        STEP(cb_experts_release(s, layer, ids, n));
        STEP(cb_experts_prefetch(s, 1 - layer, calls[(c + 1) % 6], 2));
        STEP(cb_experts_acquire(m, layer, ids, n, NULL, r));
        h = hash_refs(h, r, n);
        STEP(cb_experts_release(m, layer, ids, n));
    }
    cb_experts_prefetch_sync(s);
out:
    cb_experts_free(s);
    cb_experts_free(m);
    return h;
}

/* ---- workload 4: the thread pool and a quantized matmul (pool scratch) --------------------- */

typedef struct sum_ctx {
    int64_t v[64];
} sum_ctx;

static void sum_task(void *c, int task, int thread) {
    (void)thread;
    ((sum_ctx *)c)->v[task] = (int64_t)task * task;
}

static uint64_t work_pool(void) {
    uint64_t h = 1469598103934665603ull;
    cb_threadpool_t *pool = NULL;
    STEP_NEW(cb_threadpool_new(4, &pool), pool);
    sum_ctx c;
    memset(&c, 0, sizeof c);
    STEP(cb_threadpool_run(pool, sum_task, &c, 64));
    h = hash_bytes(h, c.v, sizeof c.v);
    cb_matrix_t w = {CB_TYPE_Q8_0, FF, E, 34, exp_bytes + HEAD};
    float x[8 * E], y[8 * FF];
    for (int i = 0; i < 8 * E; i++) x[i] = (float)((i * 37) % 19 - 9) / 9.0f;
    for (int n = 1; n <= 8; n *= 2) { /* the scratch grows with the tokens */
        STEP(cb_matmul(&w, x, n, E, y, FF, pool));
        h = hash_bytes(h, y, (size_t)n * FF * sizeof(float));
        STEP(cb_matmul(&w, x, n, E, y, FF, NULL)); /* no pool: one buffer per call */
        h = hash_bytes(h, y, (size_t)n * FF * sizeof(float));
    }
out:
    cb_threadpool_free(pool);
    return h;
}

/* ---- workload 5: the forward pass of a tiny MoE model -------------------------------------- */

static float *wbuf;
static cb_layer_desc_t lay[NLAYER];
static cb_model_desc_t model;

static const float *randv(float **at, size_t n, float scale, float bias) {
    float *p = *at;
    for (size_t i = 0; i < n; i++) p[i] = bias + rndf() * scale;
    *at += n;
    return p;
}

static cb_matrix_t f32mat(float **at, int64_t rows, int64_t cols) {
    cb_matrix_t m = {CB_TYPE_F32, rows, cols, (size_t)cols * 4, randv(at, (size_t)(rows * cols), 0.3f, 0)};
    return m;
}

static void build_model(void) {
    wbuf = calloc(200000, sizeof(float));
    float *at = wbuf;
    memset(&model, 0, sizeof model);
    model.n_embd = E;
    model.n_layer = NLAYER;
    model.n_head = NHEAD;
    model.n_head_kv = 1;
    model.head_dim = HD;
    model.n_vocab = NVOCAB;
    model.norm_eps = 1e-5f;
    model.act = CB_ACT_SILU;
    model.rope_mode = CB_ROPE_NEOX;
    model.rope_n_dims = HD;
    model.embd_scale = 1.0f;
    model.attn_scale = 0.25f;
    model.gating = CB_GATING_SOFTMAX;
    model.expert_renorm = 1;
    model.expert_scale = 1.0f;
    model.tok_embd = f32mat(&at, NVOCAB, E);
    model.output = f32mat(&at, NVOCAB, E);
    model.output_norm = randv(&at, E, 0.1f, 1.0f);
    for (int l = 0; l < NLAYER; l++) {
        cb_layer_desc_t *L = &lay[l];
        memset(L, 0, sizeof *L);
        L->attn_norm = randv(&at, E, 0.1f, 1.0f);
        L->wq = f32mat(&at, NHEAD * HD, E);
        L->wk = f32mat(&at, HD, E);
        L->wv = f32mat(&at, HD, E);
        L->wo = f32mat(&at, E, NHEAD * HD);
        L->rope_base = 10000.0f;
        L->rope_freq_scale = 1.0f;
        L->ffn_norm = randv(&at, E, 0.1f, 1.0f);
        L->n_expert = NEXP;
        L->n_expert_used = NUSED;
        L->router = f32mat(&at, NEXP, E);
        L->n_ff_exp = FF;
        L->exp_gate = (cb_matrix_t){CB_TYPE_Q8_0, FF, E, 34, NULL};
        L->exp_up = L->exp_gate;
        L->exp_down = (cb_matrix_t){CB_TYPE_Q8_0, E, FF, 34, NULL};
        if (l == 1) { /* a shared expert too */
            L->sh_gate = f32mat(&at, FF, E);
            L->sh_up = f32mat(&at, FF, E);
            L->sh_down = f32mat(&at, E, FF);
        }
    }
    model.layers = lay;
}

enum { MAXB = 8, NSTEP = 4 };

/* prompt of seq A (5 tokens) and B (2 tokens) in one batch, then 3 decode steps of both;
 * the logits of every step are written to out ([(7 + 3 * 2) x NVOCAB]) */
static void work_forward(float *out) {
    cb_arena_t *a = NULL;
    cb_kvcache_t *kv = NULL;
    cb_threadpool_t *pool = NULL;
    cb_experts_t *ex = NULL;
    cb_forward_t *f = NULL;
    cb_arena_params ap = cb_arena_default_params();
    ap.capacity = 1 << 20;
    STEP_NEW(cb_arena_new(&ap, &a), a);
    cb_kvcache_params kp = cb_kvcache_default_params();
    kp.n_layers = NLAYER;
    kp.n_kv_heads = 1;
    kp.head_dim = HD;
    kp.dtype = CB_KV_F32;
    kp.max_sequences = 4;
    kp.chunk_tokens = 2;
    STEP_NEW(cb_kvcache_new(a, &kp, &kv), kv);
    STEP_NEW(cb_threadpool_new(3, &pool), pool);
    cb_experts_params_t p = cb_experts_default_params();
    p.mode = CB_EXPERTS_CACHE;
    p.path = exp_path;
    p.budget_bytes = 5 * BLK; /* 5 of 8 experts: evictions every layer */
    p.min_slots = NEXP;
    p.prefetch = 1;
    STEP_NEW(cb_experts_new(&p, exp_layers, NLAYER, &ex), ex);
    STEP_NEW(cb_forward_new(&model, kv, ex, pool, MAXB, &f), f);
    uint32_t sa, sb;
    STEP(cb_kvcache_seq_new(kv, &sa));
    STEP(cb_kvcache_seq_new(kv, &sb));
    int32_t tok[7] = {1, 5, 9, 13, 17, 2, 4}, pos[7] = {0, 1, 2, 3, 4, 0, 1};
    uint32_t seq[7] = {sa, sa, sa, sa, sa, sb, sb};
    cb_batch_t b = {7, tok, NULL, seq, pos, NULL};
    STEP(cb_forward_run(f, &b, out));
    out += 7 * NVOCAB;
    for (int step = 0; step < NSTEP - 1; step++) {
        int32_t t2[2] = {(int32_t)((step * 7 + 3) % NVOCAB), (int32_t)((step * 11 + 6) % NVOCAB)};
        int32_t p2[2] = {5 + step, 2 + step};
        uint32_t s2[2] = {sa, sb};
        cb_batch_t b2 = {2, t2, NULL, s2, p2, NULL};
        STEP(cb_forward_run(f, &b2, out));
        out += 2 * NVOCAB;
    }
out:
    cb_forward_free(f);
    cb_experts_free(ex);
    cb_threadpool_free(pool);
    cb_kvcache_free(kv);
    cb_arena_free(a);
}

/* ---- the driver ------------------------------------------------------------------------------ */

enum { NLOGITS = (7 + (NSTEP - 1) * 2) * NVOCAB };

static uint64_t run_forward_hash(void) {
    static float lg[NLOGITS];
    memset(lg, 0, sizeof lg);
    work_forward(lg);
    for (int i = 0; i < NLOGITS; i++) CHECK(isfinite(lg[i]));
    return hash_bytes(1469598103934665603ull, lg, sizeof lg);
}

typedef uint64_t (*workload_fn)(void);

/* runs w clean, then with the k-th allocation failing for k = 1, 2, ... in both modes; returns
 * the largest k that was reached (the allocations of a clean run) */
static long sweep(const char *name, workload_fn w) {
    cb_fault_arm(0, 0);
    int before = cb_test_failures;
    uint64_t ref = w();
    long total = 0;
    for (int persistent = 0; persistent <= 1; persistent++) {
        long hits = n_hit_steps;
        long k;
        for (k = 1;; k++) {
            cur_k = k;
            cb_fault_arm(k, persistent);
            cb_clear_error();
            run_hit = 0;
            uint64_t got = w();
            long failed = cb_fault_failed() + run_hit; /* failures swallowed inside, or a step */
            cb_fault_arm(0, 0);
            if (got != ref) fprintf(stderr, "%s: k=%ld (%s): the result differs\n", name, k,
                                    persistent ? "persistent" : "one-shot");
            CHECK(got == ref);
            if (failed == 0) break; /* the k-th allocation was never reached: done */
            if (cb_test_failures > before + 20) break; /* do not flood the log */
        }
        printf("%s: %ld allocations, %s faults: %ld steps failed and recovered\n", name, k - 1,
               persistent ? "persistent" : "one-shot", n_hit_steps - hits);
        total = k - 1;
    }
    cur_k = 0;
    return total;
}

int main(void) {
    rng_state = 88172645463325252ull;
    build_vocabs();
    build_expert_file();
    build_model();
    long n[5];
    n[0] = sweep("arena+kvcache", work_kv);
    n[1] = sweep("tokenizer", work_tokenizer);
    n[2] = sweep("experts", work_experts);
    n[3] = sweep("threadpool+matmul", work_pool);
    n[4] = sweep("forward", run_forward_hash);
    for (int i = 0; i < 5; i++) CHECK(n[i] > 0);
    unlink(exp_path);
    free(exp_bytes);
    free(wbuf);
    TEST_MAIN_END("test_oom");
}
