/* scratch.h - for harnesses whose code under test takes a path: write each
 * input to one scratch file under $TMPDIR (made once, removed at exit) and
 * return its name.  Aborts if the file cannot be written (a harness bug). */
#ifndef KVP_FUZZ_SCRATCH_H
#define KVP_FUZZ_SCRATCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char fuzz_scratch_path[300];

static void fuzz_scratch_cleanup(void) { unlink(fuzz_scratch_path); }

static const char *fuzz_scratch_write(const uint8_t *data, size_t size, const char *tag)
{
    if (!fuzz_scratch_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_scratch_path, sizeof fuzz_scratch_path, "%s/kvp-fuzz-%s-XXXXXX", tmp && tmp[0] ? tmp : "/tmp",
                 tag);
        int fd = mkstemp(fuzz_scratch_path);
        if (fd < 0)
            abort();
        close(fd);
        atexit(fuzz_scratch_cleanup);
    }
    FILE *f = fopen(fuzz_scratch_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    return fuzz_scratch_path;
}

#endif
