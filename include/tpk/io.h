/* Input readers (HDF5, .npy, CSV) and the atomic, self-describing HDF5 writer. */
#ifndef TPK_IO_H
#define TPK_IO_H

#include "array.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where an input came from; written into output attributes. */
typedef struct tpk_input_info {
    char path[1024];
    char dataset[256];  /* HDF5 dataset path, "" for .npy/CSV */
    char format[8];     /* "hdf5", "npy", "csv" */
    char sha256[65];    /* hex SHA-256 of the float64 row-major data as loaded (format-independent) */
} tpk_input_info;

/* Read "file.h5:/dataset", "file.npy", "file.npz:name" or "file.csv" (numbers, optional header
 * line, no ragged rows) into float64. Rank 2 (N×d) .. 4. Non-finite values are rejected with
 * TPK_EDOM naming the first bad position. `info` may be NULL.
 * Details: a rank-1 array (HDF5 or .npy) is read as N×1, with a note (tpk_note); a CSV's first
 * line is a header only when none of its fields is a number (with a note; a line mixing numbers
 * and words is TPK_EFORMAT naming the column); rank 0, rank >= 5 and empty arrays are
 * TPK_EFORMAT. HDF5 datasets of any integer or float type are converted to float64; .npy (and
 * each .npz member, stored or deflated as np.savez / np.savez_compressed write them) accepts
 * every real dtype: float16/32/64, signed and unsigned integers of 1, 2, 4 and 8 bytes (beyond
 * 2^53 they round), bool; either byte order; C or Fortran order; header versions 1..3. Other
 * dtypes (complex, strings, records) are TPK_EFORMAT naming the dtype. In "file.npz:name" the
 * name may be left out when the archive holds one array. A CSV is always rank 2.
 * "file.h5" without ":/dataset" is TPK_EINVAL, with the file's datasets listed. While inside
 * HDF5 the library's own error printing is switched off and then restored (process state: call
 * HDF5 from one thread at a time). */
TPK_API tpk_array *tpk_io_read(const char *spec, tpk_input_info *info, tpk_ctx *ctx);

/* A string attribute `key` of the object `obj` ("/" for the root, or a dataset or group path) of
 * the HDF5 file at `path`, as tpk_h5out_attr_str writes it (variable-length UTF-8; fixed-length
 * strings are read too), into buf (cap bytes with the NUL). TPK_EIO: the file cannot be read;
 * TPK_EFORMAT: not an HDF5 file, or the attribute is not a string; TPK_ENOTFOUND: no such object
 * or attribute; TPK_EINVAL: the value does not fit in cap. */
TPK_API int tpk_io_read_attr_str(const char *path, const char *obj, const char *key, char *buf,
                                 size_t cap, tpk_ctx *ctx);

/* The whole file at path as text (NUL-terminated; *len, may be NULL, gets its bytes), allocated
 * by ctx's allocator: free it with tpk_free(ctx, text). NULL with TPK_EIO (cannot be read, a
 * folder) or TPK_ENOMEM. A program's text for provenance (its bytes and their SHA-256). */
TPK_API char *tpk_io_read_text(const char *path, size_t *len, tpk_ctx *ctx);

/* SHA-256 of n bytes as 64 hex digits + NUL. */
TPK_API void tpk_sha256_hex(const void *data, size_t n, char out[65]);
/* SHA-256 of an array's float64 values as little-endian bytes in row-major order (the same
 * fingerprint tpk_io_read puts in info->sha256), as 64 hex digits + NUL. */
TPK_API void tpk_sha256_array_hex(const tpk_array *a, char out[65]);

/* TPK_EINVAL when `output` names the same file as one of the n input specs ("f.h5:/x" counts as
 * f.h5), compared by device and inode (through symlinks, hard links and other spellings), so that
 * writing the output would destroy an input; NULL or empty entries are skipped, and an output
 * that does not exist yet clashes with nothing. Every writer calls it before tpk_h5out_open. */
