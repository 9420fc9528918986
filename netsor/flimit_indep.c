/* Structural independence in the rolled limit evaluator: the roots each block depends on (every
 * MatMul, embedding and initial G-var starts one, theory §1.6), member by member for the initial
 * G-var families. */
#include "flimit-impl.h"

#include <stdint.h>

void nsr_fl_anc_root(fblock *b, int self)
{
    b->nanc = 1;
    b->anc[0] = self;
}

void nsr_fl_anc_union(fblock *b, const fblock *o)
{
    if (b->nanc < 0 || o->nanc < 0) {
        b->nanc = -1;
        return;
    }
    for (int i = 0; i < o->nanc; i++) {
        int j = 0;
        while (j < b->nanc && b->anc[j] != o->anc[i])
            j++;
        if (j < b->nanc)
            continue;
        if (b->nanc == MAXANC) {
            b->nanc = -1;
            return;
        }
        b->anc[b->nanc++] = o->anc[i];
    }
}

/* Members of an initial G-var family (one BK_BIAS block, say b[l in 1..L]) are independent of
 * each other (theory §1.2), so a block made from b[2] is not correlated with a later read of
 * b[3]: such a block remembers the members it read, as ancestors of their own, −2 − (block·2¹⁶
 * + member); the block's own number stands for all of its members. */
#define ANC_MEMBERS 65536

static int anc_member(int blk, long mem)
{
    return blk < INT32_MAX / ANC_MEMBERS - 1 && mem >= 0 && mem < ANC_MEMBERS
               ? -2 - (blk * ANC_MEMBERS + (int)mem)
               : -1;
}

static int anc_block(int id) { return id >= 0 ? id : (-id - 2) / ANC_MEMBERS; }

static void anc_add(fblock *b, int id)
{
    if (b->nanc < 0)
        return;
    for (int j = 0; j < b->nanc; j++)
        if (b->anc[j] == id)
            return;
    if (b->nanc == MAXANC) {
        b->nanc = -1;
        return;
    }
    b->anc[b->nanc++] = id;
}

/* Block-level: conservative (a member ancestor meets its whole block, and vice versa). */
int nsr_fl_correlated(const fblock *x, const fblock *y)
{
    if (x->nanc < 0 || y->nanc < 0)
        return 1;
    for (int i = 0; i < x->nanc; i++)
        for (int j = 0; j < y->nanc; j++) {
            int a = x->anc[i], c = y->anc[j];
            if (a == c || ((a < 0) != (c < 0) && anc_block(a) == anc_block(c)))
                return 1;
        }
    return 0;
}

/* The ancestors a value term brings: the members it reads of an initial G-var family, else its
 * block's. m: the term's points. */
void nsr_fl_anc_union_term(const fl *F, fblock *b, const term *t, long m)
{
    const fblock *o = &F->b[t->blk];
    if (o->kind != BK_BIAS || t->dense || o->nanc != 1 || o->anc[0] != t->blk) {
        nsr_fl_anc_union(b, o);
        return;
    }
    for (long p = 0; p < m && b->nanc >= 0; p++)
        if (t->idx[p] >= 0) {
            int id = anc_member(t->blk, t->idx[p]);
            if (id == -1) {
                nsr_fl_anc_union(b, o);
                return;
            }
            anc_add(b, id);
        }
}

/* Block x against term s (m points): as correlated(), but a read of members of an initial G-var
 * family meets x only where x has read one of those members (or the whole family). */
int nsr_fl_term_correlated(const fl *F, const fblock *x, const term *s, long m)
{
    const fblock *y = &F->b[s->blk];
    if (y->kind != BK_BIAS || s->dense || y->nanc != 1 || y->anc[0] != s->blk || x->nanc < 0)
        return nsr_fl_correlated(x, y);
    for (int i = 0; i < x->nanc; i++)
        if (x->anc[i] == s->blk)
            return 1;
    for (long p = 0; p < m; p++)
        if (s->idx[p] >= 0) {
            int id = anc_member(s->blk, s->idx[p]);
            if (id == -1)
                return nsr_fl_correlated(x, y);
            for (int i = 0; i < x->nanc; i++)
                if (x->anc[i] == id)
                    return 1;
        }
    return 0;
}

/* Terms t (mt points) and s (ms points) on different blocks known independent at the member
 * level (pair_m2's indep): a read of initial G-var members the other block never read. */
int nsr_fl_terms_indep(const fl *F, const term *t, long mt, const term *s, long ms)
{
    if (F->b[s->blk].kind == BK_BIAS)
        return !nsr_fl_term_correlated(F, &F->b[t->blk], s, ms);
    if (F->b[t->blk].kind == BK_BIAS)
        return !nsr_fl_term_correlated(F, &F->b[s->blk], t, mt);
    return 0;
}
