/* promptsonce.c - a prompts file read more than once (see promptsonce.h). */
#include "promptsonce.h"
#include "cli.h"
#include "io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Append in's bytes to fd, at most max in all: 0, or KVP_EINTR when a
 * stop signal ended the read (kvp_in_interrupt_on); dies naming the file
 * when it cannot. */
static int copy_prompts(kvp_in *in, int fd, const char *file, uint64_t max, const char *why)
{
    enum { CHUNK = 1 << 16 };
    char *buf = malloc(CHUNK);
    uint64_t total = 0;
    kvp_err err = {0};
    if (!buf)
        kvp_cli_die("out of memory");
    for (;;) {
        int64_t n = kvp_in_read(in, buf, CHUNK, &err);
        if (n < 0 && err.code == KVP_EINTR)
            break;
        if (n < 0)
            kvp_cli_die_err(&err);
        if (n == 0)
            break;
        if ((total += (uint64_t)n) > max)
            kvp_cli_die("%s: over %llu MiB of prompts: %s", file, (unsigned long long)(max >> 20), why);
        for (int64_t at = 0; at < n;) {
            ssize_t w = write(fd, buf + at, (size_t)(n - at));
            if (w < 0 && errno != EINTR)
                kvp_cli_die("%s: holding the prompts in memory: %s", file, strerror(errno));
            at += w > 0 ? w : 0;
        }
    }
    free(buf);
    return err.code == KVP_EINTR ? KVP_EINTR : 0;
}

int kvp_prompts_once_open(kvp_prompts_once *pc, const char *file, int copy_regular, uint64_t max, const char *why)
{
    pc->fd = -1;
    pc->file = file;
    struct stat st;
    if (!copy_regular && strcmp(file, "-") != 0 && stat(file, &st) == 0 && S_ISREG(st.st_mode))
        return 0;
    kvp_in in;
    kvp_err err = {0};
    int rc = kvp_in_open(&in, file, &err); /* a FIFO waits here for its writer */
    if (rc == KVP_EINTR)
        return rc;
    if (rc < 0)
        kvp_cli_die_err(&err);
    if ((pc->fd = memfd_create("kvp-prompts", MFD_CLOEXEC)) < 0)
        kvp_cli_die("%s: holding the prompts in memory: %s", file, strerror(errno));
    rc = copy_prompts(&in, pc->fd, file, max, why);
    kvp_in_close(&in);
    if (rc < 0) { /* the part read is no job: dropped */
        kvp_prompts_once_close(pc);
        return rc;
    }
    snprintf(pc->path, sizeof pc->path, "/proc/self/fd/%d", pc->fd);
    return 0;
}

const char *kvp_prompts_once_path(const kvp_prompts_once *pc) { return pc->fd >= 0 ? pc->path : pc->file; }

void kvp_prompts_once_name(const kvp_prompts_once *pc, kvp_err *err)
{
    if (pc->fd < 0)
        return;
    char out[sizeof err->msg];
    size_t n = 0, lp = strlen(pc->path), lf = strlen(pc->file);
    for (const char *m = err->msg; *m && n + 1 < sizeof out;) {
        if (strncmp(m, pc->path, lp) == 0) {
            size_t k = lf < sizeof out - 1 - n ? lf : sizeof out - 1 - n;
            memcpy(out + n, pc->file, k);
            n += k;
            m += lp;
        } else {
            out[n++] = *m++;
        }
    }
    out[n] = 0;
    memcpy(err->msg, out, n + 1);
}

void kvp_prompts_once_close(kvp_prompts_once *pc)
{
    if (pc->fd >= 0)
        close(pc->fd);
    pc->fd = -1;
}
