/* The choice of a shipped machine class for this CPU (include/tpk/machine.h, tuner-notes §7):
 * TPK_CLASS → the exact class → another class of the same ISA → a class of a lower ISA → none.
 * Recomputed per call (the compiler's cpu builtins read a table libgcc fills once at start-up,
 * and getenv is cheap beside any kernel worth dispatching), so nothing here is mutable state. */
#include "tpk/machine.h"

#include <stdlib.h>
#include <string.h>

#include "machine_gen.h"

const char *tpk_machine_how_name(int how)
{
    static const char *const names[] = {"exact", "same-isa", "lower-isa", "forced", "none"};
    return how >= 0 && how <= TPK_MACHINE_NONE ? names[how] : "?";
}

const tpk_machine *tpk_machine_classes(size_t *count)
{
    if (count)
        *count = tpk__machine_nclasses;
    return tpk__machine_classes;
}

const tpk_machine *tpk_machine_find(const char *name)
{
    for (size_t i = 0; name && i < tpk__machine_nclasses; i++)
        if (!strcmp(tpk__machine_classes[i].name, name) || !strcmp(tpk__machine_classes[i].id, name))
            return &tpk__machine_classes[i];
    return NULL;
}

int tpk__machine_index(int *how)
{
    int isa = tpk_machine_host_isa(), dummy;
    if (!how)
        how = &dummy;
    const char *force = getenv("TPK_CLASS");
    const tpk_machine *f = force && *force ? tpk_machine_find(force) : NULL;
    if (f && f->isa <= isa) {
        *how = TPK_MACHINE_FORCED;
        return (int)(f - tpk__machine_classes);
    }
    const char *host = tpk_machine_host_name();
    int same = -1, lower = -1;
    for (size_t i = 0; i < tpk__machine_nclasses; i++) {
        const tpk_machine *c = &tpk__machine_classes[i];
        if (c->isa == isa && !strcmp(c->name, host)) {
            *how = TPK_MACHINE_EXACT;
            return (int)i;
        }
        if (c->isa == isa && same < 0)
            same = (int)i;
        if (c->isa < isa && (lower < 0 || c->isa > tpk__machine_classes[lower].isa))
            lower = (int)i;
    }
    *how = same >= 0 ? TPK_MACHINE_SAME_ISA : lower >= 0 ? TPK_MACHINE_LOWER_ISA : TPK_MACHINE_NONE;
    return same >= 0 ? same : lower;
}

const tpk_machine *tpk_machine_select(int *how)
{
    int i = tpk__machine_index(how);
    return i >= 0 ? &tpk__machine_classes[i] : NULL;
}
