/* tokenizer.h - text <-> token ids for the Llama family.
 *
 * Two algorithms, chosen by tokenizer.ggml.model:
 *   "gpt2"  byte-level BPE (SmolLM/SmolLM2, Llama-3, Qwen2): text is cut into
 *           words by a pre-tokenizer (tokenizer.ggml.pre: "gpt-2", "smollm",
 *           "llama-bpe", "qwen2", or "default": llama.cpp's, which it also
 *           takes, with a warning, when the key is missing; kvp_tokenizer_note
 *           then says so), each byte maps to one printable code point,
 *           and ranked merges (tokenizer.ggml.merges) join pairs, lowest
 *           rank first, leftmost on ties.  A byte whose code point is
 *           not in the vocabulary (SmolLM2 lacks a few control bytes) is
 *           dropped, as HF tokenizers and llama.cpp do.
 *   "llama" SentencePiece BPE (Llama-2, TinyLlama, Mistral): spaces become
 *           U+2581, a leading one is added (add_space_prefix), and adjacent
 *           pieces whose concatenation is in the vocabulary merge, highest
 *           tokenizer.ggml.scores first; characters outside the vocabulary
 *           fall back to <0xNN> byte tokens.  Where the leading U+2581 goes
 *           follows llama.cpp (every text between special tokens gets one)
 *           unless the tokenizer.kvpipe.* keys that kvp_tokenizer_meta_from_json
 *           writes for an HF folder say HF's rules (kvp(5)): its Metaspace
 *           prepend_scheme ("always": a text not starting with U+2581 or a
 *           space; "first": only the text at the start; "never"), its split
 *           (BPE on each U+2581-led word apart) and what its decoder strips.
 * Control, unknown and user-defined tokens (token_type 3, 2, 4) are cut out
 * of the text before either runs, as llama.cpp does (longest token first,
 * each taking its occurrences left to right; HF tokenizers' leftmost-longest
 * scan gives the same ids unless two special tokens overlap in the text).
 * Control and unknown tokens only where the caller asks (parse_special, or
 * spans of the text); user-defined ones always, as in both references.
 * An HF tokenizer.json's NFC normalizer (tokenizer.kvpipe.normalizer) puts
 * each text between the tokens so cut in NFC first, and the tokens HF
 * matches in normalized text (tokenizer.kvpipe.normalized_tokens) are cut
 * out of that, as HF's added vocabulary does; GGUF files have neither key
 * (llama.cpp does not normalize).
 *
 * The vocabulary comes from GGUF-style metadata (lib/meta.h), which both a
 * GGUF header and a KVP TOKENIZER record give.  A loaded tokenizer is
 * read-only: any number of threads may encode and decode with it at once.
 */
#ifndef KVP_TOKENIZER_H
#define KVP_TOKENIZER_H

#include "error.h"
#include "json.h"
#include "meta.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_tokenizer kvp_tokenizer;

typedef enum kvp_tok_model {
    KVP_TOK_MODEL_GPT2 = 1, /* byte-level BPE */
    KVP_TOK_MODEL_SPM = 2,  /* SentencePiece BPE with scores */
} kvp_tok_model;

typedef enum kvp_tok_pre {
    KVP_TOK_PRE_NONE = 0,   /* SentencePiece: no pre-tokenizer */
    KVP_TOK_PRE_GPT2 = 1,   /* the GPT-2 pattern */
    KVP_TOK_PRE_SMOLLM = 2, /* every \p{N} alone, then the GPT-2 pattern */
    KVP_TOK_PRE_LLAMA3 = 3, /* the Llama-3 pattern (digits in runs of 1-3) */
    KVP_TOK_PRE_QWEN2 = 4,  /* the Llama-3 pattern with single digits */
    KVP_TOK_PRE_DEFAULT = 5, /* llama.cpp's 'default': punctuation runs apart, GPT-2, digits by 3 */
} kvp_tok_pre;

/* GGUF token types (tokenizer.ggml.token_type). */
typedef enum kvp_token_type {
    KVP_TOKEN_UNDEFINED = 0,
    KVP_TOKEN_NORMAL = 1,
    KVP_TOKEN_UNKNOWN = 2,
    KVP_TOKEN_CONTROL = 3,
    KVP_TOKEN_USER_DEFINED = 4,
    KVP_TOKEN_UNUSED = 5,
    KVP_TOKEN_BYTE = 6,
} kvp_token_type;

/* Ceiling on the vocabulary and merge counts we accept from a file. */
#define KVP_TOK_MAX_VOCAB (1u << 22)
#define KVP_TOK_MAX_TOKEN_BYTES 65536u

