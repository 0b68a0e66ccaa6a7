/* results.h - what a batch job has already written: the ids of the complete
 * lines of a results file (decode's JSON Lines output), for `decode --resume
 * OUT.jsonl`.
 *
 * A job killed at any moment leaves OUT with whole lines and at most one
 * line cut short at its end (each result is one write of one line).  The
 * scan takes every whole line's "id" as a key, the prompts reader's
 * (prompts.h): a string as it is, an integer (int64) as its decimal digits,
 * so 7 and "7" are one id; and it reports where the whole lines end, so the
 * caller cuts the partial line off and appends after it.  A whole line that
 * is not a JSON object with such an id (an empty string, a NUL in it, an
 * integer past int64 or a fraction are not) is an error naming the file
 * and line: a results file someone edited by hand should not be silently
 * half-trusted.  The file is read a line at a time, each whole line checked
 * as strictly as a parse but only its id kept: a night's results of any
 * length take the memory of the longest line (at most 1 GiB) and the ids.
 */
#ifndef KVP_RESULTS_H
#define KVP_RESULTS_H

#include "error.h"
#include "strmap.h"

#include <stddef.h>
#include <stdint.h>

/* A set of id strings: a string map whose values go unused. */
typedef kvp_strmap kvp_idset;

void kvp_idset_init(kvp_idset *s);
void kvp_idset_free(kvp_idset *s);
/* 1 when added, 0 when already there, KVP_ENOMEM. */
int kvp_idset_add(kvp_idset *s, const char *id, size_t len);
int kvp_idset_has(const kvp_idset *s, const char *id, size_t len);

/* Scan results file path: the ids of its whole lines into done, and in
 * *whole the byte length of those lines (the file's size when it ends with
 * a newline).  A missing file is empty (0).  0 or a code. */
int kvp_results_scan(const char *path, kvp_idset *done, uint64_t *whole, kvp_err *err);

#endif
