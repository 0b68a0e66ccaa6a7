/* backend.c - what every backend shares (see backend.h). */
#include "backend.h"

void kvp_backend_free(kvp_backend *b)
{
    if (b)
        b->ops->destroy(b);
}

int kvp_backend_prepare(kvp_backend *b, kvp_weight *w, kvp_err *err)
{
    return w->dtype >= 0 ? b->ops->prepare_weight(b, w, err) : 0;
}
