/* The toolkit's one wall clock (include/tpk/clock.h). */
#include "tpk/clock.h"

#include <time.h>

double tpk_wall_seconds(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0.0; /* CLOCK_MONOTONIC is mandatory on POSIX systems: not reached */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