/* Whether the tokenizer.ggml.* keys in m are well formed, whatever reads
 * them: tokenizer.ggml.model present; tokens 1..KVP_TOK_MAX_VOCAB strings of
 * at most KVP_TOK_MAX_TOKEN_BYTES; scores and token_type (when present) one
 * per token, types 0..6; merges present and each "A B" for gpt2; the bos,
 * eos, unknown, eot and eom ids inside the vocabulary; add_bos_token and
 * add_space_prefix booleans.  Not checked: whether we can run the model and
 * pre-tokenizer (kvp_tokenizer_load_meta refuses those it does not know).
 * 0, or a negative code with "SOURCE: KEY: what is wrong". */
int kvp_tokenizer_check_meta(const kvp_meta *m, const char *source, kvp_err *err);
/* Build a tokenizer from tokenizer.ggml.* keys in m (m may be freed after),
 * after kvp_tokenizer_check_meta.  source names the file in messages.  0 or a
 * negative code; *t is NULL on failure. */
int kvp_tokenizer_load_meta(kvp_tokenizer **t, const kvp_meta *m, const char *source, kvp_err *err);
void kvp_tokenizer_free(kvp_tokenizer *t);

/* HF tokenizer.json (BPE models: byte-level, or SentencePiece-style with
 * byte fallback) translated into the tokenizer.ggml.* keys a GGUF converter
 * writes, added to m, and the tokenizer.kvpipe.* keys of HF's own rules
 * around the BPE (an NFC normalizer and the added tokens matched after it;
 * for SentencePiece, Metaspace prepend_scheme and split, the decoder's
 * stripping; see kvp(5)).  A normalizer kvpipe does not apply (anything but
 * NFC, and for SentencePiece a Prepend or a Replace of U+2581) is refused
 * with KVP_EUNSUPPORTED naming it: skipping it would change the ids.  BOS comes from the post-processor's template (and is
 * then added); EOS is the first of </s>, <|end_of_text|>, <|endoftext|>,
 * <|im_end|>.  SentencePiece scores are minus the rank of the merge that
 * makes each token.  0 or a negative code naming the field. */
int kvp_tokenizer_meta_from_json(kvp_meta *m, const kvp_json *root, const char *source, kvp_err *err);
/* kvp_json_parse_file + kvp_tokenizer_meta_from_json + load_meta. */
int kvp_tokenizer_load_json(kvp_tokenizer **t, const char *path, kvp_err *err);
/* Copy every "tokenizer.*" key of src into dst (what a KVP TOKENIZER record
 * carries, e.g. from a GGUF header).  Returns the number of keys copied, or
 * KVP_ENOMEM. */
int kvp_tokenizer_copy_meta(kvp_meta *dst, const kvp_meta *src, kvp_err *err);

/* Encode len bytes of text (any bytes; invalid UTF-8 is kept byte for byte).
 * parse_special: cut control tokens (such as <|im_start|>) out of the text,
 * as llama.cpp's llama_tokenize(parse_special = true) and HF's encode do;
 * 0 takes them as plain text (user-defined tokens are cut out either way).
 * add_bos: 1 prepend BOS, 0 not, -1 as the vocabulary says
 * (tokenizer.ggml.add_bos_token, and then EOS after the text when
 * tokenizer.ggml.add_eos_token is set: llama_tokenize's add_special).
 * *ids is malloc'd (free it) and holds *n ids.  0 or a negative code. */
int kvp_tokenizer_encode(const kvp_tokenizer *t, const char *text, size_t len, int parse_special,
                         int add_bos, int32_t **ids, size_t *n, kvp_err *err);

/* A byte range [off, off + len) of a text. */
typedef struct kvp_tok_span {
    size_t off, len;
} kvp_tok_span;

/* kvp_tokenizer_encode where control tokens are cut out only when they lie
 * wholly inside one of the n_special spans (sorted, not overlapping), and
 * the rest of the text is literal: a chat template's own markers are
 * special, the messages between them are not, and BPE still runs across a
 * marker-free stretch as one text.  KVP_EINVAL for spans out of order or
 * outside the text. */
int kvp_tokenizer_encode_spans(const kvp_tokenizer *t, const char *text, size_t len, const kvp_tok_span *special,
                               size_t n_special, int add_bos, int32_t **ids, size_t *n, kvp_err *err);

