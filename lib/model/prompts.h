/* prompts.h - prompts for prefill and decode: plain text, JSON Lines files,
 * rendered in the built-in chat formats (chat.h) where asked.
 *
 * A prompts file is JSON Lines when its first non-blank byte is '{': one
 * object a line, {"id": ..., "prompt": "..."} or {"id": ..., "messages":
 * [{"role": "...", "content": "..."}, ...]} (one of the two, never both);
 * blank lines are skipped.  Anything else is one prompt, the whole file.
 * A UTF-8 byte order mark opening the file is skipped either way.
 * Messages are always rendered in the chat format; plain prompts only when
 * chat is asked for (--chat), as one user turn after the optional system
 * message.  Errors name the file and line.
 *
 * Ids: "id" is optional: a non-empty string (no NUL, at most KVP_NAME_MAX
 * bytes) or an integer in int64 range, which becomes its decimal digits (the
 * label "7" for 7, with label_int set so that it is printed back as 7, not
 * "7"); a line without one is known by its index among the requests
 * (0-based), its label "".  Ids are compared as that text, as
 * decode --resume compares them (results.h): 7, "7" and the index 7 are one
 * id, and a request whose id an earlier one has is an error naming both
 * lines.  The reader keeps every id for that (memory grows with the number
 * of requests, not with their text).
 *
 * A file is read a record at a time (kvp_prompts_reader): only as far as
 * the line asked for, so a file or pipe of any length takes the memory of
 * the line in hand, and a pipe's lines are used as they are written.  The
 * ceiling (1 GiB) is on one line, or on the whole of a plain-text file.
 *
 * A line may carry its own generation parameters, as an OpenAI-style
 * request does: "max_tokens", "temperature", "top_p", "top_k", "min_p",
 * "seed" and "stop" (a string or an array of strings); the command line
 * gives the defaults for the lines that do not.  "cache_salt" (a string, as
 * vLLM takes it) keeps the request's KV blocks apart from those of other
 * salts: requests of different tenants never share cached blocks.
 *
 * Special tokens: a plain prompt (-p, "prompt", a text file) is parsed for
 * control tokens as llama.cpp and HF do, so "<|im_start|>" in it is one
 * token, unless literal is set (--no-special).  In rendered chat only the
 * template's markers are special: roles and message contents stay literal
 * whatever literal says, so no message can forge a turn.
 */
#ifndef KVP_PROMPTS_H
#define KVP_PROMPTS_H

#include "chat.h"
#include "error.h"
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Parameters a request line set (bits of kvp_prompt_params.set). */
enum {
    KVP_PARAM_MAX_TOKENS = 1, KVP_PARAM_TEMPERATURE = 2, KVP_PARAM_TOP_P = 4, KVP_PARAM_TOP_K = 8,
    KVP_PARAM_MIN_P = 16, KVP_PARAM_SEED = 32, KVP_PARAM_STOP = 64, KVP_PARAM_CACHE_SALT = 128,
};

typedef struct kvp_prompt_params {
    unsigned set;           /* KVP_PARAM_* given on the line */
    uint32_t max_tokens;
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed;
    char **stop;            /* [n_stop] NUL-terminated, owned */
    size_t n_stop;
    uint64_t cache_salt;    /* "cache_salt": XXH64 of the string (never 0) */
} kvp_prompt_params;

typedef struct kvp_prompt {
    char *label;            /* the user's id ("" when none), NUL-terminated, at most KVP_NAME_MAX bytes */
    int label_int;          /* the id was an integer: label is its digits, printed back as the integer */
    kvp_prompt_params params;
    char *text;             /* the text to tokenize (chat rendered), NUL-terminated */
    size_t len;
    kvp_tok_span *special;  /* where control tokens are parsed (malloc'd, or NULL) */
    size_t n_special;
} kvp_prompt;

