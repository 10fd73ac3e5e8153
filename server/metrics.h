/* Prometheus text exposition (format 0.0.4) of the scheduler's metrics plus the server's own
 * request counter. Names are prefixed kvserve_, contain no colons, every family has # HELP
 * and # TYPE, and histogram buckets are cumulative with a final le="+Inf". */
#ifndef KVS_SERVER_METRICS_H
#define KVS_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "scheduler/scheduler.h"

/* HTTP statuses the server counts separately; any other lands in "other". */
#define SRV_N_STATUS 11
extern const int srv_status_codes[SRV_N_STATUS]; /* last entry 0 = other */
int srv_status_index(int status);

/* Returns a malloc'd exposition text (NULL on OOM). requests[i] counts responses with status
 * srv_status_codes[i]. m may be NULL (not loaded yet): only the request counter is written.
 * kernels (the engine's kernel table, "avx2" / "generic") labels kvserve_build_info; NULL
 * writes none. */
char *srv_metrics_format(const sched_metrics *m, const uint64_t requests[SRV_N_STATUS],
                         const char *kernels);

#endif
