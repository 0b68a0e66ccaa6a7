/* draftlen.h - a cheap drafter's draft length under --draft-len auto,
 * from what a step costs on this machine and how often the request's
 * guesses are kept.
 *
 * A verify step of 1 + k tokens yields the kept guesses plus one token,
 * and costs what a step of its tokens costs here: on a CPU a 135M model's
 * step grows with its tokens, and a kernel change (AMX from 6 tokens on
 * an Intel Xeon) can make one more token cost a third of a step.  So the
 * length is the k that gives most tokens a second,
 *     (R + a + a^2 + ... + a^k) / t(T + k),
 * with a the request's recent per-guess acceptance, R the tokens the step
 * yields without this request's guesses and T its tokens so far; k = 0
 * (a plain step) when no k beats R / t(T).  t is measured: the seconds of
 * decode steps by their tokens, a moving average that takes a faster
 * step at once (a busy host only adds). */
#ifndef KVP_DRAFTLEN_H
#define KVP_DRAFTLEN_H

#include <stdint.h>

#define KVP_DRAFTLEN_T 128 /* steps of up to this many tokens are timed */

typedef struct kvp_draftlen {
    double t[KVP_DRAFTLEN_T + 1]; /* seconds of a decode step of n tokens; 0: not yet timed */
} kvp_draftlen;

/* A decode step of n tokens took s seconds. */
void kvp_draftlen_time(kvp_draftlen *c, uint32_t n, double s);

/* The guesses (0..most) to give a request whose step would otherwise hold
 * `tokens` tokens and yield `yield`, at acceptance a.  A step size never
 * timed is priced from those that were, optimistically (so it gets tried
 * and timed); before any step of `tokens` or fewer was timed, 0 (a plain
 * step times one).  Beyond KVP_DRAFTLEN_T tokens (a prompt chunk in the
 * step) guesses cost little beside it: most; below, never past it. */
uint32_t kvp_draftlen_choose(const kvp_draftlen *c, uint32_t tokens, uint32_t yield, float a, uint32_t most);

/* Acceptance after a verify step that kept `kept` of `drafted` guesses. */
float kvp_draftlen_accept(float a, uint32_t kept, uint32_t drafted);

/* Acceptance after a step the chooser left plain: it drifts back towards
 * KVP_DRAFTLEN_PRIOR, so a text that starts to copy is tried again. */
float kvp_draftlen_idle(float a);

#define KVP_DRAFTLEN_PRIOR 0.6f /* a new request's acceptance */

#endif
