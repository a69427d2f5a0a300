/* colibri/mapguard.h - a clear last word when a mapped model file changes under us.
 *
 * The model file is mmap()ed and read in place. If another process truncates it (or a
 * writer replaces its bytes in place and shrinks it) while it is mapped, the next read of a
 * page past the new end raises SIGBUS, and the process used to die with a bare "Bus error".
 * A process-wide SIGBUS handler (installed once, chained to the previous one) looks the
 * faulting address up among the registered mappings and, when it lies in one, writes one
 * line to stderr naming the file, the offset and what happened; then it restores the previous
 * disposition and returns, so the fault repeats and the process still dies of SIGBUS (or the
 * previous handler - Python's faulthandler - runs). This is the one place the core writes to
 * stderr: only when the process is dying anyway. Nothing here exits.
 *
 * Registration is for the module that owns the registry (colibri._core._mapguard): each
 * extension module has its own copy of the C library, so the handler and the table live in
 * that one. Up to CB_MAPGUARD_MAX mappings; paths are copied (truncated to 511 bytes).
 */
#ifndef COLIBRI_MAPGUARD_H
#define COLIBRI_MAPGUARD_H

#include <stddef.h>

#include "colibri/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CB_MAPGUARD_MAX 64

/* Install the SIGBUS handler (idempotent). CB_STATUS_INTERNAL if sigaction fails. */
cb_status cb_mapguard_install(void);

/* Register [base, base + len) as a mapping of file `path` (borrowed, copied). *out_id: the
 * slot to unregister with. CB_STATUS_OUT_OF_MEMORY when every slot is taken. */
cb_status cb_mapguard_register(const void *base, size_t len, const char *path, int *out_id);

/* Forget a registration (id from cb_mapguard_register; out of range ids are ignored). */
void cb_mapguard_unregister(int id);

/* How many mappings are registered now (tests). */
int cb_mapguard_count(void);

/* The message the handler writes for a fault at `addr`, into buf (tests; the handler uses
 * the same code). Returns its length, 0 when addr is in no registered mapping. */
size_t cb_mapguard_message(const void *addr, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
