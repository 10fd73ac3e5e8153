#include "common/memavail.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* the first number in file path (a cgroup file holds one; "max" reads as none), or 0 */
static uint64_t read_u64(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    uint64_t v = 0;
    if (fscanf(f, "%" SCNu64, &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

uint64_t kvs_mem_available(void)
{
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            uint64_t kb;
            if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1) {
                avail = kb * 1024;
                break;
            }
        }
        fclose(f);
    }
    uint64_t max = read_u64("/sys/fs/cgroup/memory.max");
    if (max) {
        uint64_t cur = read_u64("/sys/fs/cgroup/memory.current");
        uint64_t left = max > cur ? max - cur : 0;
        if (!avail || left < avail)
            avail = left;
    }
    return avail;
}
