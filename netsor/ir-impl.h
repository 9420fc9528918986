/* The family IR of a rolled NETSOR program: each family instruction's expression lowered once
 * into instructions of a small fixed set of kinds, which every back end of the rolled form
 * consumes (docs/architecture.md "The family IR"). Built at load by netsor/ir.c, checked by
 * netsor/ir_verify.c, printed by netsor/ir_print.c (`netsor dump --ir`). Not installed.
 *
 * Shape. The IR of a program is one array of instructions (nodes) in evaluation order: the
 * nodes of family instruction k occupy [first, first + count) and its root — DEF or OUTPUT — is
 * the last of them. Every other node is the operand of exactly one later node of the same
 * family instruction (a tree per statement, stored in post-order), so a back end either walks
 * the tree from the root or the array in order, and a pass that needs the reverse order (a
 * backward program) has it. A node's value lives on the family instruction's domain (its rolled
 * loops), extended by the binders of the index sums and softmaxes around it (its scope).
 *
 * Weights are named: a MATMUL carries the A-var family it multiplies, with its index
 * expressions, and a site number unique in the program; the uses table (nsr_ir_uses) resolves
 * each site to the declared members it reads, so that tied uses of one weight (a recurrence)
 * are explicit. The member-level case is the same IR with domains of one point. */
#ifndef TPK_NETSOR_IR_IMPL_H
#define TPK_NETSOR_IR_IMPL_H

#include "family-impl.h"

#include <stdio.h>

/* Instruction kinds (listed once: the names nsr_ir_op_name prints follow this order). */
#define NSR_IR_OPS(X)                                                                          \
    X(NUM, "num")         /* a number of the index world: literal, parameter, loop index,     \
                           * mod/wrap/inside; evaluated by the family machinery (e)          */ \
    X(SQRTN, "sqrtn")     /* sqrt(width): only as a factor of a 1/sqrt(n) logit               */ \
    X(READ, "read")       /* members of a family (defined, or declared G-vars) at e's indices */ \
    X(INPUT, "input")     /* an input slot x[t]: the operand of an embedding MATMUL only      */ \
    X(MATMUL, "matmul")   /* weight[e's indices] · arg0                                       */ \
    X(MAP, "map")         /* φ(arg0), entrywise                                                */ \
    X(BN, "bn")           /* bn(arg0[, batch]): normalised across the batch (theory §2.5)     */ \
    X(LIN, "lin")         /* Σ_i sign_i · arg_i (left to right; a LinComb)                     */ \
    X(MUL, "mul")         /* arg0 · arg1: a scaling, scalar arithmetic, or (both vectors) a   \
                           * product of G-vars: a Nonlin of several arguments (gates)         */ \
    X(DIV, "div")         /* arg0 / arg1                                                       */ \
    X(POW, "pow")         /* arg0 ^ (e->b, a number)                                           */ \
    X(SUM, "sum")         /* Σ over the binder of e (lo..hi) of arg0                           */ \
    X(SOFTMAX, "softmax") /* softmax over e's binder of arg0 (scalars), at the enclosing index */ \
    X(MOMENT, "moment")   /* mean(arg0) over the n coordinates (NETSOR+)                       */ \
    X(UNSUP, "unsup")     /* a form no rolled back end takes; why says what it is              */ \
    X(DEF, "def")         /* the statement's family members over the domain = arg0             */ \
    X(OUTPUT, "output")   /* readout(arg0, σ_v² = arg1, bias σ² = arg2 or none)                 */

enum nsr_ir_op {
#define NSR_IR_ENUM(name, text) NSR_IR_##name,
    NSR_IR_OPS(NSR_IR_ENUM)
#undef NSR_IR_ENUM
    NSR_IR_NOPS
};

/* Static types (the NETSOR types of theory §1.1 plus the index world). ZERO is the literal 0 as
 * a member (zero padding): it joins any type. G is a linear combination of MatMul outputs and
 * initial G-vars (Gaussian in the limit); H is any other vector. */
enum nsr_ir_type {
    NSR_TY_NONE,    /* roots, and reads of a family not defined yet (an evaluation error) */
    NSR_TY_ZERO,
    NSR_TY_NUM,     /* deterministic: the same for every input */
    NSR_TY_SCALAR,  /* a NETSOR+ scalar (per input) */
    NSR_TY_G,
    NSR_TY_H,
    NSR_TY_MIXED    /* scalar and vector members in one family (evaluation refuses it) */
};

#define NSR_IR_MAXARG 3

