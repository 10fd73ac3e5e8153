/* How much more memory this process can take without swapping or meeting its cgroup's limit:
 * what sizes the KV pool when --kv-cache-mb is left to choose (scheduler/scheduler.c), as
 * llama-server's --fit sizes its context to the device's free memory. */
#ifndef KVS_COMMON_MEMAVAIL_H
#define KVS_COMMON_MEMAVAIL_H

#include <stdint.h>

/* The kernel's MemAvailable (/proc/meminfo: free memory plus the page cache it can drop), or,
 * if smaller, what the cgroup v2 limit (/sys/fs/cgroup/memory.max) leaves above
 * memory.current: a container's limit is the one that kills. 0 if neither can be read. */
uint64_t kvs_mem_available(void);

#endif
