/* Memory: every allocation of libtpk goes through one hook, set on the tpk_ctx (as Lua's lua_Alloc,
 * so that tests can make the n-th allocation fail). docs/architecture.md "Memory" has the rules. */
#ifndef TPK_ALLOC_H
#define TPK_ALLOC_H

#include <stddef.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rules (the hook itself, tpk_alloc_fn, is in tpk/error.h beside the context it lives in):
 *  - A call allocates through its ctx's allocator (ctx NULL: the default). A NULL from the hook
 *    is TPK_ENOMEM with "out of memory (N bytes)" in ctx, and the call returns that status with
 *    everything it had allocated freed again.
 *  - An object (tpk_array, tpk_program, tpk_gp, tpk_phi_registry, every _alloc of the API)
 *    remembers the allocator it was made with; its _free, and any later growth of it, uses that
 *    one, whatever ctx a later call passes. A tpk_array the caller fills in by hand (zeroed
 *    `alloc`) belongs to the default allocator.
 *  - Allocations the library cannot route (kept by the libraries it calls) do not go through the
 *    hook: HDF5's own (H5Fcreate, H5Dread's conversion buffers, ...), GSL's workspaces, the
 *    integration tables, gsl_rng and the minimisers, LAPACKE's and OpenBLAS's internal work
 *    arrays, FFTW's plans, zlib's gzopen state. A failure there is still TPK_ENOMEM (or the
 *    library's status turned into a TPK_ one), but a hook cannot inject it.
 * The helpers below are what the library's own code calls; programs built on libtpk may use
 * them too (a buffer the library will free, a hook that counts). */

/* n bytes (n = 0 asks for 1) from ctx's allocator; NULL and TPK_ENOMEM in ctx when it fails. */
TPK_API void *tpk_malloc(tpk_ctx *ctx, size_t n);
/* count × size zeroed bytes; NULL and TPK_ENOMEM when it fails or the product overflows. */
TPK_API void *tpk_calloc(tpk_ctx *ctx, size_t count, size_t size);
/* Resize p (NULL: allocate) to n bytes; on failure NULL, TPK_ENOMEM, and p is left as it was. */
TPK_API void *tpk_realloc(tpk_ctx *ctx, void *p, size_t n);
/* tpk_realloc to count × size bytes, with the overflow check of tpk_calloc. */
TPK_API void *tpk_reallocarray(tpk_ctx *ctx, void *p, size_t count, size_t size);
/* A copy of the string s (of at most n bytes of it for tpk_strndup), NUL-terminated. */
TPK_API char *tpk_strdup(tpk_ctx *ctx, const char *s);
TPK_API char *tpk_strndup(tpk_ctx *ctx, const char *s, size_t n);
/* Give back a block of ctx's allocator; NULL is a no-op. */
TPK_API void tpk_free(tpk_ctx *ctx, void *p);
/* n bytes aligned to `align` (a power of two, at most 4096) from ctx's allocator, for SIMD
 * kernels' workspaces: a larger block of the hook with the aligned part handed out. Give it back
 * with tpk_aligned_free (never tpk_free). */
TPK_API void *tpk_aligned_alloc(tpk_ctx *ctx, size_t align, size_t n);
TPK_API void tpk_aligned_free(tpk_ctx *ctx, void *p);

/* The same on an allocator an object remembers (al NULL or zeroed: the default), for _free
 * functions, which take no context, for growing an object, and inside parallel regions (threads
 * must not write one ctx at once: there ctx is NULL and the caller reports afterwards). Errors go
 * to ctx when it is not NULL. tpk_ctx_allocator is the allocator of ctx (the default for NULL),
 * to store in an object. */
TPK_API tpk_allocator tpk_ctx_allocator(const tpk_ctx *ctx);
/* The address of ctx's allocator for the tpk_mem_* forms (NULL for a NULL ctx: the default). */
#define TPK_ALLOCATOR_OF(ctx) ((ctx) != NULL ? &(ctx)->alloc : NULL)
TPK_API void *tpk_mem_malloc(const tpk_allocator *al, size_t n, tpk_ctx *ctx);
TPK_API void *tpk_mem_calloc(const tpk_allocator *al, size_t count, size_t size, tpk_ctx *ctx);
TPK_API void *tpk_mem_realloc(const tpk_allocator *al, void *p, size_t n, tpk_ctx *ctx);
TPK_API void tpk_mem_free(const tpk_allocator *al, void *p);
TPK_API void tpk_mem_aligned_free(const tpk_allocator *al, void *p);

#ifdef __cplusplus
}
#endif
#endif
