/* tpk — Tensor Programs toolkit: umbrella header. */
#ifndef TPK_H
#define TPK_H
#include "error.h"
#include "array.h"
#include "gauss.h"
#include "io.h"
#include "netsor.h"
#endif
