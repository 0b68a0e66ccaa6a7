/* stopsig.c - SIGINT and SIGTERM as a request to stop (see stopsig.h). */
#include "stopsig.h"
#include "cli.h"
#include "io.h"

#include <string.h>

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

/* on_stop for SIGINT and SIGTERM, with flags.  A signal ignored by whoever
 * started us stays ignored, as lib/base/io.c's handlers do. */
static void set_stop_handlers(int flags)
{
    static const int sigs[] = {SIGINT, SIGTERM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa;
        if (sigaction(sigs[i], NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop;
        sa.sa_flags = flags;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

void kvp_stopsig_catch_loading(void)
{
    set_stop_handlers(SA_RESTART | SA_RESETHAND);
    kvp_in_interrupt_on(NULL); /* specdec --compare reads its prompts under kvp_stopsig_catch first */
}

void kvp_stopsig_catch(void)
{
    set_stop_handlers(0);
    kvp_in_interrupt_on(&stop_signal);
}

void kvp_stopsig_defer(void) { set_stop_handlers(SA_RESTART); }

volatile sig_atomic_t *kvp_stopsig_flag(void) { return &stop_signal; }

int kvp_stopsig_caught(void) { return stop_signal; }

int kvp_stopsig_status(void) { return 128 + stop_signal; }

void kvp_stopsig_say(uint64_t written, uint64_t left, int read_all, const char *resume)
{
    kvp_cli_warn("stopped by %s: %llu sequences written, %llu read and not finished%s%s%s", strsignal(stop_signal),
                 (unsigned long long)written, (unsigned long long)left,
                 read_all ? "" : ", the rest of the input not read yet", resume ? "; run again with --resume " : "",
                 resume ? resume : "");
}
