/* progress.h - a batch job's progress on standard error (decode, specdec
 * and prefill --progress): requests done of the job's total when the input
 * says it up front, those running and waiting, the output and prompt token
 * rates, the time so far and an estimate of the time left.
 *
 * A cron job's log gets one line every interval.  A terminal gets the line
 * redrawn in place, cut to its width, when the results go elsewhere (a file,
 * a pipe); when they come to the same terminal, lines are written as in a
 * log, since a redraw would go back over them.  A line is written whole
 * with one call; a warning or error message (lib/base/cli.c) first ends a
 * line being redrawn.  Lines come between engine steps: while the job only
 * waits for input (a slow pipe, --rate), none is written.
 */
#ifndef KVP_PROGRESS_H
#define KVP_PROGRESS_H

#include "batch.h"
#include "error.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What one line shows. */
typedef struct kvp_progress_state {
    double elapsed;          /* seconds since the job started */
    uint64_t done;           /* requests finished in this run */
    uint64_t total;          /* requests this run has to do, when known */
    int known;               /* total is known (0 of 0 is a job with nothing to do) */
    uint32_t running, waiting;
    uint64_t prompt_tokens;  /* computed so far (a preempted request's again; prefix-cache hits not) */
    uint64_t generated;      /* so far, the running requests' too */
    int prompts_only;        /* prefill's job: prompts, one at a time, nothing generated */
    int stopped;             /* the job was stopped (a signal): no time left to show */
} kvp_progress_state;

/* The line for st, without a newline, into buf[cap] (cut to fit):
 *   "decode: 4512 of 10000 requests (45.1%), 64 running, 120 waiting;
 *    3210 tok/s out, 5432 tok/s prompt; 1:23 elapsed, about 1:41 left"
 * or, prompts_only, "prefill: 45 of 100 prompts (45.0%); 5432 tok/s
 * prompt; 0:12 elapsed, about 0:15 left"; stopped, "..., stopped; ...
 * elapsed".  The total and the time left are left out when the total is not
 * known; the time left is an estimate from the rate of requests so far. */
void kvp_progress_format(char *buf, size_t cap, const char *prog, const kvp_progress_state *st);

typedef struct kvp_progress {
    FILE *f;
    const char *prog;
    double interval;          /* seconds between lines */
    int in_place;             /* redraw one line ("\r", erase to its end), cut to the terminal's width */
    double t0, t_next;
    uint64_t total;           /* requests of the input this run takes */
    int known;                /* total is known */
    uint64_t (*skipped)(const void *ctx); /* of total, dropped as done before so far (--resume); NULL: none */
    const void *skipped_ctx;
    int open_line;            /* a line redrawn in place is showing, not ended */
} kvp_progress;

/* The option's line in a program's --help, and its value: seconds between
 * lines, 0 for the default (given without "="). */
#define KVP_PROGRESS_HELP                                                                                          \
    "      --progress[=S]      a progress line on standard error every S seconds (default: 1, redrawn\n"             \
    "                          in place, on a terminal the output does not go to; 10 otherwise)\n"
double kvp_progress_opt(const char *optarg);

/* Start the clock for a job of total requests (known 0: not known up
 * front).  interval <= 0: 1 second when the line is redrawn in place, 10
 * otherwise.  The one progress of the process: cli messages end its line. */
void kvp_progress_init(kvp_progress *p, FILE *f, const char *prog, double interval, uint64_t total, int known);
/* kvp_batch_opts.on_step: a line when the interval has passed. */
void kvp_progress_step(void *p, const kvp_batch_stats *st, uint32_t running, uint32_t waiting);
/* The last line, whatever the interval (a redrawn line ends with its
 * newline); a stopped run (st->stopped) says so. */
void kvp_progress_end(kvp_progress *p, const kvp_batch_stats *st);
/* End a line being redrawn (before other output to the terminal); nothing
 * otherwise. */
void kvp_progress_break(kvp_progress *p);
/* prefill's: n prompts done, tokens of them computed; a line when the
 * interval has passed, or (last) the last line. */
void kvp_progress_prompts(kvp_progress *p, uint64_t n, uint64_t tokens, int last);

/* Of n requests, how many shard k of m holds (m 0 or 1: all), as
 * kvp_jobsrc_filter keeps them: indices i with i % m == k. */
uint64_t kvp_progress_shard_count(uint64_t n, uint32_t k, uint32_t m);

/* getopt leaves "--progress 5" as --progress and an argument "5" (an
 * optional value goes after '='): a usage error saying so when given_bare
 * and argv[optind] is a number that names no file. */
void kvp_progress_bare_check(int given_bare, int argc, char *const argv[], int next);

#endif
