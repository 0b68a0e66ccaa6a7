/* promptsonce.h - a prompts file that a program reads more than once
 * (specdec --profile, --compare).
 *
 * Each run reads the prompts from their start, as -f reads them, but
 * standard input, a pipe, /dev/stdin or <(...) give their bytes once: a
 * second run would find them gone.  So such a file is read once into
 * memory (a memfd) and the runs read that, each opening it afresh by its
 * /proc/self/fd path; messages about it name the user's file.
 *
 * Program layer (like decodemain.h): dies naming the file when it cannot.
 */
#ifndef KVP_PROMPTSONCE_H
#define KVP_PROMPTSONCE_H

#include "error.h"

#include <stdint.h>

typedef struct kvp_prompts_once {
    int fd;            /* the memfd; -1 when the file is read again itself */
    char path[40];     /* "/proc/self/fd/N": an open starts at byte 0 */
    const char *file;  /* the user's name for it */
} kvp_prompts_once;

/* Make file readable again: a copy in memory of at most max bytes (over
 * it: an error naming file, then why), or with copy_regular 0 a regular
 * file (it reads again by itself) left as it is.  Read the runs from
 * kvp_prompts_once_path.  0, or KVP_EINTR when a stop signal ended the
 * wait for the file or its bytes (kvp_in_interrupt_on: the program is told
 * to stop, stopsig.h), nothing kept. */
int kvp_prompts_once_open(kvp_prompts_once *pc, const char *file, int copy_regular, uint64_t max, const char *why);
const char *kvp_prompts_once_path(const kvp_prompts_once *pc);
/* A message naming the copy names the user's file instead. */
void kvp_prompts_once_name(const kvp_prompts_once *pc, kvp_err *err);
void kvp_prompts_once_close(kvp_prompts_once *pc);

#endif
