/* Internal interface of the NETSOR front end: tokens, AST, arena, and the passes
 * lex (lex.c) → parse (parse.c) → check (check.c) → elaborate (elab.c) → IR (program.c).
 * Nothing here is exported; see docs/netsor.md for the language. */
#ifndef TPK_NETSOR_IMPL_H
#define TPK_NETSOR_IMPL_H

#include <stddef.h>

#include "backend-impl.h"
#include "tpk/netsor.h"

/* ---- Limits that keep hostile input (fuzzing) from exhausting the stack or memory ----------- */
#define NSR_MAX_DEPTH 200          /* expression / block nesting */
#define NSR_MAX_INDICES 4          /* h[i, j, k, l] */
#define NSR_MAX_STEPS 2000000      /* statements executed while unrolling */
#define NSR_MAX_BODY 200000        /* RPN nodes of one inlined Nonlin body */
#define NSR_MAX_INSTR 2000000      /* instructions of the elaborated program */

/* ---- Arena: every front-end allocation lives here and dies with the load ------------------- */
typedef struct nsr_arena nsr_arena;
nsr_arena *nsr_arena_alloc(tpk_ctx *ctx); /* from ctx's allocator (tpk/alloc.h) */
void nsr_arena_free(nsr_arena *a);
void *nsr_alloc(nsr_arena *a, size_t size);          /* zeroed; NULL when out of memory */
char *nsr_strndup(nsr_arena *a, const char *s, size_t n);

/* ---- Lexer (lex.c) ------------------------------------------------------------------------- */
enum nsr_tok {
    NSR_T_EOF, NSR_T_NL, NSR_T_NAME, NSR_T_NUM, NSR_T_HOLE,
    NSR_T_LP, NSR_T_RP, NSR_T_LB, NSR_T_RB, NSR_T_LC, NSR_T_RC,
    NSR_T_COMMA, NSR_T_COLON, NSR_T_SEMI, NSR_T_TILDE, NSR_T_EQ, NSR_T_DOTDOT,
    NSR_T_PLUS, NSR_T_MINUS, NSR_T_STAR, NSR_T_SLASH, NSR_T_CARET, NSR_T_QUOTE
};
typedef struct nsr_token {
    int kind;
    int line, col;
    const char *text;  /* NAME: arena string; others: NULL */
    double num;        /* NUM */
    int start, end;    /* byte offsets into the source (for quoting source text) */
} nsr_token;

/* Shared state of one load: names the file, owns the arena, carries the first error. */
typedef struct nsr_state {
    const char *file;
    const char *src;
    nsr_arena *arena;
    tpk_ctx *ctx;
    const tpk_netsor_opts *opts;
    const tpk_phi_registry *reg;
    int failed;
    int too_large;     /* the unrolled elaboration stopped at its size limits (NSR_MAX_STEPS) */
    int set_value;        /* file is "prog.nsr: --set NAME=VALUE": positions are columns of VALUE */
} nsr_state;

/* Record "file:line:col: message" (first error wins) and return status. */
int nsr_error(nsr_state *S, int status, int line, int col, const char *fmt, ...) TPK_PRINTF(5, 6);
int nsr_oom(nsr_state *S);
/* "file:line:col: note: ..." to opts->diag when explain/diag is set. */
void nsr_note(nsr_state *S, int line, int col, const char *fmt, ...) TPK_PRINTF(4, 5);

int nsr_lex(nsr_state *S, const char *src, nsr_token **toks, int *ntoks);
const char *nsr_tok_name(int kind);

/* ---- AST (parse.c) ------------------------------------------------------------------------- */
enum nsr_ekind {
    NSR_E_NUM,       /* literal */
    NSR_E_NAME,      /* name, or name[idx, ...] */
    NSR_E_CALL,      /* name(args): function, A-var (MatMul), mean, readout, sqrt(width) */
    NSR_E_APPLY,     /* juxtaposition  W h : MatMul */
    NSR_E_BIN,       /* + - * / ^  (op holds the token kind) */
    NSR_E_NEG,
    NSR_E_TRANSPOSE, /* W'  (always rejected) */
    NSR_E_SUM,       /* sum(j in lo..hi: body): name = binder, args = {lo, hi}, a = body,
                      * sym (check) = the binder's loop symbol */
    NSR_E_SOFTMAX    /* softmax(j in lo..hi: body): as SUM; op (check) = the enclosing loop
                      * symbol named j, at whose value the entry is taken */
};
typedef struct nsr_expr nsr_expr;
struct nsr_expr {
    int kind, op;
    int line, col;
    int start, end;       /* source span */
    double num;
    const char *name;     /* NAME, CALL */
    int nidx;
    nsr_expr **idx;       /* NAME indices */
    int nargs;
    nsr_expr **args;      /* CALL */
    nsr_expr *a, *b;      /* APPLY (a = matrix), BIN, NEG, TRANSPOSE */
    int sym;              /* filled by check: resolved symbol id, -1 if none */
    const tpk_phi *phi;   /* rolled elaboration: the function of a CALL (owned by the program) */
};

