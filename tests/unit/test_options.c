/* SPYRESHIM_* parsing (shim/base/options.c): every bounded option at
 * min-1, min, max and max+1. The bounds are written here from README's
 * configuration table, not read from options.c's rows, so that a row whose
 * bound drifts (SPYRESHIM_PRESSURE_ROUNDS=0 accepted and disabling the
 * rescue) fails here. Out of range: one warning naming the variable and the
 * default is used. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options.h"

struct bounded {
    const char *name;
    long long min, max;  /* max < 0: no maximum */
    long long def;
    size_t offset;
    int width;           /* sizeof the field: unsigned, int or size_t */
};

#define F(f) offsetof(shim_options, f), (int)sizeof(((shim_options *)0)->f)
static const struct bounded bounded[] = {
    {"SPYRESHIM_ARENAS", 0, 8, 0, F(arenas)},
    {"SPYRESHIM_PRESSURE_ROUNDS", 1, 16, 3, F(pressure_rounds)},
    {"SPYRESHIM_GC_TIMEOUT_MS", 1, 3600000, 2000, F(gc_timeout_ms)},
    {"SPYRESHIM_STACK_DEPTH", 0, 256, 0, F(stack_depth)},    /* 0: automatic (32 or 128) */
    {"SPYRESHIM_EXITCODE", 0, 255, 23, F(exitcode)},
    {"SPYRESHIM_OOM_REPORT", 0, 1000, 10, F(oom_report_top)},
    {"SPYRESHIM_TRACE_FLUSH_MS", 1, 1000, 1000, F(trace_flush_ms)},
    /* At least 1M, or 0 (adaptive); no maximum but the size parser's. */
    {"SPYRESHIM_REGION_SIZE", 1 << 20, -1, 0, F(region_size)},
};
#undef F

static long long field(const shim_options *o, const struct bounded *b)
{
    const char *p = (const char *)o + b->offset;
    if (b->width == sizeof(size_t)) {
        size_t v;
        memcpy(&v, p, sizeof v);
        return (long long)v;
    }
    int v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Parses the environment again with NAME=VALUE set; the warnings printed
 * meanwhile go to err (NUL-terminated). */
static void reload_with(const char *name, const char *text, char *err, size_t cap)
{
    setenv(name, text, 1);
    char path[] = "/tmp/opts-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    shim_options_reload();
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, err, cap - 1, 0);
    err[n > 0 ? n : 0] = '\0';
    close(fd);
    unsetenv(name);
}

/* The value a bounded option took from NAME=VALUE, and whether a warning
 * naming NAME was printed. */
static long long parse_text(const struct bounded *b, const char *text, bool *warned)
{
    char err[4096];
    reload_with(b->name, text, err, sizeof err);
    *warned = strstr(err, b->name) && strstr(err, "invalid");
    return field(shim_opts(), b);
}

static long long parse_with(const struct bounded *b, long long value, bool *warned)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", value);
    return parse_text(b, text, warned);
}

static void expect(const struct bounded *b, long long value, bool accepted)
{
    bool warned;
    long long got = parse_with(b, value, &warned);
    if (accepted) {
        cr_expect_eq(got, value, "%s=%lld must be accepted, got %lld", b->name, value, got);
        cr_expect_not(warned, "%s=%lld is in range: no warning", b->name, value);
    } else {
        cr_expect_eq(got, b->def, "%s=%lld is out of range: the default %lld, got %lld",
                     b->name, value, b->def, got);
        cr_expect(warned, "%s=%lld is out of range: one warning naming it", b->name, value);
    }
}

TestSuite(options, .init = NULL);

Test(options, every_bounded_option_at_its_minimum_and_one_below)
{
    unsetenv("SPYRESHIM_LOG");
    for (size_t i = 0; i < sizeof bounded / sizeof bounded[0]; i++) {
        const struct bounded *b = &bounded[i];
        expect(b, b->min, true);
        /* 0 is the one value below a size's minimum that is allowed. */
        if (b->min - 1 >= 0 && !(b->width == sizeof(size_t) && b->min - 1 == 0))
            expect(b, b->min - 1, false);
    }
}

