/* chat.h - built-in chat prompt formats (decode --chat, --system).
 *
 * ChatML (SmolLM2, Qwen):
 *     <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n
 * Llama-3:
 *     <|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>...<|start_header_id|>assistant<|end_header_id|>\n\n
 *     (content trimmed of surrounding whitespace, as the model's template does)
 * BOS is not part of it: encode with add_bos = -1 (the vocabulary's choice;
 * Llama-3 adds <|begin_of_text|>, SmolLM2 adds nothing).
 *
 * Only the template's own markers (<|im_start|>, <|eot_id|>, ...) are
 * special: the renderer records where it put them (kvp_chat_marks) and
 * kvp_tokenizer_encode_spans parses control tokens there alone, so a role or
 * a message that contains "<|im_end|>" stays text and cannot open a turn of
 * its own.  (HF's apply_chat_template and llama.cpp render a string and parse
 * all of it, so there a message can forge one.)
 */
#ifndef KVP_CHAT_H
#define KVP_CHAT_H

#include "error.h"
#include "meta.h"
#include "tokenizer.h"
#include "wire.h"

#include <stddef.h>

typedef enum kvp_chat_format {
    KVP_CHAT_NONE = 0, /* the vocabulary has no chat markers: nothing renders */
    KVP_CHAT_CHATML = 1,
    KVP_CHAT_LLAMA3 = 2,
} kvp_chat_format;

/* role and content are C strings unless their length is given: a JSON
 * message may hold \u0000, which stays part of the text (as HF renders
 * it), so a reader passes the lengths it has.  A length of 0 means the
 * string's own (strlen), which for an empty string is 0 too. */
typedef struct kvp_chat_msg {
    const char *role;    /* "system", "user", "assistant" (any non-empty name) */
    const char *content;
    size_t role_len, content_len;
} kvp_chat_msg;

/* "chatml" or "llama3" ("llama-3" too); KVP_EINVAL naming the choices. */
int kvp_chat_format_parse(const char *name, kvp_chat_format *f, kvp_err *err);
const char *kvp_chat_format_name(kvp_chat_format f);
/* The format a vocabulary speaks: Llama-3 when it has <|start_header_id|>,
 * ChatML when it has <|im_start|>; KVP_ENOTFOUND when neither. */
int kvp_chat_detect(const kvp_tokenizer *t, kvp_chat_format *f, kvp_err *err);
/* The system message a model's chat template inserts when the conversation
 * has none (SmolLM2: "You are a helpful AI assistant named SmolLM, ...";
 * Qwen2.5: "You are Qwen, created by Alibaba Cloud. ..."), read from
 * tokenizer.chat_template: the first ChatML system turn whose message is a
 * string literal, its escapes undone, into *out (allocated); *out NULL
 * when the template has none.  0, or KVP_ENOMEM. */
int kvp_chat_default_system(const kvp_meta *m, char **out, kvp_err *err);
/* The tokenizer metadata key (in memory only, never written) an HF
 * folder's loader sets to why its tokenizer_config.json could not be read:
 * its default system message is then unknown, not none. */
#define KVP_CHAT_TEMPLATE_ERROR "kvpipe.chat_template_error"

/* Where the template's markers lie in a rendered text: byte ranges of out,
 * sorted, for kvp_tokenizer_encode_spans.  Zero-initialize; free with
 * kvp_chat_marks_free. */
typedef struct kvp_chat_marks {
    kvp_tok_span *v;
    size_t n, cap;
} kvp_chat_marks;

void kvp_chat_marks_free(kvp_chat_marks *m);

/* Append the prompt for n messages to out; add_generation opens an
 * assistant turn at the end.  marks (NULL: not wanted) gets the offsets in
 * out of the markers appended.  0 or KVP_EINVAL / KVP_ENOMEM. */
int kvp_chat_render(kvp_chat_format f, const kvp_chat_msg *msgs, size_t n, int add_generation, kvp_buf *out,
                    kvp_chat_marks *marks, kvp_err *err);
/* One turn: an optional system message (NULL or "" for none) and the user's. */
int kvp_chat_prompt(kvp_chat_format f, const char *system, const char *user, kvp_buf *out, kvp_chat_marks *marks,
                    kvp_err *err);
/* Close the assistant's turn and open the next user turn: what continues a
 * saved conversation (decode/prefill --resume --chat) before the user's
 * message, rendered with kvp_chat_render.  Marks as above. */
int kvp_chat_close_turn(kvp_chat_format f, kvp_buf *out, kvp_chat_marks *marks, kvp_err *err);
/* Whether a saved conversation's tokens ids[n] end inside an open
 * assistant turn of format f, the one kvp_chat_close_turn closes: its last
 * opening marker followed by the role "assistant" and the header's end
 * (ChatML: a newline; Llama-3: <|end_header_id|>), and no end of
 * generation (<|im_end|>, <|eot_id|>, EOS) after it.  0, or KVP_EINVAL
 * saying what they end in instead: no turn of f, a closed turn, a header
 * cut short, another role's turn. */
int kvp_chat_check_open(kvp_chat_format f, const kvp_tokenizer *t, const uint32_t *ids, size_t n, kvp_err *err);

#endif
