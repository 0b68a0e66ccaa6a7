/* perplexity.h - the perplexity mode of the programs (prefill
 * --perplexity, quantize --eval): read and tokenize a text, score it with
 * a model opened from the run options, print the result as llama.cpp's
 * perplexity tool does, or as JSON.
 *
 * Program layer (like runopts.h): it prints where it is told to.
 */
#ifndef KVP_PERPLEXITY_H
#define KVP_PERPLEXITY_H

#include "error.h"
#include "ppl.h"
#include "runopts.h"

#include <stdio.h>

/* Tokenize the text at path ("-": stdin) as llama.cpp's perplexity does:
 * the vocabulary's BOS choice, control tokens as plain text.  *ids
 * malloc'd.  An empty text is an error naming the file. */
int kvp_perplexity_tokens(const kvp_run *r, const char *path, uint32_t **ids, uint64_t *n, kvp_err *err);

/* Open the model the options name (o->model), tokenize text_path and score
 * it in windows of po->ctx tokens (0: 512, or the model's context where it
 * is shorter; a po->ctx beyond the model's context is an error); po->bos,
 * fingerprint and text_name are filled in from the model and path.  The KV
 * cache holds one window unless the options size it. */
int kvp_perplexity_run(const kvp_runopts *o, const char *text_path, kvp_ppl_opts *po, kvp_ppl_result *res,
                       kvp_err *err);

/* The report: text, windows, PPL with its error, speed; with a base,
 * llama.cpp's three blocks (perplexity, KL divergence, token probability
 * statistics).  json: one object on one line. */
void kvp_perplexity_print(FILE *f, const kvp_ppl_result *r, const char *text_name, int json);

#endif
