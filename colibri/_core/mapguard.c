/* mapguard.c - SIGBUS on a registered file mapping: one line naming the file (mapguard.h).
 *
 * The table is a fixed array of slots; a slot is published by storing `used` = 1 with release
 * order after its fields are written, and read by the handler with acquire order, so the
 * handler never sees a half-written slot. Registration runs under the GIL (one writer at a
 * time); unregistration clears `used` first. The handler uses only async-signal-safe calls
 * (write, sigaction) and formats numbers itself.
 */
#include "colibri/mapguard.h"

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int used;
    uintptr_t base;
    size_t len;
    char path[512];
} slot_t;

static slot_t g_slots[CB_MAPGUARD_MAX];
static struct sigaction g_prev;
static int g_installed;

static size_t put(char *buf, size_t pos, size_t cap, const char *s) {
    while (*s && pos + 1 < cap) buf[pos++] = *s++;
    return pos;
}

static size_t put_u64(char *buf, size_t pos, size_t cap, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < 24);
    while (n > 0 && pos + 1 < cap) buf[pos++] = tmp[--n];
    return pos;
}

size_t cb_mapguard_message(const void *addr, char *buf, size_t cap) {
    uintptr_t a = (uintptr_t)addr;
    if (cap == 0) return 0;
    for (int i = 0; i < CB_MAPGUARD_MAX; i++) {
        slot_t *s = &g_slots[i];
        if (!__atomic_load_n(&s->used, __ATOMIC_ACQUIRE)) continue;
        if (a < s->base || a - s->base >= s->len) continue;
        size_t p = 0;
        p = put(buf, p, cap, "colibri: fatal: bus error (SIGBUS) reading the mapped model file ");
        p = put(buf, p, cap, s->path);
        p = put(buf, p, cap, " at byte ");
        p = put_u64(buf, p, cap, (uint64_t)(a - s->base));
        p = put(buf, p, cap, " of ");
        p = put_u64(buf, p, cap, (uint64_t)s->len);
        p = put(buf, p, cap, ": the file was truncated or rewritten in place while in use "
                             "(a model file is read through its mapping; replace it with a new "
                             "file and a rename, never in place)\n");
        buf[p] = '\0';
        return p;
    }
    buf[0] = '\0';
    return 0;
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    (void)uctx;
    char msg[1024];
    size_t n = info ? cb_mapguard_message(info->si_addr, msg, sizeof msg) : 0;
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, n);
        (void)w;
    }
    /* hand over to what was there before (default: death by SIGBUS; Python's faulthandler:
     * its traceback, then death): a fault repeats on return and meets it; a SIGBUS sent by
     * kill() does not repeat, so it is raised again */
    sigaction(SIGBUS, &g_prev, NULL);
    g_installed = 0;
    if (!info || info->si_code <= 0) raise(sig);
}

cb_status cb_mapguard_install(void) {
    if (g_installed) return CB_OK;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_prev) != 0)
        return cb_fail(CB_STATUS_INTERNAL, "cannot install the SIGBUS handler");
    g_installed = 1;
    return CB_OK;
}

cb_status cb_mapguard_register(const void *base, size_t len, const char *path, int *out_id) {
    if (!base || !path || !out_id)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "mapguard: NULL argument");
    for (int i = 0; i < CB_MAPGUARD_MAX; i++) {
        slot_t *s = &g_slots[i];
        if (__atomic_load_n(&s->used, __ATOMIC_ACQUIRE)) continue;
        s->base = (uintptr_t)base;
        s->len = len;
        size_t n = strlen(path);
        if (n >= sizeof s->path) n = sizeof s->path - 1;
        memcpy(s->path, path, n);
        s->path[n] = '\0';
        __atomic_store_n(&s->used, 1, __ATOMIC_RELEASE);
        *out_id = i;
        return CB_OK;
    }
    return cb_fail(CB_STATUS_OUT_OF_MEMORY, "mapguard: more than %d mapped files", CB_MAPGUARD_MAX);
}

void cb_mapguard_unregister(int id) {
    if (id < 0 || id >= CB_MAPGUARD_MAX) return;
    __atomic_store_n(&g_slots[id].used, 0, __ATOMIC_RELEASE);
}

int cb_mapguard_count(void) {
    int n = 0;
    for (int i = 0; i < CB_MAPGUARD_MAX; i++) n += __atomic_load_n(&g_slots[i].used, __ATOMIC_ACQUIRE);
    return n;
}
