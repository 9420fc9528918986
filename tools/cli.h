/* The pieces every command-line program of tools/ shares (linked into each): number and list
 * options, --set NAME=VALUE, the architecture flags of --arch, getopt errors, --version and the
 * one-line error report, exit statuses, the progress line. Messages name the option as typed
 * (--NAME). */
#ifndef TPK_TOOLS_CLI_H
#define TPK_TOOLS_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>

#include "tpk/archs.h"

#define CLI_MAX_SETS 64
#define CLI_MAX_FLAGS 32

/* ---- values ---------------------------------------------------------------------------------- */

/* A decimal integer in lo..hi (no sign): "--NAME: 'S' is not an integer in LO..HI". */
int cli_parse_size(const char *name, const char *s, size_t lo, size_t hi, size_t *out,
                   tpk_ctx *ctx);
/* The same into an int (hi <= INT_MAX). */
int cli_parse_int(const char *name, const char *s, int lo, int hi, int *out, tpk_ctx *ctx);
/* A finite number: "--NAME: 'S' is not a number". */
int cli_parse_double(const char *name, const char *s, double *out, tpk_ctx *ctx);
/* A list of integers in lo..hi: "a,b,c", or "A..B" (A, 2A, 4A, ... up to B, B > A), at most
 * `max` of them (an error beyond). */
int cli_parse_sizes(const char *name, const char *s, size_t lo, size_t hi, size_t *out,
                    size_t max, size_t *n, tpk_ctx *ctx);

/* ---- getopt_long (long options only; set opterr = 0 first) ------------------------------------ */

/* After getopt_long returned '?' or ':': "unknown or malformed option '...' (see --help)". */
int cli_bad_option(char **argv, tpk_ctx *ctx);
/* After the loop: an error if operands are left ("unexpected argument '...' (see --help)"). */
int cli_no_operands(int argc, char **argv, tpk_ctx *ctx);

/* ---- --set NAME=VALUE ------------------------------------------------------------------------- */

typedef struct cli_sets {
    tpk_param_set set[CLI_MAX_SETS];  /* names owned here, values point into argv */
    char *owned[CLI_MAX_SETS];
    int n;
} cli_sets;
/* Add "NAME=VALUE" (the value is not copied: keep kv alive). */
int cli_sets_add(cli_sets *s, const char *kv, tpk_ctx *ctx);
void cli_sets_free(cli_sets *s);

/* ---- --arch=NAME and its flags (include/tpk/archs.h) -------------------------------------------- */

/* The architecture by name: "unknown architecture 'X' (known: ...)". */
const tpk_arch *cli_arch(const char *name, tpk_ctx *ctx);

typedef struct cli_arch_flags {
    tpk_arch_flag fl[CLI_MAX_FLAGS];  /* flag, param (after cli_arch_flags_resolve), value */
    char flag[CLI_MAX_FLAGS][64], param[CLI_MAX_FLAGS][64];
    int n;
} cli_arch_flags;
/* The architecture's flags (--depth=3, --var-u=0.5, ...) are not known to getopt: every
 * "--name=value" or "--name value" after argv[0] whose name is not one of `own` (a getopt table)
 * is one ("--name" followed by another option or nothing is left for getopt to report). Returns
 * the other arguments, argv[0] first, NULL-terminated (free() it; argv is untouched), their count
 * in *nrest. */
char **cli_arch_flags_take(int argc, char **argv, const struct option *own, cli_arch_flags *f,
                           int *nrest, tpk_ctx *ctx);
/* Each flag against the architecture (NULL: --program, which takes no flags): its parameter, and
 * its value by tpk_arch_check_flag (reg for --phi). */
int cli_arch_flags_resolve(cli_arch_flags *f, const tpk_arch *a, const tpk_phi_registry *reg,
                           tpk_ctx *ctx);

/* ---- output ----------------------------------------------------------------------------------- */

/* Exit statuses, the same in every tool (issue 17) and stated in each --help (CLI_EXIT_HELP). */
#define CLI_EXIT_OK 0      /* success (also --help, --version) */
#define CLI_EXIT_ERROR 1   /* the run failed: input, computation or output (a message says why) */
#define CLI_EXIT_USAGE 2   /* the command line: unknown option, bad or missing value */
#define CLI_EXIT_HELP \
    "Exit status: 0 success, 1 error (input, computation, output), 2 usage error (unknown\n" \
    "option, bad or missing value).\n"

/* "PROG (tpk) VERSION" on stdout. */
void cli_version(const char *prog);
/* st != 0: "PROG: error: MESSAGE (STATUS)" on stderr, and 1; st == 0: 0. */
int cli_report(const char *prog, int st, const tpk_ctx *ctx);
/* A command-line error: "PROG: usage error: MESSAGE (see PROG --help)" on stderr, and 2;
 * st == 0: 0. */
int cli_report_usage(const char *prog, int st, const tpk_ctx *ctx);

/* ---- progress: one line on stderr with an ETA, redrawn in place -------------------------------- */

/* Nothing is drawn before this many seconds: short runs stay quiet. */
#define CLI_PROGRESS_AFTER 2.0

typedef struct cli_progress {
    const char *prog, *what;
    size_t total;
    int on, shown;
    double t0;
} cli_progress;
/* --progress (1), --no-progress (0) or neither (-1: when stderr is a terminal). */
int cli_progress_wanted(int flag);
void cli_progress_start(cli_progress *p, const char *prog, const char *what, size_t total, int on);
/* done of total finished: "PROG: WHAT done/total (p%), t s, ETA mm:ss" once past
 * CLI_PROGRESS_AFTER seconds. */
void cli_progress_update(cli_progress *p, size_t done);
/* Blank the line (before other output to the terminal); the next update redraws it. */
void cli_progress_clear(cli_progress *p);
/* The final line ("WHAT done in t s"), if anything was drawn. */
void cli_progress_end(cli_progress *p);

#endif
