/* fuzz_results.c - libFuzzer harness: the results-file scan of decode
 * --resume (JSON Lines with ids, the last line possibly cut short).  It
 * takes a path, so each input goes to one scratch file (removed at exit).
 * A success must report whole lines ending at a newline (or nothing) and
 * keys a request can have (non-empty), and a failure a code and a message. */
#define _POSIX_C_SOURCE 200809L
#include "results.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_scratch_write(data, size, "results");
    kvp_idset s;
    kvp_idset_init(&s);
    kvp_err err = {0};
    uint64_t whole = 0;
    if (kvp_results_scan(path, &s, &whole, &err) == 0) {
        if (whole > size || (whole && data[whole - 1] != '\n'))
            abort();
        if (kvp_idset_has(&s, "", 0))
            abort(); /* "" is no request's key */
    } else if (err.code >= 0 || !err.msg[0]) {
        abort();
    }
    kvp_idset_free(&s);
    return 0;
}
