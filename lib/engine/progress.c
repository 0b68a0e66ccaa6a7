/* progress.c - a batch job's progress lines (progress.h). */
#include "progress.h"
#include "generate.h"

#include <inttypes.h>
#include <string.h>
#include <unistd.h>

/* Seconds as "M:SS", or "H:MM:SS" from an hour. */
static void clock_text(char *buf, size_t cap, double s)
{
    uint64_t t = s > 0 && s < 1e12 ? (uint64_t)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, cap, "%" PRIu64 ":%02u:%02u", t / 3600, (unsigned)(t / 60 % 60), (unsigned)(t % 60));
    else
        snprintf(buf, cap, "%u:%02u", (unsigned)(t / 60), (unsigned)(t % 60));
}

void kvp_progress_format(char *buf, size_t cap, const char *prog, const kvp_progress_state *st)
{
    char el[32], left[32];
    double e = st->elapsed > 0 ? st->elapsed : 0;
    size_t n = 0;
#define ADD(...)                                                                                                   \
    do {                                                                                                           \
        if (n < cap) {                                                                                             \
            int w = snprintf(buf + n, cap - n, __VA_ARGS__);                                                       \
            n += w > 0 ? (size_t)w : 0;                                                                            \
        }                                                                                                          \
    } while (0)
    if (cap == 0)
        return;
    buf[0] = 0;
    const char *what = st->prompts_only ? "prompts" : "requests";
    ADD("%s: %" PRIu64, prog, st->done);
    if (st->total)
        ADD(" of %" PRIu64 " %s (%.1f%%)", st->total, what,
            100.0 * (double)(st->done < st->total ? st->done : st->total) / (double)st->total);
    else
        ADD(" %s", what);
    if (!st->prompts_only)
        ADD(", %u running, %u waiting; %.0f tok/s out,", st->running, st->waiting,
            e > 0 ? (double)st->generated / e : 0.0);
    else
        ADD(";");
    ADD(" %.0f tok/s prompt; ", e > 0 ? (double)st->prompt_tokens / e : 0.0);
    clock_text(el, sizeof el, e);
    ADD("%s elapsed", el);
    /* left: the requests to go at the rate of those done (none done: no
     * rate to go by yet) */
    if (st->total && st->done && st->done < st->total) {
        clock_text(left, sizeof left, e * (double)(st->total - st->done) / (double)st->done);
        ADD(", about %s left", left);
    }
#undef ADD
}

void kvp_progress_init(kvp_progress *p, FILE *f, const char *prog, double interval, uint64_t total)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    p->prog = prog;
    p->tty = isatty(fileno(f));
    p->interval = interval > 0 ? interval : p->tty ? 1.0 : 10.0;
    p->total = total;
    p->t0 = kvp_gen_now();
    p->t_next = p->t0 + p->interval;
}

/* The line for ps (its times and total filled in here), written in one call. */
static void show(kvp_progress *p, kvp_progress_state ps, int last)
{
    uint64_t skipped = p->skipped ? p->skipped(p->skipped_ctx) : 0;
    ps.elapsed = kvp_gen_now() - p->t0;
    ps.total = p->total > skipped ? p->total - skipped : 0;
    if (!last && ps.total && ps.done >= ps.total)
        return; /* the last line says it, once */
    char line[512];
    kvp_progress_format(line, sizeof line, p->prog, &ps);
    if (p->tty) /* back to the line's start, the line, the old one's rest erased */
        fprintf(p->f, "\r%s\033[K%s", line, last ? "\n" : "");
    else
        fprintf(p->f, "%s\n", line);
    fflush(p->f);
    p->open_line = p->tty && !last;
}

void kvp_progress_break(kvp_progress *p)
{
    if (p->open_line)
        fputc('\n', p->f);
    p->open_line = 0;
}

/* Whether a line is due; if so the next one is an interval from now (a
 * long step does not bring a burst of them). */
static int due(kvp_progress *p)
{
    double now = kvp_gen_now();
    if (now < p->t_next)
        return 0;
    p->t_next = now + p->interval;
    return 1;
}

static kvp_progress_state of_batch(const kvp_batch_stats *st, uint32_t running, uint32_t waiting)
{
    return (kvp_progress_state){.done = st->requests, .running = running, .waiting = waiting,
                                .prompt_tokens = st->computed_prompt, .generated = st->generated_live};
}

void kvp_progress_step(void *ctx, const kvp_batch_stats *st, uint32_t running, uint32_t waiting)
{
    kvp_progress *p = ctx;
    if (due(p))
        show(p, of_batch(st, running, waiting), 0);
}

void kvp_progress_end(kvp_progress *p, const kvp_batch_stats *st) { show(p, of_batch(st, 0, 0), 1); }

void kvp_progress_prompts(kvp_progress *p, uint64_t n, uint64_t tokens, int last)
{
    if (last || due(p))
        show(p, (kvp_progress_state){.done = n, .prompt_tokens = tokens, .prompts_only = 1}, last);
}

uint64_t kvp_progress_shard_count(uint64_t n, uint32_t k, uint32_t m)
{
    if (m < 2)
        return n;
    return n / m + (k < n % m);
}