Test(options, every_bounded_option_at_its_maximum_and_one_above)
{
    unsetenv("SPYRESHIM_LOG");
    for (size_t i = 0; i < sizeof bounded / sizeof bounded[0]; i++) {
        const struct bounded *b = &bounded[i];
        if (b->max < 0)
            continue;
        expect(b, b->max, true);
        expect(b, b->max + 1, false);
    }
}

Test(options, negative_values_are_refused)
{
    unsetenv("SPYRESHIM_LOG");
    for (size_t i = 0; i < sizeof bounded / sizeof bounded[0]; i++)
        expect(&bounded[i], -1, false);
}

Test(options, a_region_size_of_zero_is_adaptive_and_below_one_mebibyte_refused)
{
    const struct bounded *b = &bounded[sizeof bounded / sizeof bounded[0] - 1];
    cr_assert_str_eq(b->name, "SPYRESHIM_REGION_SIZE");
    expect(b, 0, true);
    expect(b, 1, false);
    expect(b, (1 << 20) - 1, false);
}

Test(options, zero_pressure_rounds_does_not_disable_the_rescue)
{
    /* The survivor named in issue 25: with 0 accepted, no pressure event
     * would ever run. */
    setenv("SPYRESHIM_PRESSURE_ROUNDS", "0", 1);
    int devnull = open("/dev/null", O_WRONLY);
    int saved = dup(STDERR_FILENO);
    dup2(devnull, STDERR_FILENO);
    shim_options_reload();
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(devnull);
    unsetenv("SPYRESHIM_PRESSURE_ROUNDS");
    cr_assert_geq(shim_opts()->pressure_rounds, 1);
    cr_assert_eq(shim_opts()->pressure_rounds, 3);
}

/* SPYRESHIM_GC=VALUE parsed: the mode, and whether one warning was printed. */
static unsigned gc_mode_of(const char *value, bool *warned)
{
    char err[4096];
    reload_with("SPYRESHIM_GC", value, err, sizeof err);
    *warned = strstr(err, "SPYRESHIM_GC=") && strstr(err, "using the default auto");
    return shim_opts()->gc_mode;
}

Test(options, gc_modes_and_the_old_boolean_values)
{
    static const struct { const char *v; unsigned mode; } ok[] = {
        {"auto", SHIM_GC_MODE_AUTO}, {"inline", SHIM_GC_MODE_INLINE},
        {"THREAD", SHIM_GC_MODE_THREAD}, {"off", SHIM_GC_MODE_OFF},
        {"1", SHIM_GC_MODE_AUTO}, {"0", SHIM_GC_MODE_OFF}, {"no", SHIM_GC_MODE_OFF},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        bool warned;
        cr_expect_eq(gc_mode_of(ok[i].v, &warned), ok[i].mode, "SPYRESHIM_GC=%s", ok[i].v);
        cr_expect_not(warned, "SPYRESHIM_GC=%s: no warning", ok[i].v);
        cr_expect_eq(shim_opts()->gc, ok[i].mode != SHIM_GC_MODE_OFF, "SPYRESHIM_GC=%s", ok[i].v);
    }
    bool warned;
    cr_expect_eq(gc_mode_of("sometimes", &warned), SHIM_GC_MODE_AUTO);
    cr_expect(warned, "a bad mode: one warning naming the default");
    cr_expect(shim_opts()->gc);
}

/* Integers take the shape a size takes: digits, after spaces. A '+', "-0",
 * a leading tab or newline are refused by both (strtoll alone took them). */
Test(options, integers_and_sizes_refuse_the_same_odd_forms)
{
    unsetenv("SPYRESHIM_LOG");
    static const char *odd[] = {"+5", "-0", "\t5", "\n5", "5 ", "0x5", ""};
    const struct bounded *in = &bounded[2];      /* SPYRESHIM_GC_TIMEOUT_MS */
    const struct bounded *sz = &bounded[sizeof bounded / sizeof bounded[0] - 1];
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        bool warned;
        cr_expect_eq(parse_text(in, odd[i], &warned), in->def, "%s=\"%s\"", in->name, odd[i]);
        cr_expect(warned || !odd[i][0], "%s=\"%s\": one warning", in->name, odd[i]);
        cr_expect_eq(parse_text(sz, odd[i], &warned), sz->def, "%s=\"%s\"", sz->name, odd[i]);
    }
    bool warned;
    cr_expect_eq(parse_text(in, "  5", &warned), 5, "leading spaces, as a size's");
    cr_expect_not(warned);
}
