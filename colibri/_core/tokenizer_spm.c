/* SentencePiece merging (the tokenizer's SPM model; see tokenizer.c for the design): the
 * fragment's UTF-8 characters become a linked list of symbols, candidate bigrams that form a
 * vocabulary token go into a heap ordered by (score desc, left position asc), stale ones are
 * skipped when popped; a symbol left without a token falls back to its bytes' tokens. */
#include "tokenizer_impl.h"

static const uint8_t utf8_len_tab[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};

/* SPM: the whole (escaped) fragment s[0..n) */
static int spm_try_bigram(const cb_tokenizer_t *t, merger *m, const uint8_t *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const uint32_t size = m->s[l].n + m->s[r].n;
    const int32_t id = vocab_find(t, s + m->s[l].off, size);
    if (id < 0) return 0;
    return heap_push(m, (bigram){t->score[id], l, r, size});
}

cb_status cb_tok_spm_tokenize(const cb_tokenizer_t *t, merger *m, const uint8_t *s, size_t n, ivec *out) {
    m->ns = 0;
    m->nh = 0;
    if (n == 0) return CB_OK;
    if (syms_reserve(m, n)) return NOMEM("symbols");
    size_t off = 0;
    int32_t idx = 0;
    while (off < n) {
        size_t len = utf8_len_tab[s[off] >> 4];
        if (len > n - off) len = n - off;
        m->s[idx] = (sym){idx - 1, off + len == n ? -1 : idx + 1, (uint32_t)off, (uint32_t)len};
        off += len;
        idx++;
    }
    m->ns = (size_t)idx;
    for (int32_t i = 1; i < idx; i++)
        if (spm_try_bigram(t, m, s, i - 1, i)) return NOMEM("bigrams");
    while (m->nh) {
        const bigram b = heap_pop(m);
        sym *L = &m->s[b.left], *R = &m->s[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) m->s[R->next].prev = b.left;
        if (spm_try_bigram(t, m, s, L->prev, b.left) || spm_try_bigram(t, m, s, b.left, L->next))
            return NOMEM("bigrams");
    }
    for (int32_t i = 0; i != -1; i = m->s[i].next) {
        const sym *y = &m->s[i];
        const int32_t id = vocab_find(t, s + y->off, y->n);
        if (id >= 0) {
            if (ivec_push(out, id)) return NOMEM("ids");
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            const uint8_t byte = s[y->off + j];
            if (t->byte_tok[byte] < 0)
                return cb_fail(CB_STATUS_UNSUPPORTED,
                               "tokenizer: the vocabulary has no byte token for 0x%02X (needed at byte %u)",
                               byte, y->off + j);
            if (ivec_push(out, t->byte_tok[byte])) return NOMEM("ids");
        }
    }
    return CB_OK;
}
