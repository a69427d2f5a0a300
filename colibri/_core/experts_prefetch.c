/* The expert store's prefetch (experts_impl.h): the hints and the background thread that acts on
 * them. cb_experts_prefetch records a layer's hint for scoring (the layer's next acquire counts
 * how many of the experts it wants were predicted: cb_score_hint) and, when the store has a
 * prefetch thread, makes it the thread's queue: the current hint only (a new hint empties the
 * queue), in hint order, with a new round number that protects the hint's resident experts from
 * the thread's evictions. The thread (cb_prefetch_main) claims a slot (take_slot_prefetch: a free
 * one, or a victim only while at least half of the recent prefetches were used), reads the
 * expert with mu released (cb_read_expert), and makes the slot evictable, marked prefetched.
 *
 * Invariant: a slot the thread reads is `loading` (owner set, slot_of[g] == k) and counted in
 * n_loading until the read ends; cv_done is broadcast then and whenever the queue runs dry
 * (cb_experts_prefetch_sync waits on it). */
#include "colibri/experts.h"

#include "experts_impl.h"

#include <pthread.h>
#include <string.h>

/* a slot for the prefetch thread: free, or a victim not named by the current hint; no victim
 * while most recent prefetches were evicted unused (wrong predictions would only push out
 * experts that are used) (mu held) */
static int32_t take_slot_prefetch(cb_experts_t *s) {
    if (s->n_free > 0) return s->free_stack[--s->n_free];
    if (s->pf_bad > s->pf_good) return -1;
    int32_t k = cb_evict_peek(s);
    if (k < 0 || s->slots[k].hint_round == s->round) return -1;
    k = cb_evict_pop(s);
    cb_drop_owner(s, k);
    return k;
}

/* ---- the prefetch thread ---- */

void *cb_prefetch_main(void *arg) {
    cb_experts_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->q_n == 0) {
            pthread_cond_broadcast(&s->cv_done); /* idle: wakes cb_experts_prefetch_sync */
            pthread_cond_wait(&s->cv_work, &s->mu);
        }
        if (s->stop) break;
        int32_t g = s->queue[s->q_head++];
        s->q_n--;
        if (s->slot_of[g] >= 0) continue; /* resident, or being read by acquire */
        int32_t k = take_slot_prefetch(s);
        if (k < 0) { /* no room left for this hint without evicting itself */
            s->q_n = 0;
            continue;
        }
        slot_t *x = &s->slots[k];
        x->owner = g;
        x->loading = 1;
        x->hint_round = s->round;
        s->slot_of[g] = k;
        s->n_loading++;
        int32_t l = s->layer_of[g];
        s->stats[l].prefetch_issued++;
        pthread_mutex_unlock(&s->mu);
        uint64_t reads = 0, bytes = 0;
        cb_status rs = cb_read_expert(s, k, g, &reads, &bytes);
        pthread_mutex_lock(&s->mu);
        x->loading = 0;
        s->n_loading--;
        if (rs == CB_OK) {
            cb_account_read(s, g, reads, bytes);
            x->prefetched = 1;
            cb_evict_add(s, k);
        } else { /* the compute reads it itself and reports the error */
            cb_slot_unclaim(s, k);
        }
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Scores a layer's pending hint against the experts an acquire wants (callers hold mu, or
 * own the mapped store, where the forward's thread is the only caller). */
void cb_score_hint(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                       cb_experts_layer_stats_t *st) {
    uint32_t h = s->hint_pending[layer];
    if (!h) return;
    s->hint_pending[layer] = 0;
    st->predicted_acquired += (uint64_t)n;
    for (int32_t i = 0; i < n; i++)
        if (s->hint_of[s->offsets[layer] + (size_t)ids[i]] == h) st->predicted_used++;
}

/* Records a hint for scoring: the layer's next acquire compares it with what it wants. */
static void record_hint(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n) {
    if (++s->hint_seq == 0) { /* wrapped: old marks could collide with new ids */
        memset(s->hint_of, 0, s->total * sizeof *s->hint_of);
        memset(s->hint_pending, 0, (size_t)s->n_layers * sizeof *s->hint_pending);
        s->hint_seq = 1;
    }
    uint32_t h = s->hint_seq;
    uint64_t fresh = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t g = s->offsets[layer] + (size_t)ids[i];
        if (s->hint_of[g] != h) { /* a repeated id counts once */
            s->hint_of[g] = h;
            fresh++;
        }
    }
    s->hint_pending[layer] = h;
    s->stats[layer].predicted += fresh;
}

/* ---- prefetch ---- */

cb_status cb_experts_prefetch(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n) {
    CHECK_OK(cb_check_layer_ids(s, layer, ids, n, "prefetch"));
    pthread_mutex_lock(&s->mu);
    record_hint(s, layer, ids, n);
    if (!s->thread_started) {
        pthread_mutex_unlock(&s->mu);
        return CB_OK;
    }
    s->round++;
    if (s->round == 0) s->round = 1; /* 0 means "never hinted" */
    s->q_head = 0;
    s->q_n = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t g = s->offsets[layer] + (size_t)ids[i];
        int32_t k = s->slot_of[g];
        if (k >= 0) {
            s->slots[k].hint_round = s->round; /* resident or in flight: protect it */
        } else if (s->queued_round[g] != s->round) {
            s->queued_round[g] = s->round;
            s->queue[s->q_n++] = (int32_t)g;
        }
    }
    if (s->q_n) pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return CB_OK;
}

int32_t cb_experts_prefetching(const cb_experts_t *s) { return s && s->thread_started; }

int32_t cb_experts_reads_pending(const cb_experts_t *s) {
    return s && s->pend_active ? s->pend_nj : 0;
}

void cb_experts_prefetch_sync(cb_experts_t *s) {
    if (!s || !s->thread_started) return;
    pthread_mutex_lock(&s->mu);
    while (s->q_n > 0 || s->n_loading > 0) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}
