/* Clean-up handlers for the signals that end a program, installed only over default actions
 * (core/signal_impl.h). */
#include "signal_impl.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

void tpk__signals_default_to(const int *sigs, int n, void (*fn)(int))
{
    for (int i = 0; i < n; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = fn;
        sigemptyset(&sa.sa_mask);
        for (int k = 0; k < n; k++)
            sigaddset(&sa.sa_mask, sigs[k]);
        sigaction(sigs[i], &sa, NULL);
    }
}

static void say(const char *s)
{
    ssize_t w = write(2, s, strlen(s));
    (void)w;
}

void tpk__signal_say(const char *before, int sig, const char *after)
{
    say(before);
    say(sig == SIGINT ? "interrupted (SIGINT)" : sig == SIGTERM ? "terminated (SIGTERM)"
        : sig == SIGHUP ? "hangup (SIGHUP)" : "stopped by a signal");
    say(after);
}
