/* Minimal C test harness: CHECK(cond) records a failure with file and line and continues;
 * TEST_MAIN_END returns non-zero if anything failed. */
#ifndef COLIBRI_TESTUTIL_H
#define COLIBRI_TESTUTIL_H
#include <stdio.h>
#include <stdlib.h>

static int cb_test_failures = 0;
static int cb_test_checks = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        cb_test_checks++;                                                            \
        if (!(cond)) {                                                               \
            cb_test_failures++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define TEST_MAIN_END(name)                                                              \
    do {                                                                                 \
        printf("%s: %d checks, %d failed\n", name, cb_test_checks, cb_test_failures); \
        return cb_test_failures ? 1 : 0;                                                 \
    } while (0)
#endif
