/* Names for status codes, and the one-line reasons failing loaders write. */
#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>

const char *status_str(int status)
{
    switch (status) {
    case KVS_OK: return "ok";
    case KVS_ENOMEM: return "out of memory";
    case KVS_EINVAL: return "invalid argument";
    case KVS_EIO: return "i/o error";
    case KVS_ENOSPC: return "no space left in pool";
    case KVS_EFORMAT: return "malformed file";
    case KVS_EVERSION: return "unsupported format version";
    case KVS_ETRUNC: return "file truncated";
    case KVS_EUNSUPPORTED: return "unsupported";
    case KVS_ENOKEY: return "missing key";
    case KVS_EKEYTYPE: return "key has wrong type";
    case KVS_ENOTFOUND: return "not found";
    case KVS_ECANCELED: return "cancelled";
    case KVS_EBUSY: return "busy";
    case KVS_ERANGE: return "out of range";
    }
    return "unknown status";
}

int status_set_err(char *err, size_t len, int status, const char *fmt, ...)
{
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return status;
}
