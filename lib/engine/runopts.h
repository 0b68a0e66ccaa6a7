/* runopts.h - the options prefill and decode share (model, threads, KV
 * cache, sampling, prompts) and the setup they both do: load the model and
 * its tokenizer, start the backend, size the KV cache, make the engine.
 *
 * Program layer (like cli.h): kvp_runopts_parse exits 2 on a bad value.
 */
#ifndef KVP_RUNOPTS_H
#define KVP_RUNOPTS_H

#include "engine.h"
#include "error.h"
#include "generate.h"
#include "kvcache.h"
#include "model.h"
#include "prompts.h"
#include "sched.h"
#include "seqio.h"
#include "stream.h"
#include "tokenizer.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

/* Long-option ids (beyond single characters). */
enum {
    KVP_OPT_THREADS = 0x1000, KVP_OPT_BLOCK_SIZE, KVP_OPT_KV_MEM, KVP_OPT_KV_BLOCKS, KVP_OPT_KV_DTYPE,
    KVP_OPT_TEMP, KVP_OPT_TOP_K, KVP_OPT_TOP_P, KVP_OPT_MIN_P, KVP_OPT_REPEAT, KVP_OPT_SEED, KVP_OPT_TOKENS,
    KVP_OPT_CHAT, KVP_OPT_SYSTEM, KVP_OPT_CHUNK, KVP_OPT_STATS, KVP_OPT_JSON, KVP_OPT_STOP, KVP_OPT_IGNORE_EOS,
    KVP_OPT_KV_OUT, KVP_OPT_NO_SPECIAL, KVP_OPT_HELP, KVP_OPT_VERSION, KVP_OPT_MAX_NUM_SEQS, KVP_OPT_MAX_BATCHED,
    KVP_OPT_STATIC, KVP_OPT_TP, KVP_OPT_PP, KVP_OPT_TIMEOUT, KVP_OPT_BACKEND,
};

/* The shared entries of a getopt_long table: KVP_RUNOPTS_N_LONG of them,
 * then a zero entry (a program adding its own sizes its table from it). */
#define KVP_RUNOPTS_N_LONG 34
extern const struct option kvp_runopts_long[KVP_RUNOPTS_N_LONG + 1];
#define KVP_RUNOPTS_SHORT "m:p:f:n:t:g"
/* A program's getopt_long table: the shared entries, then its own n_own,
 * then the zero entry, into out[KVP_RUNOPTS_N_LONG + n_own + 1]. */
void kvp_runopts_table(struct option *out, const struct option *own, size_t n_own);

typedef struct kvp_runopts {
    const char *model;
    const char *prompt;         /* -p */
    const char *file;           /* -f */
    const char *tokens;         /* --tokens "1,2,3" */
    int chat;                   /* --chat */
    int no_special;             /* --no-special: plain prompts' control tokens are text */
    const char *system;
    int threads;                /* 0: all cores */
    const char *backend;        /* --backend NAME (-g: cuda); NULL: cpu */
    kvp_kvcache_opts kv;
    uint32_t chunk;             /* --chunk: prompt tokens a step (prefill); decode's token budget */
    kvp_sched_opts sched;       /* --max-num-seqs, --max-batched-tokens, --static */
    kvp_sampling sampling;      /* defaults, then the options */
    unsigned sampling_set;      /* bit per option given (resumed streams keep the others) */
    int stats, json;
    const char *stats_file;     /* --stats=FILE: the summary as JSON into FILE */
    const char **stop;
    size_t n_stop;
    int ignore_eos;
    const char *kv_out;
    uint32_t tp;                /* --tp N: tensor-parallel ranks a stage; 0 or 1: none */
    uint32_t pp;                /* --pp M: pipeline stages; 0 or 1: none (mpirun -np N*M) */
    uint32_t max_model_len;     /* decode --max-model-len: a sequence's tokens at most (0: the model's context) */
    double timeout;             /* --timeout S: how long a rank waits for its peers (0: comm.h's default) */
} kvp_runopts;

