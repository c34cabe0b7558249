/* Leak reports (shim/report.c): grouping, order, totals, suppressions, and
 * the text and JSON forms, from synthetic allocations whose stacks point
 * into known functions of this file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report.h"
#include "stack.h"

__attribute__((noinline)) static uintptr_t return_address(void)
{
    return (uintptr_t)__builtin_return_address(0);
}

/* Each returns an address inside itself, as a captured stack would hold. */
__attribute__((noinline)) uintptr_t alpha_site(void)
{
    uintptr_t r = return_address();
    __asm__ volatile("" ::: "memory");
    return r;
}

__attribute__((noinline)) uintptr_t beta_site(void)
{
    uintptr_t r = return_address();
    __asm__ volatile("" ::: "memory");
    return r;
}

static spyreshim_alloc_info allocs[8];
static size_t nallocs;

static void add(size_t size, uint32_t native, const char *runtime)
{
    size_t i = nallocs++;
    allocs[i] = (spyreshim_alloc_info){
        .ptr = 0x100000 + i * 0x1000, .size = size, .seq = i + 1,
        .native_stack = native, .runtime = runtime};
}

static uint32_t stack_a, stack_b;

static void setup(void)
{
    uintptr_t outer = return_address();          /* somewhere in setup() */
    uintptr_t a[] = {alpha_site(), outer};
    uintptr_t b[] = {beta_site(), outer};
    stack_a = shim_stack_intern(a, 2);
    stack_b = shim_stack_intern(b, 2);
    nallocs = 0;
    add(100, stack_a, "simdev");
    add(100, stack_a, "simdev");
    add(100, stack_a, "simdev");
    add(1000, stack_b, "simdev");
    add(50, 0, "simdev");
    add(50, 0, "simdev");
    add(10, stack_a, "cuda");
}

TestSuite(report, .init = setup);

Test(report, groups_by_runtime_and_stack_largest_first)
{
    shim_report *r = shim_report_build(allocs, nallocs, NULL);
    cr_assert_not_null(r);
    cr_assert_eq(shim_report_ngroups(r), 4);
    const shim_report_group *g0 = shim_report_group_at(r, 0), *g1 = shim_report_group_at(r, 1),
                            *g2 = shim_report_group_at(r, 2), *g3 = shim_report_group_at(r, 3);
    cr_assert_eq(g0->bytes, 1000);
    cr_assert_eq(g0->count, 1);
    cr_assert_eq(g0->native_stack, stack_b);
    cr_assert_eq(g1->bytes, 300);
    cr_assert_eq(g1->count, 3);
    cr_assert_str_eq(g1->runtime, "simdev");
    cr_assert_eq(g2->bytes, 100);
    cr_assert_eq(g2->nframes, 0, "no stack recorded");
    cr_assert_eq(g3->bytes, 10);
    cr_assert_str_eq(g3->runtime, "cuda");
    cr_assert_null(shim_report_group_at(r, 4));
    cr_assert_eq(g1->nframes, 2);
    cr_assert_not(g1->frames[0].python);
    cr_assert_str_eq(g1->frames[0].function, "alpha_site");
    cr_assert(g1->frames[0].file && strstr(g1->frames[0].file, "test_report.c"));
    cr_assert_str_eq(g0->frames[0].function, "beta_site");
    cr_assert_str_eq(g0->frames[1].function, "setup");
    uint64_t lb, lc, sb, sc;
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    cr_assert_eq(lb, 1410);
    cr_assert_eq(lc, 7);
    cr_assert_eq(sb, 0);
    cr_assert_eq(sc, 0);
    shim_report_free(r);
}

Test(report, suppressions_silence_exactly_their_groups)
{
    shim_suppressions *sup = shim_suppressions_parse("leak:^beta_site$\n", "test");
    shim_report *r = shim_report_build(allocs, nallocs, sup);
    cr_assert_eq(shim_report_group_at(r, 0)->suppression, 0);
    for (size_t i = 1; i < shim_report_ngroups(r); i++)
        cr_assert_eq(shim_report_group_at(r, i)->suppression, -1, "group %zu", i);
    uint64_t lb, lc, sb, sc;
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    cr_assert_eq(lb, 410);
    cr_assert_eq(lc, 6);
    cr_assert_eq(sb, 1000);
    cr_assert_eq(sc, 1);
    shim_report_free(r);
    shim_suppressions_free(sup);

    /* A file name matches too: both stacks live in this file. */
    sup = shim_suppressions_parse("leak:test_report.c\n", "test");
    r = shim_report_build(allocs, nallocs, sup);
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    cr_assert_eq(lb, 100, "only the group without a stack is left");
    cr_assert_eq(sc, 5);
    shim_report_free(r);
    shim_suppressions_free(sup);
}

/* An object pattern (`leak:libfoo.so`, here the test program's own file):
 * a frame's object is matched, not only its function and source file. The
 * pattern is anchored at the end so that it matches neither "test_report.c"
 * nor a function name. */
Test(report, suppressions_match_a_frames_object)
{
    shim_report *r = shim_report_build(allocs, nallocs, NULL);
    const shim_report_group *g = shim_report_group_at(r, 0);
    cr_assert_geq(g->nframes, 1);
    const char *object = g->frames[0].object;
    cr_assert(object && strstr(object, "test_report"), "object %s", object ? object : "(none)");
    cr_assert_eq(strstr(object, "test_report.c"), NULL);
    shim_report_free(r);

    shim_suppressions *sup = shim_suppressions_parse("leak:/test_report$\n", "test");
    r = shim_report_build(allocs, nallocs, sup);
    uint64_t lb, lc, sb, sc;
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    cr_assert_eq(sb, 1310, "every group with a stack is in the test program's object");
    cr_assert_eq(sc, 5);
    cr_assert_eq(lb, 100, "only the group without a stack is left");
    shim_report_free(r);
    shim_suppressions_free(sup);

    /* An object that holds none of the frames suppresses nothing. */
    sup = shim_suppressions_parse("leak:libfoo.so\n", "test");
    r = shim_report_build(allocs, nallocs, sup);
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    cr_assert_eq(sb, 0);
    shim_report_free(r);
    shim_suppressions_free(sup);
}

