/* gpkernel-mpi's checkpoint (docs/scale-out.md "Checkpoint"): the output's datasets, chunked by
 * tile, in one parallel HDF5 file OUTPUT.partial.h5 that every rank writes its tiles into as they
 * finish, with a done byte per tile. The file's metadata is complete and on disk before the first
 * tile, and a tile's bytes are on disk before its done byte is written, so a SIGKILL of any rank,
 * or of mpirun, at any moment leaves a checkpoint whose done tiles are right. */
#ifndef TPK_MPI_CKPT_H
#define TPK_MPI_CKPT_H

#include <mpi.h>
#include <stdio.h>

#include "tiles.h"
#include "tpk/error.h"

/* The group of the bookkeeping, removed when the file is finished. */
#define MPI_CKPT_GROUP "/tpk_checkpoint"

typedef struct mpi_ckpt_spec {
    const char *path;      /* the checkpoint file */
    const mpi_tiles *t;
    int f32;               /* the kernel stored as float32 (else float64) */
    const char *name;      /* the datasets' base name: "kernel" (NULL) or "ntk" (/ntk,
                            * /ntk_test_train, /ntk_test_diag) */
    const char *config;    /* what the tiles depend on; a checkpoint resumed must have the same */
} mpi_ckpt_spec;

typedef struct mpi_ckpt mpi_ckpt;

/* Every process that writes a checkpoint holds a shared lock on it while it lives. Before a run
 * creates or opens the checkpoint at path, one process claims it: waits (up to wait_s seconds,
 * saying so on `note` after a second; NULL: silent) until no process holds it — ranks of a run
 * whose mpirun was killed go on for a moment and must not write into the next run's file.
 * TPK_OK also when there is no such file; TPK_EIO when it stays held. */
int mpi_ckpt_claim(const char *path, double wait_s, FILE *note, tpk_ctx *ctx);
/* Collective over comm. Create the checkpoint afresh (an earlier file there is replaced): the
 * datasets with all their chunks allocated, the done bytes zero, the config; flushed and synced. */
int mpi_ckpt_create(MPI_Comm comm, const mpi_ckpt_spec *s, mpi_ckpt **out, tpk_ctx *ctx);
/* Collective over comm. Open an existing checkpoint and read its done bytes. TPK_EFORMAT: not a
 * checkpoint this program can read (the caller may start afresh); TPK_EINVAL: one made by
 * another job (its config differs; the message names the first line that does). */
int mpi_ckpt_open(MPI_Comm comm, const mpi_ckpt_spec *s, mpi_ckpt **out, tpk_ctx *ctx);
/* 1 when tile `id` was finished (as this process knows: its own and what the file said). */
int mpi_ckpt_done(const mpi_ckpt *c, size_t id);
size_t mpi_ckpt_done_count(const mpi_ckpt *c);
/* Independent: write a finished tile, nr·R × nc·R entries K (row stride ld) — for a training
 * tile below the diagonal also its transpose above it; diag (the row items' k(x, x), nr·R;
 * NULL: none) into /kernel_test_diag for a test tile of column block 0 — sync the file, then
 * set the tile's done byte. A non-finite entry is TPK_EDOM naming the dataset and the entry,
 * and nothing is written. */
int mpi_ckpt_write_tile(mpi_ckpt *c, mpi_tile tile, const double *K, size_t ld,
                        const double *diag, tpk_ctx *ctx);
/* Collective: close the file (NULL: nothing). */
int mpi_ckpt_close(mpi_ckpt *c, tpk_ctx *ctx);

#endif
