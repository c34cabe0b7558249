/* Leak suppressions (shim/suppress.c): LeakSanitizer's format and matching. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "suppress.h"

#define M(p, s) shim_suppress_template_match(p, s)

Test(suppress, substring_by_default)
{
    cr_assert(M("leak_a", "my_leak_a_fn"));
    cr_assert(M("leak_a", "leak_a"));
    cr_assert_not(M("leak_a", "leak_b"));
    cr_assert_not(M("leak_a", ""));
    cr_assert_not(M("", "anything"), "an empty pattern matches nothing");
}

Test(suppress, anchors)
{
    cr_assert(M("^leak", "leak_a"));
    cr_assert_not(M("^leak", "my_leak"));
    cr_assert(M("_a$", "leak_a"));
    cr_assert_not(M("_a$", "leak_a_b"));
    cr_assert(M("^leak_a$", "leak_a"));
    cr_assert_not(M("^leak_a$", "leak_ab"));
    cr_assert_not(M("^leak_a$", "xleak_a"));
}

Test(suppress, wildcards)
{
    cr_assert(M("lib*.so", "/usr/lib/libfoo.so.1"));
    cr_assert(M("^/usr/*/libfoo*", "/usr/lib/libfoo.so.1"));
    cr_assert_not(M("^/opt/*/libfoo*", "/usr/lib/libfoo.so.1"));
    cr_assert(M("a*b*c", "xxaYYbZZcxx"));
    cr_assert_not(M("a*b*c", "xxcYYbZZaxx"), "segments match in order");
    cr_assert(M("^a*c$", "abc"));
    cr_assert_not(M("^a*c$", "abcd"));
    cr_assert(M("*", "x"));
    cr_assert(M("^*$", ""));
}

Test(suppress, parses_leak_lines_comments_and_blanks)
{
    shim_suppressions *s = shim_suppressions_parse(
        "# a comment\n"
        "\n"
        "leak:first\n"
        "   leak:  second  \r\n"
        "race:not_ours\n"
        "leak:\n"
        "leak:third",
        "test");
    cr_assert_not_null(s);
    cr_assert_eq(shim_suppressions_count(s), 3);
    cr_assert_str_eq(shim_suppressions_pattern(s, 0), "first");
    cr_assert_str_eq(shim_suppressions_pattern(s, 1), "second");
    cr_assert_str_eq(shim_suppressions_pattern(s, 2), "third");
    const char *names[] = {NULL, "x_second_y", "first"};
    cr_assert_eq(shim_suppressions_match(s, names, 3), 0, "the first pattern wins");
    const char *other[] = {"nothing", NULL};
    cr_assert_eq(shim_suppressions_match(s, other, 2), -1);
    shim_suppressions_free(s);
}

Test(suppress, missing_file_is_an_empty_set)
{
    shim_suppressions *s = shim_suppressions_load("/nonexistent/supp.txt");
    cr_assert_not_null(s);
    cr_assert_eq(shim_suppressions_count(s), 0);
    shim_suppressions_free(s);
}

Test(suppress, loads_a_file)
{
    char path[] = "/tmp/supp-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char text[] = "leak:^alpha$\n#leak:beta\nleak:gam*ma\n";
    cr_assert_eq(write(fd, text, sizeof text - 1), (ssize_t)sizeof text - 1);
    close(fd);
    shim_suppressions *s = shim_suppressions_load(path);
    unlink(path);
    cr_assert_eq(shim_suppressions_count(s), 2);
    const char *a[] = {"alpha"}, *b[] = {"beta"}, *g[] = {"gamXma"};
    cr_assert_eq(shim_suppressions_match(s, a, 1), 0);
    cr_assert_eq(shim_suppressions_match(s, b, 1), -1);
    cr_assert_eq(shim_suppressions_match(s, g, 1), 1);
    shim_suppressions_free(s);
}
