/* check.h — the unit-test harness: one header, no dependencies.
 *
 * A test file defines test functions with TEST(name) and lists them in main()
 * with RUN(name). Each CHECK records a failure and continues; the binary ends
 * with the line "N passed, N failed" (tests, not checks) and exits non-zero on
 * any failure. scripts/run_unit.sh runs each binary in its own process with a
 * timeout and adds the counts up.
 */
#ifndef DARKSERVE_TESTS_CHECK_H
#define DARKSERVE_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_failed_in_test;
static int check_tests_passed;
static int check_tests_failed;

#define TEST(name) static void name(void)

#define RUN(name)                                                                  \
    do {                                                                           \
        check_failed_in_test = 0;                                                  \
        name();                                                                    \
        if (check_failed_in_test) {                                                \
            check_tests_failed++;                                                  \
            printf("FAIL %s\n", #name);                                            \
        } else {                                                                   \
            check_tests_passed++;                                                  \
        }                                                                          \
        fflush(stdout);                                                            \
    } while (0)

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            check_failed_in_test = 1;                                              \
            printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);     \
        }                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                       \
    do {                                                                           \
        if (!(cond)) {                                                             \
            check_failed_in_test = 1;                                              \
            printf("  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);     \
            printf(__VA_ARGS__);                                                   \
            printf("\n");                                                          \
        }                                                                          \
    } while (0)

#define CHECK_INT_EQ(a, b)                                                         \
    do {                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);            \
        if (check_a_ != check_b_) {                                                \
            check_failed_in_test = 1;                                              \
            printf("  %s:%d: %s == %lld, expected %s == %lld\n", __FILE__,         \
                   __LINE__, #a, check_a_, #b, check_b_);                          \
        }                                                                          \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                         \
    do {                                                                           \
        const char *check_a_ = (a), *check_b_ = (b);                               \
        if (!check_a_ || !check_b_ || strcmp(check_a_, check_b_) != 0) {           \
            check_failed_in_test = 1;                                              \
            printf("  %s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__, \
                   #a, check_a_ ? check_a_ : "(null)",                             \
                   check_b_ ? check_b_ : "(null)");                                \
        }                                                                          \
    } while (0)

/* |a-b| <= tol * max(1, |b|) */
#define CHECK_NEAR(a, b, tol)                                                      \
    do {                                                                           \
        double check_a_ = (double)(a), check_b_ = (double)(b);                     \
        double check_s_ = fabs(check_b_) > 1.0 ? fabs(check_b_) : 1.0;             \
        if (!(fabs(check_a_ - check_b_) <= (tol) * check_s_)) {                    \
            check_failed_in_test = 1;                                              \
            printf("  %s:%d: %s == %.9g, expected %.9g (tol %g)\n", __FILE__,      \
                   __LINE__, #a, check_a_, check_b_, (double)(tol));               \
        }                                                                          \
    } while (0)

#define CHECK_DONE()                                                               \
    (printf("%d passed, %d failed\n", check_tests_passed, check_tests_failed),    \
     check_tests_failed ? 1 : 0)

#endif
