/* IDX reader (the MNIST / Fashion-MNIST format), plain or gzip-compressed, into float64 arrays. */
#ifndef TPK_IDX_H
#define TPK_IDX_H

#include "array.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Read an IDX file: magic 0x00 0x00 TYPE RANK, RANK big-endian uint32 dimensions, then the values
 * big-endian in row-major order. TYPE: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
 * 0x0D float32, 0x0E float64. gzip or plain (zlib's gzopen reads both). RANK must be 1..4.
 * max_items > 0 keeps only the first max_items items along axis 0 (the rest is not read).
 * TPK_EIO: cannot open; TPK_EFORMAT: bad magic, type, rank, truncated or corrupt data. */
TPK_API tpk_array *tpk_idx_read(const char *path, size_t max_items, tpk_ctx *ctx);

/* 1 if the path looks like an IDX file by name: ends in "-ubyte", "-ubyte.gz", ".idx" or
 * ".idx.gz" (tools use this to pick the reader). */
TPK_API int tpk_idx_name_matches(const char *path);

#ifdef __cplusplus
}
#endif
#endif
