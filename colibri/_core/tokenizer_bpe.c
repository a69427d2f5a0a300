/* Byte-level BPE merging (the tokenizer's BPE model; see tokenizer.c for the design): a text
 * fragment is pre-tokenized (tokenizer_pretok.c), then each word's bytes are merged by rank
 * (rank asc, left position asc), llama.cpp's order; a word that is a token is taken whole when
 * the vocabulary says to ignore merges. */
#include "tokenizer_impl.h"

/* BPE: one pre-tokenized word w[0..n) of raw bytes */
static int bpe_try_bigram(const cb_tokenizer_t *t, merger *m, const uint8_t *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const uint32_t size = m->s[l].n + m->s[r].n;
    const int32_t rank = merge_find(t, w + m->s[l].off, m->s[l].n, size);
    if (rank < 0) return 0;
    return heap_push(m, (bigram){-(float)rank, l, r, size});
}

static cb_status bpe_word(const cb_tokenizer_t *t, merger *m, const uint8_t *w, size_t n, ivec *out) {
    if (n == 0) return CB_OK;
    int whole = t->ignore_merges || n == 1;
    if (!whole && (t->bpe_flags & CB_BPE_NEWLINE_WORDS)) { /* gemma4: a run of newlines */
        whole = 1;
        for (size_t i = 0; i < n && whole; i++) whole = w[i] == '\n';
    }
    if (whole) {
        const int32_t id = vocab_find(t, w, n);
        if (id >= 0) return ivec_push(out, id) ? NOMEM("ids") : CB_OK;
    }
    if (syms_reserve(m, n)) return NOMEM("symbols");
    m->nh = 0;
    /* the first symbols: bytes (byte-level BPE) or UTF-8 characters (raw BPE; a truncated
     * sequence, which validated text cannot hold, is cut at the word's end as llama.cpp does) */
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        if (t->bpe_flags & CB_BPE_RAW_UTF8) {
            const uint8_t b = w[i];
            k = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
            if (k > n - i) k = n - i;
        }
        m->s[ns] = (sym){(int32_t)ns - 1, (int32_t)ns + 1, (uint32_t)i, (uint32_t)k};
        ns++;
        i += k;
    }
    m->s[ns - 1].next = -1;
    m->ns = ns;
    for (size_t i = 1; i < ns; i++)
        if (bpe_try_bigram(t, m, w, (int32_t)i - 1, (int32_t)i)) return NOMEM("bigrams");
    while (m->nh) {
        const bigram b = heap_pop(m);
        sym *L = &m->s[b.left], *R = &m->s[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) m->s[R->next].prev = b.left;
        if (bpe_try_bigram(t, m, w, L->prev, b.left) || bpe_try_bigram(t, m, w, b.left, L->next))
            return NOMEM("bigrams");
    }
    for (int32_t i = 0; i != -1; i = m->s[i].next) {
        const sym *y = &m->s[i];
        const int32_t id = vocab_find(t, w + y->off, y->n);
        if (id >= 0) {
            if (ivec_push(out, id)) return NOMEM("ids");
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            const int32_t b = t->byte_tok[w[y->off + j]];
            if (b >= 0 && ivec_push(out, b)) return NOMEM("ids"); /* llama.cpp drops missing bytes */
        }
    }
    return CB_OK;
}

cb_status cb_tok_bpe_fragment(const cb_tokenizer_t *t, merger *m, pre_scratch *ps, const uint8_t *s,
                              size_t n, ivec *out) {
    const zvec *pieces;
    const cb_status st = cb_tok_pretokenize(t, ps, s, n, &pieces);
    if (st != CB_OK) return st;
    for (size_t p = 0; p < pieces->n; p += 2) {
        const size_t b0 = ps->boff[pieces->v[p]], b1 = ps->boff[pieces->v[p + 1]];
        const cb_status r = bpe_word(t, m, s + b0, b1 - b0, out);
        if (r != CB_OK) return r;
    }
    return CB_OK;
}
