/* The toolkit's version: macros for compile time, tpk_version() for the library actually loaded.
 * Semantic versioning (CHANGELOG.md); the Makefile takes VERSION from this file, and the shared
 * library's SONAME is libtpk.so.TPK_VERSION_MAJOR. */
#ifndef TPK_VERSION_H
#define TPK_VERSION_H

#include "error.h"

#define TPK_VERSION_MAJOR 0
#define TPK_VERSION_MINOR 1
#define TPK_VERSION_PATCH 0
#define TPK_VERSION_STRING "0.1.0"
/* MAJOR·10000 + MINOR·100 + PATCH, for #if comparisons: TPK_VERSION_NUMBER >= 100 is 0.1.0. */
#define TPK_VERSION_NUMBER (TPK_VERSION_MAJOR * 10000 + TPK_VERSION_MINOR * 100 + TPK_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library in use ("0.1.0"), which may differ from the headers' macros when a
 * program runs against another build of the shared library. */
TPK_API const char *tpk_version(void);
/* The same as TPK_VERSION_NUMBER computes it. */
TPK_API int tpk_version_number(void);

#ifdef __cplusplus
}
#endif
#endif