size_t kvp_tokenizer_n_vocab(const kvp_tokenizer *t);
/* -1 when a and b have the same pieces for the same ids (one model's
 * tokens mean the same to the other: a draft model's), else the first id
 * where they differ (the smaller size when one is a prefix of the other). */
int64_t kvp_tokenizer_vocab_diff(const kvp_tokenizer *a, const kvp_tokenizer *b);
kvp_tok_model kvp_tokenizer_model(const kvp_tokenizer *t);
kvp_tok_pre kvp_tokenizer_pre(const kvp_tokenizer *t);
/* Special ids, -1 when the vocabulary has none. */
int32_t kvp_tokenizer_bos(const kvp_tokenizer *t);
int32_t kvp_tokenizer_eos(const kvp_tokenizer *t);
/* Whether the vocabulary asks for BOS in front of a prompt. */
int kvp_tokenizer_add_bos(const kvp_tokenizer *t);
/* What a program should tell its user once about how this vocabulary was
 * read ("FILE: no tokenizer.ggml.pre: ..."), or NULL: the library prints
 * nothing itself. */
const char *kvp_tokenizer_note(const kvp_tokenizer *t);
/* End-of-generation ids: eos, eot, eom and the control tokens that end a turn
 * (<|im_end|>, <|eot_id|>, <|endoftext|>, ...).  *n gets the count. */
const int32_t *kvp_tokenizer_eog(const kvp_tokenizer *t, size_t *n);
int kvp_tokenizer_is_eog(const kvp_tokenizer *t, int32_t id);
/* The id whose vocabulary text is exactly s[0..len), or -1. */
int32_t kvp_tokenizer_find(const kvp_tokenizer *t, const char *s, size_t len);
/* Vocabulary text of id as stored (byte-level or U+2581 form), or NULL when
 * id is out of range. */
const char *kvp_tokenizer_token_text(const kvp_tokenizer *t, int32_t id, size_t *len);
kvp_token_type kvp_tokenizer_token_type(const kvp_tokenizer *t, int32_t id);
/* The bytes id stands for in output text (byte-level decoded, U+2581 as a
 * space, <0xNN> as its byte; control tokens as their text).  NULL when id is
 * out of range. */
const char *kvp_tokenizer_piece(const kvp_tokenizer *t, int32_t id, size_t *len);

/* ---- detokenization ---- */

enum kvp_detok_flags {
    KVP_DETOK_SPECIAL = 1,     /* print control tokens' text (else nothing) */
    KVP_DETOK_STRIP_SPACE = 2, /* drop the space the SentencePiece dummy prefix
                                  put before the first token (decoding a text
                                  from its start, not continuing a prompt):
                                  llama.cpp's one space, or what an HF
                                  folder's decoder drops (a Strip decoder's
                                  leading spaces, a Metaspace decoder's every
                                  U+2581 of the first token) */
};

/* A streaming detokenizer: push ids as they are generated and print what it
 * appends; it holds back the bytes of a UTF-8 character that later tokens
 * will finish (at most 3), so no character is ever split across writes. */
typedef struct kvp_detok {
    const kvp_tokenizer *t;
    int flags;
    int started;       /* a non-empty piece has been seen */
    uint32_t strip_left; /* KVP_DETOK_STRIP_SPACE: leading spaces still to drop */
    uint8_t pend[4];   /* start of an unfinished character */
    size_t n_pend;
} kvp_detok;

void kvp_detok_init(kvp_detok *d, const kvp_tokenizer *t, int flags);
/* Append to out the bytes that are ready after token id (an id past the
 * tokenizer's tokens, a padded embedding row, adds none).  0, or KVP_EINVAL
 * for a negative id, KVP_ENOMEM. */
int kvp_detok_push(kvp_detok *d, int32_t id, kvp_buf *out, kvp_err *err);
/* Take up a text whose tokens ids[0..n) an earlier detokenizer (of d's
 * flags) has shown: d holds back the unfinished character they end in, as
 * that one did, so the next tokens pushed finish it.  (A run cut by its
 * token budget inside a character, continued from its saved KV stream,
 * writes the whole character.)  0, or kvp_detok_push's errors. */
int kvp_detok_resume(kvp_detok *d, const uint32_t *ids, size_t n, kvp_err *err);
/* Append whatever is held back (an unfinished character stays as it is). */
int kvp_detok_flush(kvp_detok *d, kvp_buf *out, kvp_err *err);
/* Whole-sequence decode into out (appended), with kvp_detok_flags. */
int kvp_tokenizer_decode(const kvp_tokenizer *t, const int32_t *ids, size_t n, int flags, kvp_buf *out,
                         kvp_err *err);

#endif
