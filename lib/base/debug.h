/* debug.h - debug assertions for the library's internal invariants, in the
 * manner of zstd's lib/common/debug.h.
 *
 * KVP_ASSERT(cond) states what one module relies on from another (a free
 * block has no references, a registered hash names a full block, a pool
 * task index is below the run's count).  Built with -DKVP_DEBUG=1 (`make
 * check`, `make asan`, `make tsan`) a false condition prints
 * "kvpipe: file:line: assertion failed: cond" on stderr and aborts: it is a
 * bug in kvpipe, never bad input (input errors are KVP_E* codes, error.h).
 * In release builds (`make`) it compiles to nothing and cond is not
 * evaluated, so it may be costly but must have no side effects.
 */
#ifndef KVP_DEBUG_H
#define KVP_DEBUG_H

#ifndef KVP_DEBUG
#define KVP_DEBUG 0
#endif

#if KVP_DEBUG
#include <stdio.h>
#include <stdlib.h>

static inline void kvp_debug_fail(const char *file, int line, const char *cond)
{
    fprintf(stderr, "kvpipe: %s:%d: assertion failed: %s\n", file, line, cond);
    abort();
}

#define KVP_ASSERT(cond) ((cond) ? (void)0 : kvp_debug_fail(__FILE__, __LINE__, #cond))
#else
/* sizeof keeps the names in cond "used" without evaluating them. */
#define KVP_ASSERT(cond) ((void)sizeof(!(cond)))
#endif

#endif
