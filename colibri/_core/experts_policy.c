/* The expert store's eviction policies (experts_impl.h): LRU, a linked list of the evictable
 * slots, and LFRU, a min-heap keyed by age + acquisitions with ties to the least recently used;
 * an evicted key raises the age, so old popularity fades (see experts.c for the design). */
#include "experts_impl.h"

static int heap_less(const cb_experts_t *s, int32_t a, int32_t b) {
    const slot_t *x = &s->slots[a], *y = &s->slots[b];
    return x->key < y->key || (x->key == y->key && x->tick < y->tick);
}

static void heap_swap(cb_experts_t *s, int32_t i, int32_t j) {
    int32_t a = s->heap[i], b = s->heap[j];
    s->heap[i] = b;
    s->heap[j] = a;
    s->slots[b].heap_pos = i;
    s->slots[a].heap_pos = j;
}

static void heap_up(cb_experts_t *s, int32_t i) {
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!heap_less(s, s->heap[i], s->heap[p])) break;
        heap_swap(s, i, p);
        i = p;
    }
}

static void heap_down(cb_experts_t *s, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->n_heap && heap_less(s, s->heap[l], s->heap[m])) m = l;
        if (r < s->n_heap && heap_less(s, s->heap[r], s->heap[m])) m = r;
        if (m == i) return;
        heap_swap(s, i, m);
        i = m;
    }
}

static void heap_remove(cb_experts_t *s, int32_t k) {
    int32_t i = s->slots[k].heap_pos;
    if (i < 0) return;
    int32_t last = --s->n_heap;
    if (i != last) {
        heap_swap(s, i, last);
        heap_down(s, i);
        heap_up(s, i);
    }
    s->slots[k].heap_pos = -1;
}

static void lru_remove(cb_experts_t *s, int32_t k) {
    slot_t *x = &s->slots[k];
    if (!x->in_lru) return;
    if (x->prev >= 0) s->slots[x->prev].next = x->next;
    else s->lru_head = x->next;
    if (x->next >= 0) s->slots[x->next].prev = x->prev;
    else s->lru_tail = x->prev;
    x->prev = x->next = -1;
    x->in_lru = 0;
}

/* k becomes evictable (it was just released or loaded and unlocked) */
void cb_evict_add(cb_experts_t *s, int32_t k) {
    slot_t *x = &s->slots[k];
    x->tick = ++s->tick;
    if (s->policy == CB_EXPERTS_LFRU) {
        x->key = s->age + s->freq[x->owner];
        x->heap_pos = s->n_heap;
        s->heap[s->n_heap++] = k;
        heap_up(s, x->heap_pos);
    } else {
        x->prev = s->lru_tail;
        x->next = -1;
        if (s->lru_tail >= 0) s->slots[s->lru_tail].next = k;
        else s->lru_head = k;
        s->lru_tail = k;
        x->in_lru = 1;
    }
}

void cb_evict_remove(cb_experts_t *s, int32_t k) {
    if (s->policy == CB_EXPERTS_LFRU) heap_remove(s, k);
    else lru_remove(s, k);
}

/* the victim (removed from the structure), or -1 when every slot is locked or pinned */
int32_t cb_evict_pop(cb_experts_t *s) {
    int32_t k;
    if (s->policy == CB_EXPERTS_LFRU) {
        if (s->n_heap == 0) return -1;
        k = s->heap[0];
        if (s->slots[k].key > s->age) s->age = s->slots[k].key;
        heap_remove(s, k);
    } else {
        k = s->lru_head;
        if (k < 0) return -1;
        lru_remove(s, k);
    }
    return k;
}

/* the victim evictable_pop would choose, without removing it, or -1 */
int32_t cb_evict_peek(const cb_experts_t *s) {
    if (s->policy == CB_EXPERTS_LFRU) return s->n_heap ? s->heap[0] : -1;
    return s->lru_head;
}