#define KVP_SET_TEMP 1u
#define KVP_SET_TOP_K 2u
#define KVP_SET_TOP_P 4u
#define KVP_SET_MIN_P 8u
#define KVP_SET_REPEAT 16u
#define KVP_SET_SEED 32u
#define KVP_SET_MAX 64u

void kvp_runopts_init(kvp_runopts *o);
void kvp_runopts_free(kvp_runopts *o);
/* Handle option c with argument arg: 1 if it was one of ours, else 0. */
int kvp_runopts_parse(kvp_runopts *o, int c, const char *arg);
/* The prompt the command line gives, checked as far as it can be without
 * the model: --tokens' syntax (not the vocabulary) and -p not empty (unless
 * --chat renders a turn around it); a usage error (exit 2) when not. */
/* The step's token budget when --max-batched-tokens (or --chunk) was not
 * given: KVP_BUDGET_GPU on a GPU backend, KVP_BUDGET_CPU on the CPU.  After
 * parsing, before anything reads o->sched. */
enum { KVP_BUDGET_CPU = 512, KVP_BUDGET_GPU = 2048 };
void kvp_runopts_set_budget(kvp_runopts *o);
void kvp_runopts_check_prompt_args(const kvp_runopts *o);
/* Options text for --help. */
extern const char kvp_runopts_help[];
/* The same without the scheduler's options (--max-num-seqs,
 * --max-batched-tokens, --static): prefill's, which refuses them. */
extern const char kvp_runopts_help_one[];
/* Whether getopt's c is one of the scheduler's options above. */
int kvp_runopts_is_sched(int c);
/* Apply the options given to a sampling state (a resumed one keeps the
 * rest), but not over a value its record's own (KVP_SEQ_OWN_*: the request
 * set it, as a prompts line's field wins over the option in decode -f).
 * A --seed applied reseeds the generator for sequence id. */
void kvp_runopts_apply_sampling(const kvp_runopts *o, kvp_sampling *s, uint32_t own, uint64_t id);
/* The same for a sequence record read from a KV stream (decode FILE,
 * prefill --resume), with one exception: a sequence that has generated
 * already (not KVP_SEQ_PREFILLED: decode --kv-out saves them RUNNING or
 * FINISHED) is continued as a new request, so -n given replaces its
 * max_tokens even where its first request set it, and rec loses
 * KVP_SEQ_OWN_MAX_TOKENS (a stream written from it holds -n's value as a
 * default).  Its other own values win, and a prefilled record's own
 * max_tokens is its request's and wins, as a prompts line's does. */
void kvp_runopts_apply_record(const kvp_runopts *o, kvp_seq_rec *rec);
/* The sequence record's KVP_SEQ_OWN_* bits for a prompts line's
 * KVP_PARAM_* fields. */
uint32_t kvp_runopts_own_flags(unsigned param_set);
/* Request i's sampling: the command line's with what its prompts-file
 * line set (prompts.h); the line's own seed alone seeds it (the same seed,
 * the same draws), else the command line's seed and i.  0, or a code when
 * the result is out of range (kvp_sample_check). */
int kvp_runopts_request_sampling(const kvp_runopts *o, const kvp_prompt_params *pp, uint64_t i, kvp_sampling *smp,
                                 kvp_err *err);

typedef struct kvp_run {
    kvp_model *model;           /* under --tp: this rank's shard of whole */
    kvp_model *whole;           /* under --tp: the model loaded, else NULL */
    kvp_parallel dist;              /* under --tp/--pp: the job's ranks, this one the driver (world NULL: alone) */
    kvp_tokenizer *tok;
    kvp_backend *be;
    kvp_kvcache *kc;
    kvp_engine *engine;
    int kc_borrowed;            /* kc is another run's (layerskip on the target's cache): not freed here */
    char *default_system;       /* the system message the model's chat template puts in a
                                   conversation without one (kvp_chat_default_system), or NULL */
    char *default_system_error; /* why that message is unknown (the template could not be read),
                                   or NULL */
} kvp_run;

