/* Leak suppressions in LeakSanitizer's file format: one `leak:<pattern>` a
 * line, `#` starts a comment, blank lines ignored. A group of leaks is
 * suppressed when a pattern matches one of its frames' function, source file
 * or object (Python frames: function and file).
 *
 * Owns the process's active set (loaded once under pthread_once, read-only
 * afterwards, so readers need no lock); other sets belong to their caller.
 * Never aborts on a bad file: warns once per bad line and keeps the rest.
 */
#include "suppress.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "options.h"
#include "path.h"

struct shim_suppressions {
    char **patterns;
    size_t n, cap;
};

/* Does `pat[0..plen)` (no '*' inside) occur at `s`? */
static bool seg_at(const char *s, const char *pat, size_t plen)
{
    return strncmp(s, pat, plen) == 0;
}

static const char *seg_find(const char *s, const char *pat, size_t plen)
{
    for (; *s; s++)
        if (seg_at(s, pat, plen))
            return s;
    return plen == 0 ? s : NULL;
}

bool shim_suppress_template_match(const char *pattern, const char *str)
{
    if (!pattern || !str || !pattern[0])
        return false;
    bool start = pattern[0] == '^';
    if (start)
        pattern++;
    size_t plen = strlen(pattern);
    bool end = plen > 0 && pattern[plen - 1] == '$';
    if (end)
        plen--;
    const char *s = str;
    const char *p = pattern, *pend = pattern + plen;
    bool first = true;
    while (p <= pend) {
        const char *star = memchr(p, '*', (size_t)(pend - p));
        size_t seg = star ? (size_t)(star - p) : (size_t)(pend - p);
        bool last = !star;
        if (first && start) {
            if (!seg_at(s, p, seg))
                return false;
            s += seg;
            if (last && end)
                return *s == '\0';
        } else if (last && end) {
            /* The final segment must sit at the very end of what is left. */
            size_t left = strlen(s);
            return left >= seg && memcmp(s + left - seg, p, seg) == 0;
        } else {
            const char *at = seg_find(s, p, seg);
            if (!at)
                return false;
            s = at + seg;
        }
        if (last)
            return true;
        first = false;
        p = star + 1;
    }
    return true;
}

static int add_pattern(shim_suppressions *s, const char *p, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        char **np = realloc(s->patterns, cap * sizeof *np);
        if (!np)
            return -1;
        s->patterns = np;
        s->cap = cap;
    }
    char *c = strndup(p, len);
    if (!c)
        return -1;
    s->patterns[s->n++] = c;
    return 0;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

shim_suppressions *shim_suppressions_parse(const char *text, const char *origin)
{
    shim_suppressions *s = calloc(1, sizeof *s);
    if (!s || !text)
        return s;
    unsigned lineno = 0;
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        const char *eol = nl ? nl : line + strlen(line);
        lineno++;
        const char *b = line, *e = eol;
        while (b < e && is_space(*b))
            b++;
        while (e > b && is_space(e[-1]))
            e--;
        if (b < e && *b != '#') {
            const char *colon = memchr(b, ':', (size_t)(e - b));
            if (colon && colon - b == 4 && memcmp(b, "leak", 4) == 0 && colon + 1 < e) {
                const char *p = colon + 1;
                while (p < e && is_space(*p))
                    p++;
                if (p < e && add_pattern(s, p, (size_t)(e - p)) != 0) {
                    shim_suppressions_free(s);
                    return NULL;
                }
            } else {
                shim_warn("%s:%u: not a suppression (expected leak:<pattern>), ignored",
                          origin ? origin : "suppressions", lineno);
            }
        }
        line = nl ? nl + 1 : eol;
    }
    return s;
}

/* A suppression file is a few lines; anything larger is a mistake (a
 * device, a log file) and must not grow memory at exit. */
#define SUPPRESSIONS_MAX ((size_t)1 << 20)

shim_suppressions *shim_suppressions_load(const char *path)
{
    if (!path || !path[0])
        return calloc(1, sizeof(shim_suppressions));
    /* path.c's policy: a regular file only (a FIFO would hang every
     * leak-checked process at exit), at most SUPPRESSIONS_MAX bytes. */
    size_t len;
    char *text = shim_path_read(path, SUPPRESSIONS_MAX, &len);
    if (!text) {
        int err = errno;
        if (err == EFBIG)
            shim_warn("cannot read suppressions %s: larger than %zu KiB; ignored", path,
                      SUPPRESSIONS_MAX >> 10);
        else
            shim_warn("cannot read suppressions %s: %s", path, shim_path_why(err));
        return calloc(1, sizeof(shim_suppressions));
    }
    shim_suppressions *s = shim_suppressions_parse(text, path);
    free(text);
    return s;
}

void shim_suppressions_free(shim_suppressions *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->patterns[i]);
    free(s->patterns);
    free(s);
}

size_t shim_suppressions_count(const shim_suppressions *s) { return s ? s->n : 0; }

const char *shim_suppressions_pattern(const shim_suppressions *s, size_t i)
{
    return s && i < s->n ? s->patterns[i] : NULL;
}

int shim_suppressions_match(const shim_suppressions *s, const char *const *names, size_t n)
{
    if (!s)
        return -1;
    for (size_t i = 0; i < s->n; i++)
        for (size_t j = 0; j < n; j++)
            if (names[j] && shim_suppress_template_match(s->patterns[i], names[j]))
                return (int)i;
    return -1;
}

static shim_suppressions *g_active;
static pthread_once_t g_active_once = PTHREAD_ONCE_INIT;

static void load_active(void)
{
    /* In secure mode options.c has left the path unset. */
    g_active = shim_suppressions_load(shim_opts()->suppressions);
}

const shim_suppressions *shim_suppressions_active(void)
{
    pthread_once(&g_active_once, load_active);
    return g_active;
}
