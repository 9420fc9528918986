/* Internal: the clean-up handlers of the signals that end a program (core/signal.c); shared by the
 * atomic HDF5 writer (core/io_h5out.c) and the tuner's scratch folder (tuner/build.c). */
#ifndef TPK_SIGNAL_IMPL_H
#define TPK_SIGNAL_IMPL_H

/* fn for each of sigs[0..n) whose action is still the default, with all of sigs blocked while it
 * runs; a signal with a handler of the program's own (or ignored) is left as it is. */
void tpk__signals_default_to(const int *sigs, int n, void (*fn)(int));
/* before, "interrupted (SIGINT)" / "terminated (SIGTERM)" / "hangup (SIGHUP)", after, on stderr
 * with write() only: for a handler (async-signal-safe). */
void tpk__signal_say(const char *before, int sig, const char *after);

#endif
