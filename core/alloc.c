/* The allocator hook (tpk/alloc.h): the default, the context's, and the checked helpers. */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "tpk/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Large blocks (the evaluator's N×N kernel blocks, 32 MB at N = 2000) come from the C library
 * as fresh mappings, faulted in 4 KB at a time when first written: a 2 × 1000-token transformer
 * took 90 000 page faults, more system time than the run's own. Where the kernel gives
 * transparent huge pages on request (/sys/kernel/mm/transparent_hugepage/enabled = madvise),
 * the block's whole 2 MB pages are asked for (that transformer: 48 500 faults, 0.515 → 0.410 s;
 * the rest are smaller blocks and the edges); elsewhere the call is a no-op or fails
 * harmlessly. */
#define HUGE_MIN ((size_t)8 << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

static void *ask_huge(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
    if (p != NULL && n >= HUGE_MIN) {
        uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        uintptr_t b = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
        if (b > a)
            (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
    }
#else
    (void)n;
#endif
    return p;
}

void *tpk_alloc_default(void *ud, void *ptr, size_t nsize)
{
    (void)ud;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    return ptr == NULL ? ask_huge(malloc(nsize), nsize) : realloc(ptr, nsize);
}

void tpk_ctx_set_allocator(tpk_ctx *ctx, tpk_alloc_fn fn, void *ud)
{
    ctx->alloc.fn = fn;
    ctx->alloc.ud = fn ? ud : NULL;
}

tpk_allocator tpk_ctx_allocator(const tpk_ctx *ctx)
{
    tpk_allocator none = {NULL, NULL};
    return ctx ? ctx->alloc : none;
}

/* The one place the hook is called. */
static void *hook(const tpk_allocator *al, void *p, size_t n)
{
    if (al != NULL && al->fn != NULL)
        return al->fn(al->ud, p, n);
    return tpk_alloc_default(NULL, p, n);
}

void *tpk_mem_realloc(const tpk_allocator *al, void *p, size_t n, tpk_ctx *ctx)
{
    void *q = hook(al, p, n ? n : 1);
    if (q == NULL)
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu bytes)", n);
    return q;
}

void *tpk_mem_malloc(const tpk_allocator *al, size_t n, tpk_ctx *ctx)
{
    return tpk_mem_realloc(al, NULL, n, ctx);
}

void *tpk_mem_calloc(const tpk_allocator *al, size_t count, size_t size, tpk_ctx *ctx)
{
    if (size != 0 && count > SIZE_MAX / size) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu blocks of %zu bytes overflow the address "
                  "space)", count, size);
        return NULL;
    }
    size_t n = count * size;
    if (al == NULL || al->fn == NULL || al->fn == tpk_alloc_default) {
        /* the C library's calloc: a large block comes as fresh zero pages that are faulted in
         * when first written, where malloc + memset touches every page now (a 32 MB scratch
         * block that stays mostly unwritten cost a full page-fault pass each time) */
        void *p = ask_huge(calloc(n > 0 ? count : 1, n > 0 ? size : 1), n);
        if (p == NULL)
            TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu bytes)", n);
        return p;
    }
    void *p = tpk_mem_realloc(al, NULL, n, ctx);
    if (p != NULL)
        memset(p, 0, n > 0 ? n : 1);
    return p;
}

void tpk_mem_free(const tpk_allocator *al, void *p)
{
    if (p != NULL)
        hook(al, p, 0);
}

void *tpk_malloc(tpk_ctx *ctx, size_t n)
{
    return tpk_mem_realloc(ctx ? &ctx->alloc : NULL, NULL, n, ctx);
}

void *tpk_realloc(tpk_ctx *ctx, void *p, size_t n)
{
    return tpk_mem_realloc(ctx ? &ctx->alloc : NULL, p, n, ctx);
}

void *tpk_reallocarray(tpk_ctx *ctx, void *p, size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu blocks of %zu bytes overflow the address "
                  "space)", count, size);
        return NULL;
    }
    return tpk_realloc(ctx, p, count * size);
}

void *tpk_calloc(tpk_ctx *ctx, size_t count, size_t size)
{
    return tpk_mem_calloc(ctx ? &ctx->alloc : NULL, count, size, ctx);
}

char *tpk_strndup(tpk_ctx *ctx, const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = tpk_malloc(ctx, len + 1);
    if (d != NULL) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

char *tpk_strdup(tpk_ctx *ctx, const char *s)
{
    return tpk_strndup(ctx, s, SIZE_MAX);
}

void tpk_free(tpk_ctx *ctx, void *p)
{
    tpk_mem_free(ctx ? &ctx->alloc : NULL, p);
}

/* Aligned blocks: the hook's block holds, in front of the aligned part, the offset back to its
 * start (the hook guarantees only malloc's alignment). */
void *tpk_aligned_alloc(tpk_ctx *ctx, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0 || align > 4096) {
        TPK_ERROR(ctx, TPK_EINVAL, "alignment %zu is not a power of two in %zu..4096", align,
                  sizeof(void *));
        return NULL;
    }
    if (n > SIZE_MAX - align - sizeof(size_t)) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu bytes overflow the address space)", n);
        return NULL;
    }
    unsigned char *raw = tpk_malloc(ctx, n + align + sizeof(size_t));
    if (raw == NULL)
        return NULL;
    uintptr_t start = (uintptr_t)(raw + sizeof(size_t));
    unsigned char *p = raw + sizeof(size_t) + ((align - start % align) % align);
    size_t off = (size_t)(p - raw);
    memcpy(p - sizeof(size_t), &off, sizeof off);
    return p;
}

void tpk_mem_aligned_free(const tpk_allocator *al, void *p)
{
    if (p == NULL)
        return;
    size_t off;
    memcpy(&off, (unsigned char *)p - sizeof(size_t), sizeof off);
    tpk_mem_free(al, (unsigned char *)p - off);
}

void tpk_aligned_free(tpk_ctx *ctx, void *p)
{
    tpk_mem_aligned_free(ctx ? &ctx->alloc : NULL, p);
}
