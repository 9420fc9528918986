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
#include "tpk/progress.h"

#define CLI_MAX_SETS 64
#define CLI_MAX_FLAGS 32

/* ---- values ---------------------------------------------------------------------------------- */

/* A decimal integer in lo..hi (no sign): "--NAME: 'S' is not an integer in LO..HI". */
int cli_parse_size(const char *name, const char *s, size_t lo, size_t hi, size_t *out,
                   tpk_ctx *ctx);
/* The same into an int (hi <= INT_MAX). */
int cli_parse_int(const char *name, const char *s, int lo, int hi, int *out, tpk_ctx *ctx);
/* One of the names `names` (NULL-terminated), its index in *out: "--NAME: 'S' is not one of
 * a, b, c". */
int cli_parse_choice(const char *name, const char *s, const char *const *names, int *out,
                     tpk_ctx *ctx);
/* --kernel=nngp|ntk|both (TPK_JOB_*) and --parameterization=ntk|tp (TPK_NTK_PARAM_*). */
int cli_parse_kernel_kind(const char *s, int *out, tpk_ctx *ctx);
int cli_parse_ntk_param(const char *s, int *out, tpk_ctx *ctx);
/* A finite number: "--NAME: 'S' is not a number". */
int cli_parse_double(const char *name, const char *s, double *out, tpk_ctx *ctx);
/* A list of integers in lo..hi: "a,b,c", or "A..B" (A, 2A, 4A, ... up to B, B > A), at most
 * `max` of them (an error beyond). */
int cli_parse_sizes(const char *name, const char *s, size_t lo, size_t hi, size_t *out,
                    size_t max, size_t *n, tpk_ctx *ctx);

/* ---- getopt_long (long options only; set opterr = 0 first) ------------------------------------ */

/* A tool's options `base` followed by `own` (NULL: none), both ending in a zero entry, as one
 * getopt table (free() it); NULL and TPK_ENOMEM when out of memory. */
struct option *cli_options_join(const struct option *base, const struct option *own,
                                tpk_ctx *ctx);
/* After getopt_long returned '?' or ':': "unknown or malformed option '...' (see --help)". */
int cli_bad_option(char **argv, tpk_ctx *ctx);
/* After the loop: an error if operands are left ("unexpected argument '...' (see --help)"). */
int cli_no_operands(int argc, char **argv, tpk_ctx *ctx);

/* Which options a command line gave (issue 18: a repeated option silently overrode the first,
 * and a second --input escaped the output-is-an-input check). Give getopt_long a longindex set
 * to -1 before each call and pass it here: an option that takes a value may be given once
 * ("--NAME given twice ('A', then 'B'): give it once"); --set, repeatable, is checked per name
 * by cli_sets_add; options without a value may repeat. cli_given then tells whether an option
 * was on the command line (to refuse one that the others make meaningless). */
#define CLI_MAX_OPTIONS 128
typedef struct cli_seen {
    const struct option *opts;
    const char *value[CLI_MAX_OPTIONS]; /* per index of opts: the value given, or NULL */
    int given[CLI_MAX_OPTIONS];
} cli_seen;
void cli_seen_init(cli_seen *s, const struct option *opts);
int cli_seen_add(cli_seen *s, int longindex, const char *value, tpk_ctx *ctx);
/* getopt_long(argc, argv, "h", opts) recording each option in seen (cli_seen_add): -1 at the end,
 * and on a repeated option with its error in *st. */
int cli_getopt(int argc, char **argv, const struct option *opts, cli_seen *seen, int *st,
               tpk_ctx *ctx);
int cli_given(const cli_seen *s, const char *name);
/* An error when option `name` was given although `because` makes it meaningless, e.g.
 * cli_refuse(s, "tokens", "with --input the tokens come from the input"). */
int cli_refuse(const cli_seen *s, const char *name, const char *because, tpk_ctx *ctx);

/* ---- --set NAME=VALUE ------------------------------------------------------------------------- */

typedef struct cli_sets {
    tpk_param_set set[CLI_MAX_SETS];  /* names owned here, values point into argv */
    char *owned[CLI_MAX_SETS];
    int n;
} cli_sets;
/* Add "NAME=VALUE" (the value is not copied: keep kv alive); a NAME given before is an error. */
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
 * is one, each at most once ("--name" followed by another option or nothing is left for getopt
 * to report). Returns the other arguments, argv[0] first, NULL-terminated (free() it; argv is
 * untouched), their count in *nrest. */
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

/* The library's notes (tpk_note: a CSV line taken as a header, a rank-1 array read as N×1) as
 * "PROG: note: ..." lines on stderr; prog must outlive ctx. */
