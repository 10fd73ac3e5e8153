/* Monotonic clock helpers. */
#ifndef KVS_COMMON_TIMEUTIL_H
#define KVS_COMMON_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

/* Seconds on the monotonic clock (for durations, never for wall-clock stamps). */
static inline double time_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
