/* tpk_version(): the version this library was built as (include/tpk/version.h). */
#include "tpk/version.h"

const char *tpk_version(void)
{
    return TPK_VERSION_STRING;
}

int tpk_version_number(void)
{
    return TPK_VERSION_NUMBER;
}
