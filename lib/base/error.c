/* error.c - error codes and messages (see error.h). */
#include "error.h"

#include <stdio.h>
#include <string.h>

const char *kvp_strerror(int code)
{
    switch (code) {
    case KVP_OK: return "success";
    case KVP_EIO: return "input/output error";
    case KVP_ENOMEM: return "out of memory";
    case KVP_EFORMAT: return "malformed input";
    case KVP_ETRUNC: return "truncated input";
    case KVP_ECHECKSUM: return "checksum mismatch";
    case KVP_EVERSION: return "unsupported format version";
    case KVP_ELIMIT: return "size exceeds limit";
    case KVP_EUNSUPPORTED: return "unsupported";
    case KVP_EINVAL: return "invalid argument";
    case KVP_ENOTFOUND: return "not found";
    case KVP_EMISMATCH: return "mismatch";
    case KVP_ECOMPRESS: return "compression error";
    case KVP_EPIPE: return "broken pipe";
    case KVP_EINTR: return "interrupted";
    default: return "unknown error";
    }
}

int kvp_err_vset(kvp_err *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int kvp_err_set(kvp_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvp_err_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int kvp_err_prefix(kvp_err *err, const char *fmt, ...)
{
    if (!err)
        return KVP_EINVAL;
    char prefix[KVP_ERR_MSG_MAX], old[KVP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* Truncation is acceptable: a long message loses its tail, never memory. */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3)
        n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, m = strlen(old);
    if (m > room)
        m = room;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
    return err->code;
}

void kvp_err_clear(kvp_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}
