/* Expert store (see include/colibri/experts.h). This file holds the mapped store: addresses
 * are computed from the borrowed bases, nothing is copied. Per-layer statistics and per-expert
 * routing counts live in tables allocated once at creation (no allocation in acquire).
 * Invariant: counts has sum over layers of n_expert entries, offsets[l] indexes layer l. */
#include "colibri/experts.h"

#include <stdlib.h>
#include <string.h>

struct cb_experts {
    int32_t n_layers;
    cb_experts_layer_t *layers;        /* owned copy */
    cb_experts_layer_stats_t *stats;   /* [n_layers] */
    uint64_t *counts;                  /* per (layer, expert) routings */
    size_t *offsets;                   /* [n_layers] start of a layer's counts */
};

cb_status cb_experts_new_mapped(const cb_experts_layer_t *layers, int32_t n_layers,
                                cb_experts_t **out) {
    if (!out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: out is NULL");
    *out = NULL;
    if (n_layers < 0 || (n_layers > 0 && !layers))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: %d layers", (int)n_layers);
    size_t total = 0;
    for (int32_t l = 0; l < n_layers; l++) {
        const cb_experts_layer_t *L = &layers[l];
        if (L->n_expert < 0 || L->n_expert > (1 << 20))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: layer %d has %d experts", l,
                           (int)L->n_expert);
        if (L->n_expert > 0 && (!L->gate_base || !L->up_base || !L->down_base || L->n_ff <= 0 ||
                                L->n_embd <= 0))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "experts: layer %d has experts but no tensors or shape", l);
        total += (size_t)L->n_expert;
    }
    cb_experts_t *s = calloc(1, sizeof *s);
    if (!s) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: no memory for the store");
    s->n_layers = n_layers;
    s->layers = calloc((size_t)n_layers + 1, sizeof *s->layers);
    s->stats = calloc((size_t)n_layers + 1, sizeof *s->stats);
    s->counts = calloc(total + 1, sizeof *s->counts);
    s->offsets = calloc((size_t)n_layers + 1, sizeof *s->offsets);
    if (!s->layers || !s->stats || !s->counts || !s->offsets) {
        cb_experts_free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: no memory for %zu expert counters",
                       total);
    }
    if (n_layers) memcpy(s->layers, layers, (size_t)n_layers * sizeof *layers);
    size_t off = 0;
    for (int32_t l = 0; l < n_layers; l++) {
        s->offsets[l] = off;
        off += (size_t)layers[l].n_expert;
    }
    *out = s;
    return CB_OK;
}

void cb_experts_free(cb_experts_t *s) {
    if (!s) return;
    free(s->layers);
    free(s->stats);
    free(s->counts);
    free(s->offsets);
    free(s);
}

cb_status cb_experts_acquire(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                             const int32_t *uses, cb_expert_ref_t *out) {
    if (!s || layer < 0 || layer >= s->n_layers || n < 0 || (n > 0 && (!ids || !out)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: bad acquire (layer %d, n %d)",
                       (int)layer, (int)n);
    const cb_experts_layer_t *L = &s->layers[layer];
    for (int32_t i = 0; i < n; i++) {
        int32_t e = ids[i];
        if (e < 0 || e >= L->n_expert)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: layer %d has no expert %d",
                           (int)layer, (int)e);
        out[i].gate = L->gate_base + (size_t)e * L->gate_stride;
        out[i].up = L->up_base + (size_t)e * L->up_stride;
        out[i].down = L->down_base + (size_t)e * L->down_stride;
        uint64_t u = uses ? (uint64_t)(uses[i] > 0 ? uses[i] : 0) : 1;
        s->counts[s->offsets[layer] + (size_t)e] += u;
        s->stats[layer].uses += u;
    }
    s->stats[layer].acquired += (uint64_t)n;
    s->stats[layer].hits += (uint64_t)n; /* mapped: resident as far as the store knows */
    return CB_OK;
}

cb_status cb_experts_release(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n) {
    (void)ids;
    if (!s || layer < 0 || layer >= s->n_layers || n < 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: bad release (layer %d)", (int)layer);
    return CB_OK;
}

cb_status cb_experts_stats(const cb_experts_t *s, int32_t layer, cb_experts_layer_stats_t *out) {
    if (!s || !out || layer < -1 || layer >= s->n_layers)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: no layer %d", (int)layer);
    if (layer >= 0) {
        *out = s->stats[layer];
        return CB_OK;
    }
    memset(out, 0, sizeof *out);
    for (int32_t l = 0; l < s->n_layers; l++) {
        out->uses += s->stats[l].uses;
        out->acquired += s->stats[l].acquired;
        out->hits += s->stats[l].hits;
        out->misses += s->stats[l].misses;
        out->bytes_read += s->stats[l].bytes_read;
        out->wait_ns += s->stats[l].wait_ns;
    }
    return CB_OK;
}

cb_status cb_experts_route_counts(const cb_experts_t *s, int32_t layer, uint64_t *counts,
                                  int32_t n_expert) {
    if (!s || layer < 0 || layer >= s->n_layers || !counts ||
        n_expert != s->layers[layer].n_expert)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: route counts of layer %d",
                       (int)layer);
    memcpy(counts, s->counts + s->offsets[layer], (size_t)n_expert * sizeof *counts);
    return CB_OK;
}

void cb_experts_reset_stats(cb_experts_t *s) {
    if (!s) return;
    memset(s->stats, 0, (size_t)s->n_layers * sizeof *s->stats);
    size_t total = s->n_layers ? s->offsets[s->n_layers - 1] +
                                     (size_t)s->layers[s->n_layers - 1].n_expert
                               : 0;
    memset(s->counts, 0, total * sizeof *s->counts);
}
