/* progress.c - a batch job's progress lines (progress.h). */
#include "progress.h"
#include "cli.h"
#include "generate.h"

#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
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
    uint64_t count = st->known ? st->total : st->done; /* the number the noun goes with */
    const char *what = st->prompts_only ? count == 1 ? "prompt" : "prompts" : count == 1 ? "request" : "requests";
    ADD("%s: %" PRIu64, prog, st->done);
    if (st->known)
        ADD(" of %" PRIu64 " %s (%.1f%%)", st->total, what,
            st->total ? 100.0 * (double)(st->done < st->total ? st->done : st->total) / (double)st->total : 100.0);
    else
        ADD(" %s", what);
    if (st->stopped)
        ADD(", stopped");
    else if (!st->prompts_only)
        ADD(", %u running, %u waiting", st->running, st->waiting);
    if (!st->prompts_only)
        ADD("; %.0f tok/s out,", e > 0 ? (double)st->generated / e : 0.0);
    else
        ADD(";");
    ADD(" %.0f tok/s prompt; ", e > 0 ? (double)st->prompt_tokens / e : 0.0);
    clock_text(el, sizeof el, e);
    ADD("%s elapsed", el);
    /* left: the requests to go at the rate of those done (none done: no
     * rate to go by yet) */
    if (st->known && !st->stopped && st->done && st->done < st->total) {
        clock_text(left, sizeof left, e * (double)(st->total - st->done) / (double)st->done);
        ADD(", about %s left", left);
    }
#undef ADD
}

/* The process's progress, whose line a cli message ends first. */
static kvp_progress *active;

/* The descriptor of a line being redrawn, -1 when none: a reader that
 * goes away (`decode --progress | head -1`) ends us by SIGPIPE, and the
 * handler ends the line first so the shell's prompt starts on its own. */
static volatile sig_atomic_t open_fd = -1;

static void on_sigpipe(int sig)
{
    int fd = open_fd;
    if (fd >= 0) {
        ssize_t w = write(fd, "\n", 1); /* async-signal-safe; nothing to do if it fails */
        (void)w;
    }
    signal(sig, SIG_DFL); /* then die of it, as without the handler */
    raise(sig);
}

/* While lines are redrawn: SIGPIPE through on_sigpipe, when its action is
 * the default (a parent that ignores it keeps it ignored). */
static void catch_sigpipe(void)
{
    struct sigaction old, sa;
    if (sigaction(SIGPIPE, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
        return;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigpipe;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
}

static void release_sigpipe(void)
{
    struct sigaction old;
    open_fd = -1;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == on_sigpipe)
        signal(SIGPIPE, SIG_DFL);
}

static void set_open(kvp_progress *p, int open)
{
    p->open_line = open;
    open_fd = open ? fileno(p->f) : -1;
}

static void break_active(void)
{
    if (active)
        kvp_progress_break(active);
}

void kvp_progress_init(kvp_progress *p, FILE *f, const char *prog, double interval, uint64_t total, int known)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    p->prog = prog;
    /* in place only when the results do not come to the same terminal: a
     * redraw would go back over them */
    p->in_place = isatty(fileno(f)) && !isatty(STDOUT_FILENO);
    p->interval = interval > 0 ? interval : p->in_place ? 1.0 : 10.0;
    p->total = total;
    p->known = known;
    p->t0 = kvp_gen_now();
    p->t_next = p->t0 + p->interval;
    active = p;
    kvp_cli_before_message(break_active);
    if (p->in_place)
        catch_sigpipe();
}

/* The terminal's width; 0 when it does not say. */
static size_t term_width(FILE *f)
{
    struct winsize ws;
    return ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 ? ws.ws_col : 0;
}

/* The line for ps (its times and total filled in here), written in one call. */
static void show(kvp_progress *p, kvp_progress_state ps, int last)
{
    uint64_t skipped = p->skipped ? p->skipped(p->skipped_ctx) : 0;
    ps.elapsed = kvp_gen_now() - p->t0;
    ps.known = p->known;
    ps.total = p->total > skipped ? p->total - skipped : 0;
    if (!last && ps.known && ps.done >= ps.total)
        return; /* the last line says it, once */
    char line[512];
    kvp_progress_format(line, sizeof line, p->prog, &ps);
    if (p->in_place) {
        /* a line longer than the terminal wraps, and "\r" then goes back
         * to its last row only: cut to the width */
        size_t w = term_width(p->f);
        if (w > 1 && strlen(line) > w - 1)
            line[w - 1] = 0;
        fprintf(p->f, "\r%s\033[K%s", line, last ? "\n" : "");
    } else {
        fprintf(p->f, "%s\n", line);
    }
    fflush(p->f);
    set_open(p, p->in_place && !last);
}

void kvp_progress_break(kvp_progress *p)
{
    if (p->open_line) {
        fputc('\n', p->f);
        fflush(p->f);
    }
    set_open(p, 0);
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
                                .prompt_tokens = st->computed_prompt, .generated = st->generated_live,
                                .stopped = st->stopped};
}

void kvp_progress_step(void *ctx, const kvp_batch_stats *st, uint32_t running, uint32_t waiting)
{
    kvp_progress *p = ctx;
    if (due(p))
        show(p, of_batch(st, running, waiting), 0);
}

void kvp_progress_end(kvp_progress *p, const kvp_batch_stats *st)
{
    show(p, of_batch(st, 0, 0), 1);
    active = NULL;
    release_sigpipe();
}

void kvp_progress_prompts(kvp_progress *p, uint64_t n, uint64_t tokens, int last)
{
    if (last || due(p))
        show(p, (kvp_progress_state){.done = n, .prompt_tokens = tokens, .prompts_only = 1}, last);
    if (last) {
        active = NULL;
        release_sigpipe();
    }
}

uint64_t kvp_progress_shard_count(uint64_t n, uint32_t k, uint32_t m)
{
    if (m < 2)
        return n;
    return n / m + (k < n % m);
}

double kvp_progress_opt(const char *arg) { return arg ? kvp_cli_opt_f64("--progress", arg, 0.001, 86400) : 0; }

void kvp_progress_bare_check(int given_bare, int argc, char *const argv[], int next)
{
    if (!given_bare || next >= argc)
        return;
    const char *a = argv[next];
    double v;
    if (kvp_cli_parse_f64(a, 0, 1e300, &v) == 0 && access(a, F_OK) != 0)
        kvp_cli_usage_error("--progress takes its seconds after '=': --progress=%s", a);
}
