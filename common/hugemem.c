/* Each block is its own mapping: the page before the pointer holds the mapping's start and
 * length for kvs_huge_free. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include "common/hugemem.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_BYTES ((size_t)2 << 20)
#define HEAD_BYTES ((size_t)4096)

void *kvs_huge_alloc(size_t bytes, bool touch)
{
    if (bytes > SIZE_MAX - HUGE_BYTES - HEAD_BYTES)
        return NULL;
    /* room to move the start to a 2 MiB boundary past the head page; the slack is address
     * space only, never touched */
    size_t len = bytes + HUGE_BYTES + HEAD_BYTES;
    uint8_t *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)base + HEAD_BYTES + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1);
    uint8_t *p = (uint8_t *)a;
    size_t head[2] = {(size_t)(uintptr_t)base, len};
    memcpy(p - sizeof head, head, sizeof head);
    if (bytes)
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* refused where THP is off: small pages then */
    /* a write per small page (a read would map the shared zero page); under THP the first
     * write of each 2 MiB faults all of it */
    for (size_t off = 0; touch && off < bytes; off += HEAD_BYTES)
        ((volatile uint8_t *)p)[off] = 0;
    return p;
}

void kvs_huge_free(void *p)
{
    if (!p)
        return;
    size_t head[2];
    memcpy(head, (uint8_t *)p - sizeof head, sizeof head);
    munmap((void *)(uintptr_t)head[0], head[1]);
}