/* The `^` anchor in a report: a pattern anchored at the start of a function
 * name suppresses that function and not one that merely contains it. */
Test(report, an_anchored_suppression_matches_names_that_start_with_it)
{
    shim_suppressions *sup = shim_suppressions_parse("leak:^lpha_site\nleak:^beta_sit\n", "test");
    shim_report *r = shim_report_build(allocs, nallocs, sup);
    cr_assert_eq(shim_report_group_at(r, 0)->suppression, 1, "beta_site starts with beta_sit");
    for (size_t i = 1; i < shim_report_ngroups(r); i++)
        cr_assert_eq(shim_report_group_at(r, i)->suppression, -1,
                     "group %zu: alpha_site contains lpha_site but does not start with it", i);
    shim_report_free(r);
    shim_suppressions_free(sup);
}

static char *print_to_string(const shim_report *r, enum shim_report_kind kind, size_t max)
{
    FILE *f = tmpfile();
    cr_assert_eq(shim_report_print(r, fileno(f), kind, "HEADLINE", max), 0);
    long n = lseek(fileno(f), 0, SEEK_END);
    char *buf = calloc(1, (size_t)n + 1);
    cr_assert_eq(pread(fileno(f), buf, (size_t)n, 0), n);
    fclose(f);
    return buf;
}

Test(report, text_names_functions_sizes_and_counts)
{
    shim_suppressions *sup = shim_suppressions_parse("leak:beta_site\n", "test");
    shim_report *r = shim_report_build(allocs, nallocs, sup);
    char *t = print_to_string(r, SHIM_REPORT_LEAKS, 0);
    cr_assert(strstr(t, "HEADLINE"), "%s", t);
    cr_assert(strstr(t, "Leak of 300 B in 3 allocation(s) of simdev memory"), "%s", t);
    cr_assert(strstr(t, "Leak of 10 B in 1 allocation(s) of cuda memory"), "%s", t);
    cr_assert(strstr(t, " in alpha_site "), "%s", t);
    cr_assert(strstr(t, "test_report.c:"), "%s", t);
    cr_assert_null(strstr(t, "Leak of 1000"), "suppressed groups are not listed: %s", t);
    /* Counted in one line, as `spyreshim report` counts them, each pattern's
     * allocations in brackets. */
    cr_assert(strstr(t, "\nSuppressed: 1000 B in 1 allocation(s) matched suppressions "
                        "(beta_site: 1).\n"), "%s", t);
    cr_assert_null(strstr(t, "Suppressions used:"), "%s", t);
    cr_assert(strstr(t, "SUMMARY: spyreshim: 410 B leaked in 6 allocation(s)."), "%s", t);
    free(t);
    shim_report_free(r);
    shim_suppressions_free(sup);
}

Test(report, text_top_groups_only)
{
    shim_report *r = shim_report_build(allocs, nallocs, NULL);
    char *t = print_to_string(r, SHIM_REPORT_LIVE, 2);
    cr_assert(strstr(t, "Live: 1000 B"), "%s", t);
    cr_assert(strstr(t, "Live: 300 B"), "%s", t);
    cr_assert_null(strstr(t, "Live: 100 B"), "%s", t);
    cr_assert(strstr(t, "... and 2 more group(s): 110 B in 3 allocation(s)"), "%s", t);
    cr_assert(strstr(t, "SUMMARY: spyreshim: 1410 B (1.4 KiB) live in 7 allocation(s)."), "%s", t);
    free(t);
    shim_report_free(r);
}

Test(report, json_is_well_formed_and_complete)
{
    shim_suppressions *sup = shim_suppressions_parse("leak:beta_site\n", "test");
    shim_report *r = shim_report_build(allocs, nallocs, sup);
    char path[] = "/tmp/report-json-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    cr_assert_eq(shim_report_write_json(r, f, "exit"), 0);
    fclose(f);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
             "g=d[\"groups\"]; "
             "assert d[\"format\"]==\"spyreshim-report\" and d[\"version\"]==1 and d[\"reason\"]==\"exit\"; "
             "assert (d[\"live_bytes\"],d[\"live_allocations\"],d[\"suppressed_bytes\"],d[\"suppressed_allocations\"])==(410,6,1000,1); "
             "assert [x[\"bytes\"] for x in g]==[1000,300,100,10] and g[0][\"suppressed\"] and not g[1][\"suppressed\"]; "
             "assert g[1][\"frames\"][0][\"function\"]==\"alpha_site\" and g[1][\"frames\"][0][\"kind\"]==\"native\"; "
             "assert g[1][\"frames\"][0][\"line\"]>0 and g[1][\"frames\"][0][\"offset\"].startswith(\"0x\"); "
             "assert g[2][\"frames\"]==[]' %s",
             path);
    int rc = system(cmd);
    unlink(path);
    cr_assert_eq(rc, 0, "the JSON must parse and hold the groups");
    shim_report_free(r);
    shim_suppressions_free(sup);
}

Test(report, empty_report)
{
    shim_report *r = shim_report_build(NULL, 0, NULL);
    cr_assert_not_null(r);
    cr_assert_eq(shim_report_ngroups(r), 0);
    FILE *f = tmpfile();
    cr_assert_eq(shim_report_write_json(r, f, "snapshot"), 0);
    fclose(f);
    shim_report_free(r);
}