/* A dimension written in a declaration: a symbol name or a hole `_`. */
typedef struct nsr_dim {
    const char *name;     /* NULL for a hole */
    int line, col;
    int node;             /* check: union-find node */
} nsr_dim;

enum nsr_skind {
    NSR_S_PARAM,   /* param name = expr */
    NSR_S_WIDTH,   /* width n, m */
    NSR_S_USE,     /* use netsor+ */
    NSR_S_INPUT,   /* input x : d   |   input x[t in lo..hi] : d */
    NSR_S_ADECL,   /* A W[idx] : (rows, cols) ~ var */
    NSR_S_GDECL,   /* G b[idx] : n ~ N(mean, var) */
    NSR_S_DEF,     /* [G|H|scalar] h[idx] = expr */
    NSR_S_OUTPUT,  /* output y[idx] = readout(expr, var) */
    NSR_S_FOR      /* for t in lo..hi { body } */
};
enum nsr_annot { NSR_ANN_NONE, NSR_ANN_G, NSR_ANN_H, NSR_ANN_SCALAR };

typedef struct nsr_stmt nsr_stmt;
struct nsr_stmt {
    int kind;
    int line, col;
    const char *name;        /* declared / defined name; FOR: loop variable */
    int name_line, name_col;
    int nidx;
    nsr_expr **idx;          /* target indices (after desugaring binders to FOR) */
    nsr_expr *value;         /* PARAM default, DEF rhs, OUTPUT rhs (a readout call) */
    nsr_expr *mean, *var;    /* GDECL N(mean, var); ADECL var */
    nsr_dim rows, cols;      /* ADECL; GDECL and INPUT use rows */
    int annot;               /* DEF */
    nsr_expr *lo, *hi;       /* FOR, sequence INPUT */
    int range_start, range_end; /* FOR/INPUT: source span of "lo..hi" */
    int down;                /* FOR: 'lo..hi by -1', iterated from hi down to lo */
    int nnames;              /* WIDTH */
    const char **names;
    nsr_dim *dims;           /* WIDTH: positions */
    int nbody;
    nsr_stmt **body;         /* FOR */
    int fam;                 /* check: family / symbol id */
    int generated;           /* FOR made from a binder `h[t in 1..T] = ...` */
    int rolled;              /* FOR (roll.c): its iterations are independent, so it stays one
                              * index of a family instruction instead of being unrolled */
};

typedef struct nsr_ast {
    int nstmts;
    nsr_stmt **stmts;
} nsr_ast;

int nsr_parse(nsr_state *S, const nsr_token *toks, int ntoks, nsr_ast *ast);
/* Parse a `--set` value: one expression, nothing else. */
nsr_expr *nsr_parse_value(nsr_state *S, const char *text, int *status);

/* ---- Symbols and static check (check.c) ----------------------------------------------------- */
enum nsr_symkind {
    NSR_SYM_PARAM, NSR_SYM_WIDTH, NSR_SYM_DIM, NSR_SYM_INPUT,
    NSR_SYM_AFAM, NSR_SYM_GFAM, NSR_SYM_DFAM, NSR_SYM_OUT, NSR_SYM_LOOP, NSR_SYM_FUNC
};
typedef struct nsr_sym {
    const char *name;
    int kind;
    int line, col;           /* first declaration */
    int arity;               /* families: number of indices; -1 while unknown */
    int node, node2;         /* width nodes: vectors: node; A-vars: rows=node, cols=node2; INPUT: dim */
    const nsr_stmt *decl;    /* declaring statement */
    char ranges[160];        /* families: where members are defined, e.g. "0, 1..T" */
    int def_line;            /* first defining statement line (families) */
    int integer;             /* params: the declared default is integer arithmetic (counts,
                              * indices, 0/1 switches: param L = 3), not a real (2.0, 1e-5) */
} nsr_sym;

/* Union-find over dimension symbols and unknowns, each root remembering the symbol it is bound
 * to (rigid) and the fact that bound it (theory §6: unification with provenance). */
typedef struct nsr_uf {
    int parent;
    int rigid;        /* symbol id (WIDTH or DIM) or -1 */
    int hole;         /* 1 if created for a `_` */
    int line, col;    /* hole position */
} nsr_uf;

typedef struct nsr_check {
    nsr_state *S;
    nsr_sym *sym;
    int nsym, capsym;
    nsr_uf *uf;
    int nuf, capuf;
    int netsor_plus;       /* opts->netsor_plus or `use netsor+` */
    int input_sym;         /* -1 if none */
} nsr_check;

