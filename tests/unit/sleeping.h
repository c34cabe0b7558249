/* For tests that need another thread to be blocked before they go on: a
 * thread asleep (state S in /proc: a futex wait) has tried its lock. */
#ifndef TEST_SLEEPING_H
#define TEST_SLEEPING_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* Whether thread `tid` of this process sleeps. */
static inline bool thread_sleeping(pid_t tid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'S';
}

#endif