TPK_API int tpk_io_check_output(const char *output, const char *const *inputs, size_t n,
                                tpk_ctx *ctx);

/* Whether an output may replace what is at `path` (issue 39, item 4: --output=notes.txt
 * replaced a text file with HDF5 without a word): TPK_OK when nothing is there, when it is an HDF5
 * file this toolkit wrote (a root attribute toolkit_version, as tpk_h5out_provenance writes), or
 * with force; else TPK_EINVAL with a message that says what the file is and names --force, and
 * the file is not touched. A folder is TPK_EIO (never replaced). Every program that writes an
 * output calls it before any work, with its --force flag. */
TPK_API int tpk_h5out_check_replace(const char *path, int force, tpk_ctx *ctx);

/* Atomic HDF5 output: everything goes to a hidden temporary file in the destination folder,
 * which replaces `path` only on tpk_h5out_commit. An error or abort leaves `path` untouched. */
typedef struct tpk_h5out tpk_h5out;
TPK_API tpk_h5out *tpk_h5out_open(const char *path, tpk_ctx *ctx);
/* Write a float64 dataset (any rank) at an absolute path like "/kernel" or "/group/x"
 * (groups are created as needed). A NaN or infinite entry is TPK_EDOM naming the dataset and the
 * entry, and fails the file (commit refuses it): a non-finite number is a failed computation,
 * never a result. The same holds for tpk_h5out_write_vector and tpk_h5out_attr_double. */
TPK_API int tpk_h5out_write(tpk_h5out *out, const char *name, const tpk_array *a, tpk_ctx *ctx);
/* A vector of n doubles as a rank-1 dataset (tpk_h5out_write without building an array). */
TPK_API int tpk_h5out_write_vector(tpk_h5out *out, const char *name, const double *v, size_t n,
                                   tpk_ctx *ctx);
TPK_API int tpk_h5out_write_ints(tpk_h5out *out, const char *name, const long long *v, size_t n,
                                 tpk_ctx *ctx);
/* Name the axes of a dataset written earlier, netCDF-4 style, so that xarray / h5netcdf / netCDF
 * read named dimensions: axis k gets the dimension names[k], an HDF5 dimension scale "/NAME" on
 * the root holding 0 .. len−1 as int64 (a coordinate), created on first use and shared by every
 * dataset that names it. ndims must be the dataset's rank; names are [A-Za-z_][A-Za-z0-9_]*.
 * TPK_EINVAL: a bad name, the rank, an axis whose length differs from the dimension's, a root
 * object of that name that is not a dimension scale; TPK_ENOTFOUND: no such dataset. Any error
 * fails the file (tpk_h5out_commit refuses it). */
TPK_API int tpk_h5out_dims(tpk_h5out *out, const char *name, const char *const *names, int ndims,
                           tpk_ctx *ctx);
/* 1 when the output has an object (dataset, group, dimension) at the absolute path `name`,
 * else 0 (also for a closed output or a malformed name). */
TPK_API int tpk_h5out_has(tpk_h5out *out, const char *name);
/* A dimension with coordinates: the dimension scale "/NAME" holding v[0..n-1], int64
 * (tpk_h5out_coord_ints: widths, seeds, input rows), float64 (tpk_h5out_coord_doubles, finite)
 * or variable-length UTF-8 strings (tpk_h5out_coord_labels: the field names of a record), for
 * tpk_h5out_dims to attach afterwards instead of 0 .. n−1. xarray shows them as the coordinate
 * of that dimension. TPK_EINVAL: a bad name, n = 0, a NULL label, a dimension of that name made
 * already; TPK_EDOM: a non-finite double. Any error fails the file. */
TPK_API int tpk_h5out_coord_ints(tpk_h5out *out, const char *name, const long long *v, size_t n,
                                 tpk_ctx *ctx);
