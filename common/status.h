/* Status codes shared by every module: 0 is success, failures are negative.
 * Functions that can fail return int; status_str() names any code for logs and errors. */
#ifndef KVS_COMMON_STATUS_H
#define KVS_COMMON_STATUS_H

#include <stddef.h>

enum kvs_status {
    KVS_OK = 0,
    KVS_ENOMEM = -1,       /* an allocation failed */
    KVS_EINVAL = -2,       /* an argument is out of its documented range */
    KVS_EIO = -3,          /* open/read/mmap failed */
    KVS_ENOSPC = -4,       /* a fixed-size pool (KV blocks, queue) is full */
    KVS_EFORMAT = -5,      /* a file is not what it claims (bad magic, lying counts) */
    KVS_EVERSION = -6,     /* a file format version we do not read */
    KVS_ETRUNC = -7,       /* a file ends before the data it declares */
    KVS_EUNSUPPORTED = -8, /* well-formed but not something we run (tensor type, arch) */
    KVS_ENOKEY = -9,       /* a required metadata key is missing */
    KVS_EKEYTYPE = -10,    /* a metadata key has the wrong type */
    KVS_ENOTFOUND = -11,   /* a lookup found nothing */
    KVS_ECANCELED = -12,   /* the operation was cancelled by its owner */
    KVS_EBUSY = -13,       /* try again later (draining, loading) */
    KVS_ERANGE = -14,      /* a value does not fit (context length, token id) */
};

/* Returns a static, human-readable name for a status code; never NULL. */
const char *status_str(int status);

/* Writes a one-line reason into err (when err and len are non-zero) and returns status, so a
 * failing function can `return status_set_err(err, len, KVS_EFORMAT, "...", ...)`. */
int status_set_err(char *err, size_t len, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
