/* backend_cuda.h - the CUDA backend: lib/backend/backend.h's operations over
 * one GPU's memory (everything CUDA lives in kernels/; this is its one C header).  Built only with CUDA
 * (KVP_HAVE_CUDA); lib/engine/backends.c opens it as "cuda".
 */
#ifndef KVP_BACKEND_CUDA_H
#define KVP_BACKEND_CUDA_H

#include "backend.h"
#include "error.h"

/* The CUDA backend on device ordinal `device`.  KVP_EUNSUPPORTED with the
 * reason (no driver, no device, compute capability below what the kernels
 * were built for) when this machine cannot run it. */
int kvp_backend_cuda_create(kvp_backend **out, int device, kvp_err *err);

#endif
