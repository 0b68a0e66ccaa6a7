/* kvpipe.h - the public API of libkvpipe: everything a program that links
 * the library may use.  `make install` installs this header and exactly the
 * headers it includes into PREFIX/include/kvpipe/; every other header of
 * lib/ is internal and stays in the tree (scripts/check-layers checks that a
 * public header includes only public headers).
 *
 *     #include <kvpipe/kvpipe.h>
 *     cc prog.c $(pkg-config --cflags --libs --static kvpipe)
 *
 * The conventions are those of every header below: functions return 0 (or a
 * count) or a negative KVP_E* code and leave a message naming the file,
 * record or tensor in a caller-owned kvp_err; the library never prints to
 * stdout, never exits and keeps no global state but read-only tables.
 *
 * By layer, bottom up (README "Layout"):
 */
#ifndef KVPIPE_H
#define KVPIPE_H

/* base: versions, errors, mapped input and atomic output, threads */
#include "version.h"
#include "error.h"
#include "cpufeat.h"
#include "wire.h"
#include "io.h"
#include "owned.h"
#include "threadpool.h"

/* num: dtypes and their traits, casts, GGUF blocks, scaled quantization */
#include "tensor.h"
#include "minifloat.h"
#include "intcast.h"
#include "ggml_quants.h"
#include "quant.h"

/* format: KVP streams (reader, writer, typed records, saved distributions), GGUF, safetensors */
#include "meta.h"
#include "json.h"
#include "stream.h"
#include "logprobs.h"
#include "quant_kv.h"
#include "gguf.h"
#include "safetensors.h"

/* backend: the operations table the engine computes through */
#include "backend.h"

/* model: configs, models used in place, tokenizers, chat formats, presets */
#include "config.h"
#include "tokenizer.h"
#include "chat.h"
#include "hfquant.h"
#include "model.h"
#include "presets.h"

/* plan: kvcalc's memory model */
#include "capacity.h"

/* cpu: the CPU backend */
#include "backend_cpu.h"
#include "backends.h"

/* engine: paged KV cache, forward steps, sampling, generation */
#include "kvcache.h"
#include "engine.h"
#include "sample.h"
#include "generate.h"

#endif
