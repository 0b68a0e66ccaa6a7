/* prompts.h - prompts for prefill and decode: plain text, JSON Lines files,
 * and the built-in chat formats (ChatML, Llama-3).
 *
 * A prompts file is JSON Lines when its first non-blank byte is '{': one
 * object a line, {"id": ..., "prompt": "..."} or {"id": ..., "messages":
 * [{"role": "...", "content": "..."}, ...]} (id optional, string or number);
 * blank lines are skipped.  Anything else is one prompt, the whole file.
 * Messages are always rendered in the chat format; plain prompts only when
 * chat is asked for (--chat), as one user turn after the optional system
 * message.  Errors name the file and line.
 */
#ifndef KVP_PROMPTS_H
#define KVP_PROMPTS_H

#include "error.h"

#include <stddef.h>

enum kvp_chat_format {
    KVP_CHAT_NONE = 0,
    KVP_CHAT_CHATML = 1, /* <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n */
    KVP_CHAT_LLAMA3 = 2, /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ... */
};

typedef struct kvp_prompt {
    char *label;   /* the user's id ("" when none), NUL-terminated, at most KVP_NAME_MAX bytes */
    char *text;    /* the text to tokenize (chat rendered), NUL-terminated */
    size_t len;
    int special;   /* the text holds control tokens to parse (chat) */
} kvp_prompt;

typedef struct kvp_prompts {
    kvp_prompt *p;
    size_t n, cap;
    int chat;            /* kvp_chat_format for rendering; NONE: plain prompts stay plain */
    const char *system;  /* system message for plain prompts rendered as chat, or NULL */
} kvp_prompts;

/* ps->chat and ps->system are set by the caller before adding. */
void kvp_prompts_init(kvp_prompts *ps, int chat, const char *system);
void kvp_prompts_free(kvp_prompts *ps);
/* Add one plain prompt (rendered as a user turn when ps->chat); a label
 * longer than KVP_NAME_MAX bytes is KVP_EINVAL. */
int kvp_prompts_add_text(kvp_prompts *ps, const char *label, const char *text, size_t len, kvp_err *err);
/* Add the prompts of a file ("-" is stdin); an "id" longer than
 * KVP_NAME_MAX bytes (a sequence record's label) is KVP_EFORMAT naming the
 * line. */
int kvp_prompts_read_file(kvp_prompts *ps, const char *path, kvp_err *err);
/* Render messages (role[i], content[i]) in format fmt, ending with the
 * assistant's turn opened; *out is malloc'd.  0 or a code. */
int kvp_prompts_render(int fmt, const char *const *role, const char *const *content, size_t n, char **out,
                    size_t *len, kvp_err *err);

#endif
