/* tpk — Tensor Programs toolkit: umbrella header, every public header of libtpk, bottom layer
 * first (mk/layers.txt). tests/test_headers.c checks that none is missing and that this header
 * compiles alone, in C and C++. tpk/tune.h is not here: it is the offline tuner's
 * (libtpktune.a), which libtpk does not contain and `make install` does not install. */
#ifndef TPK_H
#define TPK_H
/* core */
#include "version.h"
#include "error.h"
#include "alloc.h"
#include "array.h"
#include "clock.h"
#include "progress.h"
#include "threads.h"
#include "io.h"
#include "idx.h"
#include "rng.h"
/* runtime */
#include "matmul.h"
#include "gemm.h"
#include "map.h"
#include "machine.h"
/* orch */
#include "orch.h"
/* kernels */
#include "gauss.h"
#include "kernels.h"
#include "batchnorm.h"
#include "cnn.h"
#include "attention.h"
#include "mvn.h"
#include "ntk.h"
/* netsor */
#include "netsor.h"
/* app */
#include "job.h"
#include "archs.h"
/* limits, gp */
#include "limits.h"
#include "study.h"
#include "gp.h"
#endif