/* Load model + tokenizer and start the backend (no cache yet). */
int kvp_run_open(kvp_run *r, const kvp_runopts *o, kvp_err *err);
/* The backend --backend names (cpu when none), with --threads. */
int kvp_run_open_backend(kvp_backend **be, const kvp_runopts *o, kvp_err *err);
/* Under --tp N / --pp M, run by every program first: on ranks other than 0,
 * follow rank 0's steps on this rank's shard until the job ends, and return
 * the exit status (0, or 1 after printing "prog: rank R: ..." and aborting
 * the job); on rank 0 (or alone) return -1: go on as the driver. */
int kvp_run_tp_follow(const kvp_runopts *o);
/* The driver, inside kvp_run_open under --tp/--pp (tprun.c): join the job's
 * ranks (there must be tp * pp of them), keep the model loaded in r->whole
 * and put rank 0's shard in r->model.  From kvp_run_tp_follow until
 * kvp_run_tp_close, a driver that exits any other way (a fatal error)
 * aborts the job, so no rank waits for a driver that is gone.  0 or a code. */
int kvp_run_tp_open(kvp_run *r, const kvp_runopts *o, kvp_err *err);
/* The driver, after its last engine (kvp_run_close): the other ranks end
 * and MPI is finalized. */
void kvp_run_tp_close(kvp_run *r);
/* The model as loaded: the whole one under --tp/--pp (r->model is then this
 * rank's shard), which KV streams are read and checked against. */
static inline const kvp_model *kvp_run_loaded(const kvp_run *r) { return r->whole ? r->whole : r->model; }
/* Load model + tokenizer only (no backend: a draft model's first step). */
int kvp_run_open_vocab(kvp_run *r, const kvp_runopts *o, kvp_err *err);
/* The tokenizer and the chat template's metadata only, for tokenizing: no
 * tensor is read (a vocabulary-only GGUF serves); r->model has no weights. */
int kvp_run_open_tokenizer(kvp_run *r, const kvp_runopts *o, kvp_err *err);
/* Make the KV cache (from the options) and the engine; kc may be given
 * (read from a stream) and is then adopted. */
int kvp_run_start(kvp_run *r, const kvp_runopts *o, kvp_kvcache *kc, kvp_err *err);
void kvp_run_close(kvp_run *r);
/* A draft model for speculative decoding (specdec --draft PATH): loaded
 * with its tokenizer, run on target's backend (one thread pool), with its
 * own KV cache sized as the options say, and an engine.  Its vocabulary
 * must be the target's, token for token (a message names the first token
 * that differs).  Close with kvp_run_close_draft. */
int kvp_run_open_draft(kvp_run *d, const kvp_run *target, const kvp_runopts *o, const char *path, kvp_err *err);
/* Self-speculation's drafter (specdec --method layerskip): target's model
 * (the whole one under --tp) cut after its first n_layer layers
 * (kvp_model_first_layers), on target's backend.  Alone, it drafts in the
 * target's own KV cache (kvp_engine_create_first; d->kc_borrowed): those
 * layers' K/V are the target's already, so nothing is fed twice.  Under
 * --tp (the target's cache holds a rank's heads) it gets its own cache of
 * those layers, sized as the options say.  Close with kvp_run_close_draft. */
int kvp_run_open_layerskip(kvp_run *d, const kvp_run *target, const kvp_runopts *o, uint32_t n_layer, kvp_err *err);
void kvp_run_close_draft(kvp_run *d);
/* An empty *ps with the rendering the options and the model ask for (chat
 * format, --chat, --no-special, --system): the settings of a
 * kvp_prompts_reader. */
void kvp_run_prompt_settings(const kvp_run *r, const kvp_runopts *o, kvp_prompts *ps);
/* A request's id as a JSON value on f, as it was given: a string id as a
 * string, an integer id (label_int: the label is its digits) as the
 * integer, and a request without one (label "") as its index. */
void kvp_run_id_json(FILE *f, const char *label, int label_int, uint64_t index);
/* The prompts the options name, tokenized: *ids[i] (malloc'd) of *lens[i].
 * *ps keeps their labels.  Plain prompts are parsed for special tokens
 * unless --no-special; with --chat or {"messages"} only the template's
 * markers are (prompts.h). */