typedef struct nsr_irn {
    int op;                  /* enum nsr_ir_op */
    int type;                /* enum nsr_ir_type of the value */
    int fi;                  /* family instruction */
    int narg;
    int arg[NSR_IR_MAXARG];  /* operand nodes (LIN: the first three terms; more in terms) */
    int nterms;              /* LIN */
    int *terms;              /* LIN: operand nodes, nterms */
    signed char *sign;       /* LIN: +1 / −1 per term */
    const nsr_expr *e;       /* source node: position; the indices (READ, MATMUL weight, NUM),
                              * the binder (SUM, SOFTMAX), the exponent (POW), the function */
    const nsr_stmt *s;       /* DEF, OUTPUT: the statement (target, indices, annotation) */
    int sym;                 /* READ: family symbol; MATMUL: the weight's A-var family symbol;
                              * SUM/SOFTMAX: binder symbol; DEF: target family */
    int site;                /* MATMUL: its number in the program (0, 1, ...) */
    int embed;               /* MATMUL: arg0 is an INPUT */
    int gates;               /* MUL/DIV/POW of vectors: a Nonlin of several G-vars (gate) */
    int in_moment;           /* inside the body of a mean(): products of vectors are moments */
    int scope;               /* binders enclosing this node (SUM/SOFTMAX nesting depth) */
    const tpk_phi *phi;      /* MAP */
    const char *why;         /* UNSUP: what the form is */
} nsr_irn;

typedef struct nsr_irfi {
    int first, count;        /* nodes [first, first + count); root = first + count − 1 */
} nsr_irfi;

typedef struct nsr_ir {
    int nn, capn;
    nsr_irn *n;
    int nfi;
    nsr_irfi *fi;            /* parallel to nsr_rolled.fi */
    int nsites;              /* MATMUL nodes */
    tpk_allocator al;
} nsr_ir;

/* Lower the rolled form R (checked, elaborated) into its IR. Errors: out of memory only (every
 * form the checker accepts lowers; forms no back end takes become UNSUP nodes). */
int nsr_ir_lower(const nsr_rolled *R, nsr_ir **out, tpk_ctx *ctx);
void nsr_ir_free(nsr_ir *ir);
const char *nsr_ir_op_name(int op);
/* What a node no rolled back end takes is, for messages: "'bn(...)'" for a call, else its why. */
const char *nsr_ir_unsup_text(const nsr_irn *n, char *buf, size_t cap);
const char *nsr_ir_type_name(int type);
static inline int nsr_ir_root(const nsr_ir *ir, int k)
{
    return ir->fi[k].first + ir->fi[k].count - 1;
}
static inline int nsr_ir_is_vector(int type)
{
    return type == NSR_TY_G || type == NSR_TY_H;
}

/* The type of node n from its operands' types (famtype: the current type of each family, for
 * READ), and n->gates where an arithmetic node takes two vectors (or divides by one, or raises
 * one to a power other than 1): a Nonlin of several G-vars. Shared by the lowering and the
 * verifier, which recomputes every type. */
void nsr_ir_type_node(const nsr_ir *ir, nsr_irn *n, const int *famtype, const nsr_check *C);
/* The type of a family read whose members have types a and b (ZERO and NONE join anything). */
int nsr_ir_type_join(int a, int b);
/* The family type a definition gives its members: a literal 0 is a zero member (padding) unless
 * the statement says scalar; numbers are scalars (a block per input). */
int nsr_ir_def_type(const nsr_ir *ir, const nsr_irn *def);

/* The verifier: the structural rules above (post-order, one use per node, roots, operands in the
 * same family instruction), each kind's arity and operand types, the types recomputed from the
 * operands, the sites numbered once. TPK_EINVAL "IR node %k (...): what is wrong" at the first
 * violation. */
int nsr_ir_verify(const nsr_rolled *R, const nsr_ir *ir, tpk_ctx *ctx);

/* The weights and their uses. Each MATMUL site reads one declared member of its A-var family
 * (its indices read no index of the site's scope) or one per point of its scope (convolution
 * taps, whose filter changes with the binder): the members are found by enumerating the scope.
 * A member used at more than one site is tied (a recurrence: the same W at every step). */
typedef struct nsr_ir_site {
    int node;                /* the MATMUL */
    int varies;              /* the member changes over the scope */
    int nmembers;            /* declared members it reads (ascending indices into R->dm); −1:
                              * not enumerated (a scope above NSR_IR_USES_MAX points) */
    int *members;
} nsr_ir_site;
#define NSR_IR_USES_MAX 4000000L
typedef struct nsr_ir_uses {
    int nsites;
    nsr_ir_site *site;       /* in site order */
    int *nuses;              /* per declared member (R->ndm): sites reading it */
    int ntied;               /* members with nuses > 1 */
} nsr_ir_uses;
int nsr_ir_uses_of(const tpk_program *p, const nsr_ir *ir, nsr_ir_uses *u, tpk_ctx *ctx);
void nsr_ir_uses_free(nsr_ir_uses *u, tpk_ctx *ctx);

/* Does the rolled limit evaluator refuse the program's structure (ir_support.c)? 1: yes, why =
 * "file:line:col: reason" (the first refused form in evaluation order: a tied weight, a gate
 * product, bn, sqrt(n) logits, ...); 0: no; −1: out of memory (ctx). */
int nsr_ir_limit_refusal(const tpk_program *p, char *why, size_t cap, tpk_ctx *ctx);

/* The IR as text: per family instruction its statement, bound symbols and domain, then one line
 * per node ("%4 = matmul W[l] %3 : G  site 2  @25:12"); then the weights and their uses. */
int nsr_ir_print(const tpk_program *p, FILE *f, tpk_ctx *ctx);
/* An AST expression as text (the IR printer's operand text, the verifier's messages). */
void nsr_expr_text(const nsr_expr *e, char *buf, size_t cap);

#endif