typedef struct kvp_prompts {
    kvp_prompt *p;
    size_t n, cap;
    kvp_chat_format format; /* for messages, and plain prompts when chat (default ChatML) */
    int chat;               /* plain prompts become a user turn */
    int literal;            /* plain prompts' control tokens are text (--no-special) */
    const char *system;     /* system message for rendered prompts ("": none), or NULL */
    const char *default_system; /* where system is NULL: the model's own (its chat template's
                                   default), or NULL */
    const char *default_system_error; /* why the model's default is unknown (its template
                                         could not be read), or NULL: a conversation that
                                         needs it fails with this */
    /* a reader's JSON line with a field no request has ("max_token" for
     * "max_tokens"): called once per name, at its first line (NULL: none) */
    void (*on_unknown)(void *ctx, const char *path, uint64_t line, const char *field);
    void *on_unknown_ctx;
} kvp_prompts;

/* Empty, ChatML, plain prompts plain and parsed for special tokens; set the
 * fields above before adding. */
void kvp_prompts_init(kvp_prompts *ps);
void kvp_prompts_free(kvp_prompts *ps);
/* Add one plain prompt (rendered as a user turn when ps->chat); a label
 * longer than KVP_NAME_MAX bytes is KVP_EINVAL. */
int kvp_prompts_add_text(kvp_prompts *ps, const char *label, const char *text, size_t len, kvp_err *err);
/* Add the prompts of a file ("-" is stdin), all of them (a
 * kvp_prompts_reader to the end: none from an empty one); an "id" longer
 * than KVP_NAME_MAX bytes (a sequence record's label) is KVP_EFORMAT naming
 * the line. */
int kvp_prompts_read_file(kvp_prompts *ps, const char *path, kvp_err *err);
/* How many requests the prompts file at path holds, by the reader's rules
 * (a byte order mark skipped; a file whose first non-blank byte is not '{'
 * is one prompt; else each line with a non-blank byte is one), without
 * parsing them: a line that will fail still counts.  *n 0 when path is not
 * a regular file ("-", a pipe: not known before it is read).  0 or a code
 * naming path. */
int kvp_prompts_count_file(const char *path, uint64_t *n, kvp_err *err);
/* Tokenize prompt i with its special spans; BOS as the vocabulary says.
 * *ids malloc'd.  0 or a code. */
int kvp_prompts_encode(const kvp_prompts *ps, size_t i, const kvp_tokenizer *t, int32_t **ids, size_t *n,
                       kvp_err *err);
/* The same for one prompt. */
int kvp_prompt_encode(const kvp_prompt *p, const kvp_tokenizer *t, int32_t **ids, size_t *n, kvp_err *err);
/* Free what p owns (label, text, spans, stop strings) and zero it. */
void kvp_prompt_free(kvp_prompt *p);

/* ---- one record at a time ---- */

typedef struct kvp_prompts_reader kvp_prompts_reader;

/* Open path ("-": stdin) to read its prompts one at a time, rendered with
 * the settings of ps (format, chat, literal, system: ps->system must
 * outlive the reader).  Nothing is read yet.  0 or a code naming the path. */
int kvp_prompts_reader_open(kvp_prompts_reader **rd, const char *path, const kvp_prompts *ps, kvp_err *err);
void kvp_prompts_reader_free(kvp_prompts_reader *rd);
/* The next prompt into *p (the caller's: kvp_prompt_free), reading only up
 * to the end of its line (on a pipe, waiting for it): 1, or 0 at the end
 * of the input, or a code naming the file and line (a repeated id
 * KVP_EFORMAT naming the id and both lines).  After a failure every later
 * call fails the same way.  An input of no prompt (empty, blank lines, a
 * byte order mark alone) ends at once, no error: a batch job's night with
 * nothing to do; a caller that needs a prompt says so. */
int kvp_prompts_reader_next(kvp_prompts_reader *rd, kvp_prompt *p, kvp_err *err);
/* 1 when kvp_prompts_reader_next would not wait for input (a file; a
 * whole line, the end or a failure at hand), 0 when it would wait on a
 * pipe.  Takes in what a pipe already holds, never waiting. */
int kvp_prompts_reader_ready(kvp_prompts_reader *rd);
/* The line of the prompt last returned (1-based; 0 before the first). */
uint64_t kvp_prompts_reader_line(const kvp_prompts_reader *rd);
/* 1 when the input is a regular file (every line there from the start), 0
 * for a pipe or a terminal (lines come as they are written). */
int kvp_prompts_reader_is_file(const kvp_prompts_reader *rd);

#endif