void cli_notes(tpk_ctx *ctx, const char *prog);

/* "PROG (tpk) VERSION" on stdout. */
void cli_version(const char *prog);
/* st != 0: "PROG: error: MESSAGE (STATUS)" on stderr, and 1; st == 0: 0. */
int cli_report(const char *prog, int st, const tpk_ctx *ctx);
/* A command-line error: "PROG: usage error: MESSAGE (see PROG --help)" on stderr, and 2;
 * st == 0: 0. */
int cli_report_usage(const char *prog, int st, const tpk_ctx *ctx);

/* ---- progress: one line on stderr with an ETA ---------------------------------------------------
 * The same in every tool. On a terminal one line, rewritten in place ("\r") a few times a second;
 * off a terminal (--progress into a log) a plain line every CLI_PROGRESS_EVERY seconds. Nothing
 * before CLI_PROGRESS_AFTER seconds: short runs print nothing. A line reads
 *   PROG: LABEL: UNIT done/total (p%), t s, ETA mm:ss
 * (the ETA of the current stage, from its rate so far) and a stage ends with
 *   PROG: LABEL: UNIT total/total (100%), done in t s
 * Only stderr is written: stdout and the output files are the same with and without it (the
 * display options are left out of the recorded command line, cli_record_argv). The environment
 * variables TPK_PROGRESS_AFTER and TPK_PROGRESS_EVERY (seconds) replace the two thresholds. */

#define CLI_PROGRESS_AFTER 2.0   /* seconds before the first line */
#define CLI_PROGRESS_EVERY 10.0  /* off a terminal: seconds between lines */
#define CLI_PROGRESS_REDRAW 0.1  /* on a terminal: seconds between redraws */
#define CLI_PROGRESS_BUFFERS 2

typedef struct cli_progress {
    const char *prog, *label;
    const char *unit;            /* the library's unit (tpk_progress_info.what), or NULL */
    char note[64];               /* shown after the percentage when not empty */
    size_t total, done, done0;   /* done0: the count when this stage started (its rate) */
    int on, tty, shown, open, width;
    double t0, tstage, tlast, after, every;
    tpk_progress lib;            /* what cli_progress_lib hands to the library */
    struct {                     /* streams the library writes while the line is on a terminal */
        FILE *buf, *dest;
        char *data;
        size_t len, sent;
    } out[CLI_PROGRESS_BUFFERS];
    int nout;
} cli_progress;

/* What every tool's --help says of it. */
#define CLI_PROGRESS_HELP \
    "Progress: a line on stderr with an ETA for runs longer than 2 s, rewritten in place on a\n" \
    "terminal (the default there); --progress also off a terminal (a plain line every 10 s),\n" \
    "--no-progress and --quiet never. stdout and the output file are the same either way.\n"

/* --progress (1), --no-progress (0) or neither (-1: when stderr is a terminal). */
int cli_progress_wanted(int flag);
/* Start (on = 0: never draw). label names the job ("limit kernel", "widths and head counts"). */
void cli_progress_start(cli_progress *p, const char *prog, const char *label, size_t total, int on);
/* done of total finished. */
void cli_progress_update(cli_progress *p, size_t done);
/* Blank the line (before other output to the terminal); the next update redraws it. */
void cli_progress_clear(cli_progress *p);
/* The end: ok, the final line of the stage ("done in", if a line was shown); else the line is
 * left as it stands and ended (an error message follows). The buffered streams are written out. */
void cli_progress_end(cli_progress *p, int ok);
/* The tpk_progress to pass to the library (tpk_job.progress, ...): its reports become this line
 * (a new unit or total starts a new stage; done == total ends it), cancel (may be NULL) is its
 * flag. Valid while p is. */
const tpk_progress *cli_progress_lib(cli_progress *p, const volatile sig_atomic_t *cancel);
/* The stream to give the library instead of dest (stdout for a summary, stderr for warnings):
 * dest itself unless the line is drawn on a terminal; then a buffer whose text goes to dest, the
 * line blanked first, at each report and at cli_progress_end (the same text, not interleaved
 * with the line). */
FILE *cli_progress_stream(cli_progress *p, FILE *dest);

/* The command line to record in an output file (provenance): argv without the options that only
 * change what is displayed (--progress, --no-progress, --quiet), so that they do not change the
 * file. Returns a malloc'd, NULL-terminated copy of the pointers (free() it), its length in *n;
 * NULL when out of memory. */
char **cli_record_argv(int argc, char **argv, int *n);

#endif
