/* chat.h - built-in chat prompt formats (decode --chat, --system).
 *
 * ChatML (SmolLM2, Qwen):
 *     <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n
 * Llama-3:
 *     <|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>...<|start_header_id|>assistant<|end_header_id|>\n\n
 *     (content trimmed of surrounding whitespace, as the model's template does)
 * The rendered text carries special tokens: encode it with parse_special = 1.
 * BOS is not part of it: encode with add_bos = -1 (the vocabulary's choice;
 * Llama-3 adds <|begin_of_text|>, SmolLM2 adds nothing).
 */
#ifndef KVP_CHAT_H
#define KVP_CHAT_H

#include "error.h"
#include "meta.h"
#include "tokenizer.h"
#include "wire.h"

#include <stddef.h>

typedef enum kvp_chat_format {
    KVP_CHAT_CHATML = 1,
    KVP_CHAT_LLAMA3 = 2,
} kvp_chat_format;

typedef struct kvp_chat_msg {
    const char *role;    /* "system", "user", "assistant" (any non-empty name) */
    const char *content;
} kvp_chat_msg;

/* "chatml" or "llama3" ("llama-3" too); KVP_EINVAL naming the choices. */
int kvp_chat_format_parse(const char *name, kvp_chat_format *f, kvp_err *err);
const char *kvp_chat_format_name(kvp_chat_format f);
/* The format a vocabulary speaks: Llama-3 when it has <|start_header_id|>,
 * ChatML when it has <|im_start|>; KVP_ENOTFOUND when neither. */
int kvp_chat_detect(const kvp_tokenizer *t, kvp_chat_format *f, kvp_err *err);
/* The system message a model's chat template inserts when the conversation
 * has none (SmolLM2: "You are a helpful AI assistant named SmolLM, ..."),
 * read from tokenizer.chat_template; NULL when it has no literal one. */
const char *kvp_chat_default_system(const kvp_meta *m, size_t *len);

/* Append the prompt for n messages to out; add_generation opens an
 * assistant turn at the end.  0 or KVP_EINVAL / KVP_ENOMEM. */
int kvp_chat_render(kvp_chat_format f, const kvp_chat_msg *msgs, size_t n, int add_generation, kvp_buf *out,
                    kvp_err *err);
/* One turn: an optional system message (NULL or "" for none) and the user's. */
int kvp_chat_prompt(kvp_chat_format f, const char *system, const char *user, kvp_buf *out, kvp_err *err);

#endif
