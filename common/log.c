/* stderr logger: formats the whole line first so concurrent threads never interleave. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static enum log_level g_level = LOG_INFO;

void log_set_level(enum log_level level)
{
    g_level = level;
}
enum log_level log_get_level(void)
{
    return g_level;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (level < g_level || level >= LOG_OFF)
        return;
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000L, names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