TPK_API int tpk_h5out_coord_doubles(tpk_h5out *out, const char *name, const double *v, size_t n,
                                    tpk_ctx *ctx);
TPK_API int tpk_h5out_coord_labels(tpk_h5out *out, const char *name, const char *const *labels,
                                   size_t n, tpk_ctx *ctx);
/* Attributes on "/" or on a dataset/group written earlier. */
TPK_API int tpk_h5out_attr_str(tpk_h5out *out, const char *obj, const char *key, const char *val,
                               tpk_ctx *ctx);
TPK_API int tpk_h5out_attr_double(tpk_h5out *out, const char *obj, const char *key, double val,
                                  tpk_ctx *ctx);
TPK_API int tpk_h5out_attr_int(tpk_h5out *out, const char *obj, const char *key, long long val,
                               tpk_ctx *ctx);
/* An attribute from text: a double when `value` parses as a finite one, else a string. */
TPK_API int tpk_h5out_attr_auto(tpk_h5out *out, const char *obj, const char *key, const char *value,
                                tpk_ctx *ctx);
/* Root attributes every output carries: toolkit_version, command_line (argv joined, shell-quoted),
 * created (ISO 8601 UTC). */
TPK_API int tpk_h5out_provenance(tpk_h5out *out, int argc, char **argv, tpk_ctx *ctx);
/* Input attributes under a prefix ("input" or "test"): <prefix>_file, <prefix>_dataset,
 * <prefix>_format, <prefix>_sha256, <prefix>_shape. */
TPK_API int tpk_h5out_input_attrs(tpk_h5out *out, const char *prefix, const tpk_input_info *info,
                                  const tpk_array *a, tpk_ctx *ctx);
/* A NETSOR program's provenance as root attributes (issue 39, item 9): program_text (its text, as
 * run) and program_sha256 (the hex SHA-256 of those bytes), so that an output stays reproducible
 * when the .nsr file changes later. text: the program's text, or NULL to read the file at path
 * (tpk_io_read_text). */
TPK_API int tpk_h5out_program_attrs(tpk_h5out *out, const char *path, const char *text,
                                    tpk_ctx *ctx);
/* Flush, close, fsync and rename into place; frees `out` whatever happens. Refuses (TPK_EIO,
 * temporary removed, `path` untouched) if any earlier write or attribute call on `out` failed. */
TPK_API int tpk_h5out_commit(tpk_h5out *out, tpk_ctx *ctx);
/* Remove the temporary file and free. NULL is a no-op. */
TPK_API void tpk_h5out_abort(tpk_h5out *out);
/* Remove the temporary file of every output still open, for a program's own signal handler
 * (async-signal-safe: unlink() only; nothing is freed). tpk_h5out_open installs a handler that
 * does this and exits 128 + signal on SIGINT, SIGTERM and SIGHUP wherever those still have their
 * default action; a program that handles them itself calls this before it exits. */
TPK_API void tpk_h5out_remove_temps(void);
/* Finish a file another writer made (gpkernel-mpi's parallel HDF5 phase, docs/scale-out.md):
 * open the existing HDF5 file `tmp`, which must be in the folder of `path`, read-write as the
 * temporary of an atomic output to `path`. Every call above works on it; tpk_h5out_commit
 * flushes, fsyncs and renames it onto `path`. Unlike tpk_h5out_open's temporary, tmp is the
 * caller's: tpk_h5out_abort and a failed commit close it and leave it where it is.
 * TPK_EINVAL: tmp elsewhere; TPK_EFORMAT: not an HDF5 file; TPK_EIO: cannot be opened. */
TPK_API tpk_h5out *tpk_h5out_adopt(const char *path, const char *tmp, tpk_ctx *ctx);
/* Remove the object (dataset or group) at the absolute path `name`, e.g. the bookkeeping an
 * adopted file keeps until it is finished. TPK_ENOTFOUND: none there. */
TPK_API int tpk_h5out_remove(tpk_h5out *out, const char *name, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
