/* mapguard.h: registration, the message for an address inside / outside a mapping, slots
 * reused after unregistering, the table limit, a long path truncated. (The handler itself is
 * exercised by tests/core/test_mapguard.py in a subprocess: a real SIGBUS.) */
#include <string.h>

#include "colibri/mapguard.h"
#include "testutil.h"

int main(void) {
    static char region[8192];
    char buf[1024];
    int id = -1;
    CHECK(cb_mapguard_install() == CB_OK);
    CHECK(cb_mapguard_install() == CB_OK); /* idempotent */
    CHECK(cb_mapguard_count() == 0);
    CHECK(cb_mapguard_register(region, 4096, "/models/m.gguf", &id) == CB_OK);
    CHECK(cb_mapguard_count() == 1);
    size_t n = cb_mapguard_message(region + 1234, buf, sizeof buf);
    CHECK(n == strlen(buf) && n > 0);
    CHECK(strstr(buf, "mapped model file /models/m.gguf at byte 1234 of 4096: ") != NULL);
    CHECK(buf[n - 1] == '\n');
    CHECK(cb_mapguard_message(region + 4096, buf, sizeof buf) == 0 && buf[0] == 0);
    CHECK(cb_mapguard_message(region - 1, buf, sizeof buf) == 0);
    /* a small buffer: truncated, still terminated */
    CHECK(cb_mapguard_message(region, buf, 16) == 15 && buf[15] == 0);
    cb_mapguard_unregister(id);
    CHECK(cb_mapguard_count() == 0);
    CHECK(cb_mapguard_message(region + 1, buf, sizeof buf) == 0);
    cb_mapguard_unregister(-1);
    cb_mapguard_unregister(CB_MAPGUARD_MAX);
    /* fill the table: the next registration is refused */
    int ids[CB_MAPGUARD_MAX];
    for (int i = 0; i < CB_MAPGUARD_MAX; i++)
        CHECK(cb_mapguard_register(region + i, 1, "x", &ids[i]) == CB_OK);
    CHECK(cb_mapguard_register(region, 1, "y", &id) == CB_STATUS_OUT_OF_MEMORY);
    for (int i = 0; i < CB_MAPGUARD_MAX; i++) cb_mapguard_unregister(ids[i]);
    CHECK(cb_mapguard_count() == 0);
    char longpath[2000];
    memset(longpath, 'p', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = 0;
    CHECK(cb_mapguard_register(region, 10, longpath, &id) == CB_OK);
    n = cb_mapguard_message(region, buf, sizeof buf);
    CHECK(n > 511 && strstr(buf, " at byte 0 of 10") != NULL);
    cb_mapguard_unregister(id);
    CHECK(cb_mapguard_register(NULL, 1, "x", &id) == CB_STATUS_INVALID_ARGUMENT);
    TEST_MAIN_END("test_mapguard");
}
