/* The tangent program of the NTK (netsor/tangent.c; theory.md §8). Not installed. */
#ifndef TPK_NETSOR_TANGENT_IMPL_H
#define TPK_NETSOR_TANGENT_IMPL_H

#include "backend-impl.h"
#include "tpk/gauss.h"

/* The partial derivatives of a Nonlin's or a Moment's body: d[i] is the H-var ∂φ/∂g[i], ds[j]
 * the H-var ∂φ/∂s[j] for the scalars s[j] it reads (q's ids). A G-var has none here: its
 * tangent is read directly (its own partial is 1). The limit reads the G-var partials of
 * Nonlins only (scalars are constants of its tangent); the finite-width backward pass all. */
typedef struct nsr_partials {
    int n, ns;
    int *g, *d;
    int *s, *ds;
} nsr_partials;

typedef struct nsr_tangent {
    tpk_program *q;       /* the program with every Nonlin's partials after it (builder-owned) */
    nsr_partials *part;   /* per var of q */
    int cap;
    int one;              /* a constant Nonlin 1: the partial of a G-var by itself */
    int *kid;             /* per instruction of q: the instruction of p it copies (-1: added) */
    int nkid;             /* p's instruction count */
    tpk_phi **phis;       /* the derivatives φ′ the partials call (owned) */
    const tpk_phi **of;   /* ... of these φ */
    int nphis;
    const char *path;     /* p's file, for messages */
} nsr_tangent;


/* q from p (an unrolled program): the same instructions, variables and outputs (ids shifted by
 * the partials), Moments kept as they are. Errors: TPK_EUNSUPPORTED for bn(...), TPK_EDOM (from
 * tpk_phi_derivative) for a φ whose derivative is not a function (step, sign), TPK_ENOMEM. */
int nsr_tangent_build(const tpk_program *p, nsr_tangent *t, tpk_ctx *ctx);
void nsr_tangent_free(nsr_tangent *t, tpk_ctx *ctx);

#endif