int nsr_check_program(nsr_state *S, nsr_ast *ast, nsr_check *C);
int nsr_sym_find(const nsr_check *C, const char *name);
int nsr_uf_new(nsr_check *C, int rigid);
int nsr_uf_find(nsr_check *C, int x);
/* Unify two nodes. On a clash, report "<what>: <fact_a> but <fact_b>; cannot unify X with Y".
 * fact_* may contain one "%s", replaced by the node's current symbol. */
int nsr_uf_unify(nsr_check *C, int a, int b, int line, int col, const char *what,
                 const char *fact_a, const char *fact_b);
const char *nsr_uf_show(nsr_check *C, int node); /* symbol name, or "_" */

/* ---- Elaboration (elab.c) ------------------------------------------------------------------- */
/* A member's name, "h[3]" / "a[1,2]" / "g" (ctx's allocator; NULL when out of memory). It keys the
 * member's random stream in both executors. */
char *nsr_member_name(tpk_ctx *ctx, const char *base, int nidx, const int *idx);
tpk_program *nsr_elaborate(nsr_state *S, nsr_ast *ast, nsr_check *C);

/* ---- Rolled elaboration (roll.c; elab.c in rolled mode) ------------------------------------
 * The rolled form of a program (issue 14): one family instruction per program statement and
 * value of its enclosing sequential loops (layers), carrying its index domain — the loops that
 * stay rolled — and its expression, whose index expressions are the index maps. The AST, the
 * symbols and the parameter values live on with the program; netsor/flimit.c evaluates it. */
#define NSR_MAX_FAMILY_INSTR 20000   /* beyond: keep the unrolled form only */
#define NSR_UNROLL_ESTIMATE 2000000L /* also elaborate unrolled below this many member steps
                                      * (the unrolled limit: what unrolled before still does) */
#define NSR_PLAN_BUDGET 3000000L     /* points the plan may visit at load; beyond, the first
                                      * evaluation plans (check stays O(text)) */

typedef struct nsr_finstr {
    const nsr_stmt *stmt;       /* DEF or OUTPUT */
    int nloops;                 /* domain: the rolled FORs around stmt, outermost first */
    const nsr_stmt *loop[NSR_MAX_INDICES];
    double *num;                /* values of the bound symbols (parameters, sequential loops) */
    long estimate;              /* member steps the unrolled elaboration would take (upper bound) */
} nsr_finstr;

enum { NSR_DM_AVAR, NSR_DM_GDECL };
typedef struct nsr_dmember {    /* a declared A-var or initial G-var member and its law */
    int sym, nidx, kind;
    int idx[NSR_MAX_INDICES];
    double mean, var;
} nsr_dmember;

typedef struct nsr_rolled {
    nsr_arena *arena;           /* the AST and the symbols; owned */
    nsr_check C;                /* C.S is NULL after loading */
    char *file;
    int nfi, capfi;
    nsr_finstr *fi;
    int ndm, capdm;
    nsr_dmember *dm;
    int input_lo;
    tpk_phi **phis;             /* the functions the statements call (owned) */
    int nphis;
    int *plan_last;             /* the load-time plan: each block's last use (−1: the end), or
                                 * NULL (not planned yet: each evaluation plans) */
    int nplan;
    int limit_unsup;            /* the rolled limit evaluator does not take this program (the
                                 * executor does): limit_why says why */
    char limit_why[TPK_MSG_MAX];
    int why_line, why_col;      /* where the unrolled form was given up (0: it exists) */
    char why[200];
    struct nsr_ir *ir;          /* its family IR (netsor/ir-impl.h), lowered at load */
    tpk_allocator al;           /* the load's: of this struct and its arrays (tpk/alloc.h) */
} nsr_rolled;

/* wrap(v, lo, hi): v moved into lo..hi by a multiple of its length (circular padding). */
static inline int nsr_wrap(int v, int lo, int hi)
{
    int n = hi - lo + 1;
    return lo + (((v - lo) % n) + n) % n;
}

/* Mark the FORs whose iterations are independent (s->rolled); returns how many. */
int nsr_roll_mark(nsr_check *C, nsr_ast *ast);
void nsr_rolled_free(nsr_rolled *r);
/* Width rules on the rolled form (for a program without the unrolled one): errors with
 * file:line:col through C->S. */
int nsr_roll_widths(nsr_check *C, const nsr_rolled *R);
/* Elaborate `ast` in rolled mode into r (the arena stays with r). */
int nsr_elaborate_rolled(nsr_state *S, nsr_ast *ast, nsr_check *C, tpk_program *p, nsr_rolled *r);

/* ---- IR helpers (program.c) ----------------------------------------------------------------- */
void nsr_rpn_free(const tpk_allocator *al, tpk_rpn *r);
const char *nsr_op_name(int op);

#endif
