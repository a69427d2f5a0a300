/* The expert store: where the forward pass gets the weights of routed experts.
 *
 * The MoE layer never reads expert weights directly: it asks the store for the experts the
 * router chose (cb_experts_acquire) and gives them back when the layer is done
 * (cb_experts_release). Between the two calls the returned pointers stay valid and unchanged.
 * This lets the store decide where experts come from; the forward pass is the same for every
 * store.
 *
 * Store kinds:
 *   CB_EXPERTS_MAPPED - the experts live in memory the caller owns (an mmap of the model
 *     file): acquire only computes addresses (base + expert * stride). Faults pages in on first
 *     touch, like llama.cpp's mmap. This is the full-RAM path and the reference that every
 *     other store must match bit for bit.
 *
 * Layout of one layer's experts (GGUF ffn_{gate,up,down}_exps): three 3-D tensors; expert e's
 * gate matrix [n_ff rows x n_embd cols] starts at gate_base + e * gate_stride (bytes), likewise
 * up ([n_ff x n_embd]) and down ([n_embd x n_ff]). Types are GGML type ids (quant.h).
 *
 * Ownership: the store borrows every base pointer (the caller keeps the mapping alive for the
 * store's lifetime) and owns its tables. Statistics count, per layer, acquisitions (expert
 * uses), distinct experts per call, and bytes touched.
 *
 * Threads: acquire/release of one store are called by one forward pass at a time.
 */
#ifndef COLIBRI_EXPERTS_H
#define COLIBRI_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cb_experts cb_experts_t;

/* One layer's expert tensors (all borrowed). */
typedef struct cb_experts_layer {
    int32_t n_expert;          /* experts in this layer (0: a dense layer, no experts) */
    int32_t type_gate, type_up, type_down; /* GGML type ids */
    int64_t n_embd, n_ff;      /* gate/up: [n_ff x n_embd]; down: [n_embd x n_ff] */
    const uint8_t *gate_base, *up_base, *down_base;
    size_t gate_stride, up_stride, down_stride; /* bytes from one expert to the next */
} cb_experts_layer_t;

/* What acquire returns for one expert: borrowed pointers to its three matrices. */
typedef struct cb_expert_ref {
    const uint8_t *gate, *up, *down;
} cb_expert_ref_t;

typedef struct cb_experts_layer_stats {
    uint64_t uses;        /* (token, expert) routings served */
    uint64_t acquired;    /* experts handed out (once per expert per batch) */
    uint64_t hits;        /* acquired experts that were already resident */
    uint64_t misses;      /* acquired experts that had to be read */
    uint64_t bytes_read;  /* bytes read from the file for misses */
    uint64_t wait_ns;     /* time the forward pass waited inside acquire */
} cb_experts_layer_stats_t;

/* A mapped store over n_layers layers (layers[] copied; the bases stay borrowed). */
cb_status cb_experts_new_mapped(const cb_experts_layer_t *layers, int32_t n_layers,
                                cb_experts_t **out);

/* Frees the store (not the memory its bases point into). NULL accepted. */
void cb_experts_free(cb_experts_t *s);

/* Pointers for experts ids[0..n) of layer; out[i] receives expert ids[i]. uses[i] (nullable)
 * is how many tokens each expert serves in this batch (statistics only). INVALID_ARGUMENT for
 * a bad layer or expert id. */
cb_status cb_experts_acquire(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                             const int32_t *uses, cb_expert_ref_t *out);

/* Gives back what acquire handed out for the same layer and ids. */
cb_status cb_experts_release(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n);

/* Statistics of one layer (layer >= 0) or the sum of all (layer == -1). */
cb_status cb_experts_stats(const cb_experts_t *s, int32_t layer, cb_experts_layer_stats_t *out);

/* Per-expert routing counts of a layer: counts[0..n_expert) (how often each was chosen). */
cb_status cb_experts_route_counts(const cb_experts_t *s, int32_t layer, uint64_t *counts,
                                  int32_t n_expert);

/* Zeroes every statistic and count. */
void cb_experts_reset_stats(cb_experts_t *s);

#ifdef __cplusplus
}
#endif
#endif
