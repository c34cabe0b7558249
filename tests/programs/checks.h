/* Named checks for the CUDA test programs (cuda_checks, cuda_async,
 * cuda_passthrough): each argument names a check, each check prints
 * "NAME ok" or "NAME FAIL: why (line N)", and the exit status is the number
 * of failures. One copy of the runner so the programs report alike (the
 * integration tests read those lines). Test code only: never in the product. */
#ifndef SPYRESHIM_TEST_CHECKS_H
#define SPYRESHIM_TEST_CHECKS_H

#include <stdio.h>
#include <string.h>

static int failures;
static const char *check_name;

/* A failed condition ends the check (the function returns). */
#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            printf("%s FAIL: ", check_name);              \
            printf(__VA_ARGS__);                          \
            printf(" (line %d)\n", __LINE__);             \
            failures++;                                   \
            return;                                       \
        }                                                 \
    } while (0)

struct named_check {
    const char *name;
    void (*fn)(void);
};

/* Runs the checks argv names, in order; an unknown name is a failure. */
static int run_checks(int argc, char **argv, const struct named_check *checks, size_t n)
{
    for (int i = 1; i < argc; i++) {
        size_t k = 0;
        while (k < n && strcmp(checks[k].name, argv[i]) != 0)
            k++;
        if (k == n) {
            printf("%s: unknown check\n", argv[i]);
            failures++;
            continue;
        }
        check_name = argv[i];
        checks[k].fn();
    }
    fflush(stdout);
    return failures;
}

#endif
