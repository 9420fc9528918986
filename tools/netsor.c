/* netsor: command-line front end for NETSOR programs (docs/netsor.md).
 *   netsor check prog.nsr [--set k=v]... [--netsor-plus] [--explain]
 *   netsor dump  prog.nsr [...]
 * One function per subcommand, dispatched from the table `commands` (add rows to extend). */
#include "tpk/tpk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TPK_VERSION
#define TPK_VERSION "unknown"
#endif

#define MAX_SETS 64

/* Options shared by the subcommands that load a program. */
typedef struct cli {
    const char *path;
    tpk_param_set sets[MAX_SETS];
    int nsets;
    tpk_netsor_opts opts;
    char *owned[MAX_SETS];
    int nargs;              /* extra positional arguments, for subcommands that take them */
    const char *args[8];
} cli;

static const char usage[] =
    "Usage: netsor COMMAND PROGRAM.nsr [options]\n"
    "Parse, check and elaborate NETSOR programs (infinite-width Tensor Programs).\n"
    "\n"
    "Commands:\n"
    "  check    type-check and elaborate; print a one-line summary\n"
    "  dump     print the elaborated straight-line IR\n"
    "  kernel   infinite-width kernel (not available in this build yet)\n"
    "  run      finite-width simulation (not available in this build yet)\n"
    "\n"
    "Options:\n"
    "  --set NAME=VALUE   override a program parameter (repeatable): --set L=4 --set phi=erf\n"
    "  --netsor-plus      allow NETSOR+ Moments (mean(...)) without 'use netsor+'\n"
    "  --explain          report inferred shape holes '_' and other notes on stderr\n"
    "  --help             this text        --version   the toolkit version\n"
    "\n"
    "Errors go to stderr as file:line:col: message; the exit status is 1.\n";

/* sqrt is needed by layernorm programs; add it when the registry lacks it. */
static double f_sqrt(double x, const double *params)
{
    (void)params;
    return sqrt(x);
}

static tpk_phi_registry *registry(tpk_ctx *ctx)
{
    tpk_phi_registry *reg = tpk_phi_registry_alloc(ctx);
    if (reg == NULL)
        return NULL;
    tpk_ctx probe;
    tpk_ctx_init(&probe);
    tpk_phi *s = tpk_phi_alloc(reg, "sqrt", &probe);
    if (s != NULL) {
        tpk_phi_free(s);
    } else if (tpk_phi_register(reg, "sqrt", f_sqrt, 0, NULL, TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED,
                                ctx)) {
        tpk_phi_registry_free(reg);
        return NULL;
    }
    return reg;
}

static void cli_free(cli *c)
{
    for (int i = 0; i < c->nsets; i++)
        free(c->owned[i]);
}

/* Parse PROGRAM and options after the subcommand name. Returns 0, or 2 on a usage error. */
static int parse_cli(int argc, char **argv, cli *c, const char *cmd)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--netsor-plus") == 0) {
            c->opts.netsor_plus = 1;
        } else if (strcmp(a, "--explain") == 0) {
            c->opts.explain = 1;
        } else if (strcmp(a, "--set") == 0 || strncmp(a, "--set=", 6) == 0) {
            const char *kv = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            const char *eq = kv ? strchr(kv, '=') : NULL;
            if (eq == NULL || eq == kv) {
                fprintf(stderr, "netsor %s: --set needs NAME=VALUE\n", cmd);
                return 2;
            }
            if (c->nsets == MAX_SETS) {
                fprintf(stderr, "netsor %s: at most %d --set options\n", cmd, MAX_SETS);
                return 2;
            }
            char *name = malloc((size_t)(eq - kv) + 1);
            if (name == NULL) {
                fprintf(stderr, "netsor %s: out of memory\n", cmd);
                return 2;
            }
            memcpy(name, kv, (size_t)(eq - kv));
            name[eq - kv] = '\0';
            c->owned[c->nsets] = name;
            c->sets[c->nsets].name = name;
            c->sets[c->nsets].value = eq + 1;
            c->nsets++;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "netsor %s: unknown option '%s' (see netsor --help)\n", cmd, a);
            return 2;
        } else if (c->path == NULL) {
            c->path = a;
        } else if (c->nargs < (int)(sizeof c->args / sizeof c->args[0])) {
            c->args[c->nargs++] = a;
        } else {
            fprintf(stderr, "netsor %s: too many arguments\n", cmd);
            return 2;
        }
    }
    if (c->path == NULL) {
        fprintf(stderr, "netsor %s: missing PROGRAM.nsr (see netsor --help)\n", cmd);
        return 2;
    }
    c->opts.sets = c->sets;
    c->opts.nsets = c->nsets;
    c->opts.diag = stderr;
    return 0;
}

