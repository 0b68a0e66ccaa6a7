/* backend.c - what every backend shares (see backend.h). */
#include "backend.h"

void kvp_backend_free(kvp_backend *b)
{
    if (b)
        b->ops->destroy(b);
}
