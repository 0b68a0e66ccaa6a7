/* error.h - the one error convention of the kvpipe library.
 *
 * Library functions return 0 (or a count) on success and a negative KVP_E*
 * code on failure, and leave a message in a caller-owned kvp_err that names
 * the file, record or tensor at fault.  The library never prints to stdout,
 * never exits and never aborts on bad input; programs print the message as
 * "prog: message" and exit 1 (2 for usage).
 *
 * There is no global error state: every call that can fail takes a kvp_err.
 */
#ifndef KVP_ERROR_H
#define KVP_ERROR_H

#include <stdarg.h>
#include <stddef.h>

enum kvp_errcode {
    KVP_OK = 0,
    KVP_EIO = -1,        /* read/write/open failed (errno in the message) */
    KVP_ENOMEM = -2,     /* an allocation failed */
    KVP_EFORMAT = -3,    /* input is malformed: bad magic, field out of range */
    KVP_ETRUNC = -4,     /* input ended before a record or field was complete */
    KVP_ECHECKSUM = -5,  /* a checksum did not match */
    KVP_EVERSION = -6,   /* a newer major format version than we read */
    KVP_ELIMIT = -7,     /* a declared size or count exceeds a safety limit */
    KVP_EUNSUPPORTED = -8, /* valid input we do not handle (dtype, arch) */
    KVP_EINVAL = -9,     /* a caller passed an invalid argument */
    KVP_ENOTFOUND = -10, /* a named thing (tensor, key, block) is absent */
    KVP_EMISMATCH = -11, /* inputs disagree (model fingerprint, dtype) */
    KVP_ECOMPRESS = -12, /* zstd failed to compress or decompress */
    KVP_EPIPE = -13,     /* the reader of our output went away */
    KVP_EINTR = -14,     /* a read was interrupted by a stop signal (kvp_in_interrupt_on) */
};

#define KVP_ERR_MSG_MAX 512

typedef struct kvp_err {
    int code;                   /* last KVP_E* code, 0 when none */
    char msg[KVP_ERR_MSG_MAX];  /* "file: record 3 (tensor) at offset 192: ..." */
} kvp_err;

/* A short fixed description of a code ("checksum mismatch"); never NULL. */
const char *kvp_strerror(int code);

/* Record `code` with a printf-style message in err (which may be NULL) and
 * return `code`, so failures read `return kvp_err_set(err, KVP_EIO, ...)`. */
int kvp_err_set(kvp_err *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
__attribute__((format(printf, 3, 0))) int kvp_err_vset(kvp_err *err, int code, const char *fmt, va_list ap);

/* Put "prefix: " in front of the message already in err (adds the context an
 * outer layer knows, such as the file name).  Returns err->code. */
int kvp_err_prefix(kvp_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void kvp_err_clear(kvp_err *err);

#endif