/* Load the program named on the command line; prints the error and returns NULL on failure. */
static tpk_program *load(cli *c, tpk_phi_registry **reg)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    *reg = registry(&ctx);
    tpk_program *p = *reg ? tpk_netsor_load_file(c->path, &c->opts, *reg, &ctx) : NULL;
    if (p == NULL)
        fprintf(stderr, "%s\n", ctx.msg[0] ? ctx.msg : tpk_strerror(ctx.status));
    return p;
}

static int cmd_check(int argc, char **argv)
{
    cli c;
    int st = parse_cli(argc, argv, &c, "check");
    if (st) {
        cli_free(&c);
        return st;
    }
    tpk_phi_registry *reg;
    tpk_program *p = load(&c, &reg);
    if (p != NULL) {
        int ng = 0, nh = 0, ns = 0;
        for (int i = 0; i < p->nvars; i++) {
            ng += p->var[i].type == TPK_VAR_G;
            nh += p->var[i].type == TPK_VAR_H;
            ns += p->var[i].type == TPK_VAR_SCALAR;
        }
        printf("%s: ok (%d instructions, %d G-vars, %d H-vars, %d scalars, %d A-vars, %d embeddings, "
               "%d input slot%s, %d output%s%s%s)\n",
               c.path, p->ninstr, ng, nh, ns, p->navars, p->nembeds, p->nslots,
               p->nslots == 1 ? "" : "s", p->noutputs, p->noutputs == 1 ? "" : "s",
               p->features & TPK_FEAT_NETSOR_PLUS ? ", netsor+" : "",
               p->features & TPK_FEAT_SQRT_N_LOGITS ? ", sqrt-n-logits" : "");
    }
    int rc = p != NULL ? 0 : 1;
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
    cli_free(&c);
    return rc;
}

static int cmd_dump(int argc, char **argv)
{
    cli c;
    int st = parse_cli(argc, argv, &c, "dump");
    if (st) {
        cli_free(&c);
        return st;
    }
    tpk_phi_registry *reg;
    tpk_program *p = load(&c, &reg);
    if (p != NULL)
        tpk_program_dump(p, stdout);
    int rc = p != NULL ? 0 : 1;
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
    cli_free(&c);
    return rc;
}

/* Placeholders for the back ends (netsor/limit.c, netsor/exec.c): replace with real commands. */
static int cmd_kernel(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "netsor kernel: not available in this build yet\n");
    return 2;
}

static int cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "netsor run: not available in this build yet\n");
    return 2;
}

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv); /* argv: the arguments after the command name */
} command;

static const command commands[] = {
    {"check", cmd_check},
    {"dump", cmd_dump},
    {"kernel", cmd_kernel},
    {"run", cmd_run},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("netsor (tpk) %s\n", TPK_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) {
            for (int k = 2; k < argc; k++)
                if (strcmp(argv[k], "--help") == 0) {
                    fputs(usage, stdout);
                    return 0;
                }
            return commands[i].fn(argc - 2, argv + 2);
        }
    fprintf(stderr, "netsor: unknown command '%s' (see netsor --help)\n", argv[1]);
    return 2;
}
