/* Memory for the big arrays that live as long as the model or the server: the repacked weights
 * and the KV cache's arenas. Anonymous pages starting on a 2 MiB boundary, advised as
 * transparent huge pages (MADV_HUGEPAGE: Debian's kernels give them only on request). The
 * kernels stream these arrays, so one TLB entry covers 2 MiB instead of 4 KiB, and a first
 * touch faults 2 MiB at once instead of 512 pages one by one (filling a fresh 256 MiB KV arena
 * was 4-5 % of a 16-client 110m benchmark in page faults). Where the kernel has no huge pages
 * to give, the same memory in small pages. */
#ifndef KVS_COMMON_HUGEMEM_H
#define KVS_COMMON_HUGEMEM_H

#include <stdbool.h>
#include <stddef.h>

/* bytes of zeroed memory, aligned to 2 MiB, or NULL; with touch, every page faulted in now
 * (written), not on first use */
void *kvs_huge_alloc(size_t bytes, bool touch);
/* p from kvs_huge_alloc, or NULL */
void kvs_huge_free(void *p);

#endif