int kvp_run_prompts(const kvp_run *r, const kvp_runopts *o, kvp_prompts *ps, uint32_t ***ids, uint32_t **lens,
                    kvp_err *err);
/* Read the KVP stream at path ("-": stdin) into a new KV cache, start the
 * engine on it, and make *seqs[*n] of its sequences, with the sampling
 * options given applied as kvp_runopts_apply_record says (the rest kept
 * from the stream); *saved (unless
 * saved is NULL) gets the records as read, with their stop strings
 * (kvp_seqio_seqs_free); *stop (may be NULL) the stream's STOP record,
 * signal 0 where it has none.  0 or a code. */
int kvp_run_resume(kvp_run *r, const kvp_runopts *o, const char *path, kvp_gen_seq **seqs, kvp_seqio_seq **saved,
                   uint32_t *n, kvp_stop_rec *stop, kvp_err *err);
/* The tokens that extend a saved sequence s by one more turn, o->prompt
 * (or o->tokens as ids): s's pending token first when it has one (sampled,
 * not yet in the cache); with o->chat the text becomes a user turn (the
 * assistant's turn closed first, a new one opened after; the message
 * literal), else it is parsed for special tokens unless --no-special.
 * *ids malloc'd.
 * 0 or a code (KVP_EINVAL for an empty turn, or with o->chat for s not
 * ending in the assistant's open turn: kvp_chat_check_open, the message
 * naming the sequence). */
int kvp_run_turn_ids(const kvp_run *r, const kvp_runopts *o, const kvp_gen_seq *s, uint32_t **ids, uint32_t *n,
                     kvp_err *err);
/* The chat format the model's vocabulary speaks; KVP_CHAT_NONE when it
 * has neither ChatML's nor Llama-3's markers (rendering a conversation then
 * fails, saying so: ChatML typed out as plain text was no chat). */
kvp_chat_format kvp_run_chat_format(const kvp_run *r);
/* A KVP stream of sequences written as each is ready (prefill writes each
 * prompt's KV as soon as it is computed, so decode at the other end of a
 * pipe starts on it while the rest are still being computed).  open: the
 * stream header to path ("-": stdout; a file appears whole, on finish);
 * put: one sequence with its blocks (a block written before becomes a
 * reference); finish: the END record.  A failure aborts the output. */
typedef struct kvp_run_saver {
    kvp_out out;
    int open;
    kvp_writer *w;
    kvp_seqio_writer *sw;
} kvp_run_saver;
int kvp_run_save_open(kvp_run_saver *sv, kvp_run *r, const char *path, const char *producer, kvp_err *err);
/* put: s with its request's stop strings stop[n_stop] (the record carries
 * them, and rec.cache_salt, to the program that reads it). */
int kvp_run_save_put(kvp_run_saver *sv, const kvp_gen_seq *s, const char *const *stop, size_t n_stop, kvp_err *err);
/* stopped: the STOP record (kvp_stop_rec), for a job a signal ended before
 * its input was done; then finish as usual. */
int kvp_run_save_stopped(kvp_run_saver *sv, const kvp_stop_rec *s, kvp_err *err);
/* Say that the KV stream read from path ("-": stdin) was cut short: its
 * STOP record s, then tail ("" or more words), on standard error. */
void kvp_run_say_input_cut(const char *path, const kvp_stop_rec *s, const char *tail);
int kvp_run_save_finish(kvp_run_saver *sv, uint64_t *n_blocks, uint64_t *n_refs, kvp_err *err);
/* finish in two steps, for a job with another output to make whole first
 * (prefill's --stats=FILE): seal writes the END record and syncs and closes
 * the file (kvp_out_seal), commit renames it into place.  A failure of
 * either aborts the output.  counts: the blocks and references written so
 * far, which finish and seal report (NULL: not wanted). */
void kvp_run_save_counts(const kvp_run_saver *sv, uint64_t *n_blocks, uint64_t *n_refs);
int kvp_run_save_seal(kvp_run_saver *sv, kvp_err *err);
int kvp_run_save_commit(kvp_run_saver *sv, kvp_err *err);
void kvp_run_save_abort(kvp_run_saver *sv);

#endif
