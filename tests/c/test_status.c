/* status.h: names, the thread-local detail, truncation of long details. */
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/status.h"
#include "testutil.h"

int main(void) {
    CHECK(strcmp(cb_status_str(CB_OK), "ok") == 0);
    CHECK(strcmp(cb_status_str(CB_STATUS_OUT_OF_MEMORY), "out of memory") == 0);
    CHECK(strcmp(cb_status_str(CB_STATUS_NOT_FINITE), "non-finite values") == 0);
    CHECK(strcmp(cb_status_str((cb_status)-99), "unknown status") == 0);
    CHECK(strcmp(cb_last_error(), "") == 0);
    CHECK(cb_fail(CB_STATUS_INVALID_ARGUMENT, "size %d", 7) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(strcmp(cb_last_error(), "size 7") == 0);
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    cb_fail(CB_STATUS_IO, "%s", big);
    CHECK(strlen(cb_last_error()) == 511);
    cb_clear_error();
    CHECK(cb_last_error()[0] == 0);
    cb_simd_level d = cb_cpu_detect();
    CHECK(cb_cpu_level() == d);
    cb_cpu_set_max_level(CB_SIMD_SCALAR);
    CHECK(cb_cpu_level() == CB_SIMD_SCALAR);
    cb_cpu_set_max_level(CB_SIMD_AVX512_VNNI);
    CHECK(cb_cpu_level() == d);
    TEST_MAIN_END("test_status");
}
