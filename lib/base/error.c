/* error.c - error codes and messages (see error.h). */
#include "error.h"
#include "unicode.h"

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

size_t kvp_err_escape_char(const char *s, size_t n, int quote, char out[KVP_ERR_ESCAPE_MAX], size_t *out_len)
{
    unsigned c = (unsigned char)s[0];
    uint32_t cp;
    size_t len = kvp_unicode_decode(s, n, &cp);
    if (cp == KVP_UNICODE_BAD || c < 0x20 || c == 0x7f) {
        static const char hex[] = "0123456789abcdef";
        const char *named = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
        if (named) {
            memcpy(out, named, 2);
            *out_len = 2;
        } else {
            out[0] = '\\', out[1] = 'x', out[2] = hex[c >> 4], out[3] = hex[c & 15];
            *out_len = 4;
        }
        return 1;
    }
    if (c == '\\' || (quote && c == (unsigned)quote)) {
        out[0] = '\\', out[1] = (char)c;
        *out_len = 2;
        return 1;
    }
    memcpy(out, s, len); /* a character of 1 to 4 bytes */
    *out_len = len;
    return len;
}

const char *kvp_err_escape(char *buf, size_t size, const char *s, int quote)
{
    /* a message's room is KVP_ERR_MSG_MAX: an id of 255 newlines (1,020
     * bytes escaped) would push out what the message is there to say */
    size_t n = strlen(s), o = 0, room = size - 1 < KVP_ERR_SHOWN_MAX ? size - 1 : KVP_ERR_SHOWN_MAX;
    size_t cut = room >= 4 ? room - 3 : room; /* where "..." goes when it does not all fit */
    size_t at_cut = 0, i = 0;
    while (i < n) {
        char e[KVP_ERR_ESCAPE_MAX];
        size_t el;
        size_t took = kvp_err_escape_char(s + i, n - i, quote, e, &el);
        if (o + el > room)
            break;
        memcpy(buf + o, e, el);
        o += el;
        i += took;
        if (o <= cut)
            at_cut = o;
    }
    if (i < n && room >= 4) { /* cut short: said, at a whole escape */
        memcpy(buf + at_cut, "...", 3);
        o = at_cut + 3;
    } else if (i < n) {
        o = at_cut;
    }
    buf[o] = 0;
    return buf;
}
