/* Tokenizer built from a GGUF file's tokenizer.ggml.* metadata. Two families:
 *   "llama": SentencePiece-style: score-driven merges of UTF-8 characters, byte fallback to
 *            <0xXX> tokens, a leading space (add_space_prefix), spaces as U+2581.
 *   "gpt2":  byte-level BPE: pre-tokenizer regex chosen by tokenizer.ggml.pre, bytes mapped to
 *            printable code points, merges ranked by tokenizer.ggml.merges order.
 * A tok_vocab is immutable after creation and may be used from any thread at once. */
#ifndef KVS_ENGINE_TOKENIZER_H
#define KVS_ENGINE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"

typedef struct tok_vocab tok_vocab;

enum tok_family { TOK_FAMILY_SPM = 1, TOK_FAMILY_BPE = 2 };

/* Token types as stored in tokenizer.ggml.token_type (llama.cpp's values). */
enum tok_type {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Builds the tokenizer; the vocab copies what it needs, so f may be closed afterwards.
 * Errors: KVS_ENOKEY / KVS_EKEYTYPE for missing or mistyped metadata, KVS_EUNSUPPORTED for an
 * unknown tokenizer.ggml.model or pre-tokenizer (err names it), KVS_ENOMEM. */
int tok_create_from_gguf(const gguf_file *f, tok_vocab **out, char *err, size_t err_len);
void tok_destroy(tok_vocab *v);

enum tok_family tok_family(const tok_vocab *v);
int32_t tok_n_vocab(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);  /* -1 if none */
int32_t tok_eos(const tok_vocab *v);  /* -1 if none */
int32_t tok_unk(const tok_vocab *v);  /* -1 if none */
int32_t tok_pad(const tok_vocab *v);  /* tokenizer.ggml.padding_token_id; -1 if none */
bool tok_add_bos(const tok_vocab *v); /* whether prompts start with BOS by default */
/* tokenizer.ggml.add_eos_token (false without an EOS): an embedding model's inputs end with
 * EOS (Qwen3-Embedding's pooling reads that position); generation never adds it */
bool tok_add_eos(const tok_vocab *v);
/* End-of-generation tokens, as llama.cpp's vocabulary marks them: EOS, tokenizer.ggml.eot_token_id
 * and eom_token_id, and every token whose text is an end-of-turn marker (<|eot_id|>, <|eom_id|>,
 * <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <EOT>, _<EOT>, <｜end▁of▁sentence｜>).
 * A generated one ends a choice (finish_reason stop). *ids holds *n of them, EOS first. */
#define TOK_MAX_EOG 16
size_t tok_eog_ids(const tok_vocab *v, const int32_t **ids);
bool tok_is_eog(const tok_vocab *v, int32_t id);
/* Control tokens (BOS, EOS, chat markers) never come out of plain text. */
bool tok_is_control(const tok_vocab *v, int32_t id);
/* The token's stored text (raw vocab entry, e.g. "▁the" or "Ġthe"), NUL-terminated. */
const char *tok_token_text(const tok_vocab *v, int32_t id);
/* Id of the token whose stored text is exactly s, or -1. */
int32_t tok_find(const tok_vocab *v, const char *s, size_t len);

/* Encodes len bytes of text (need not be valid UTF-8; invalid bytes become byte tokens or
 * are replaced as the family's reference does). add_bos prepends BOS when the vocab has one.
 * parse_special: text equal to a control/user-defined token's text becomes that token (for
 * rendered chat templates); without it control-token text is tokenized as plain characters.
 * User-defined tokens (added vocabulary, e.g. NeoX's runs of spaces) are split out even without
 * parse_special, as llama.cpp and HF tokenizers do (the llama.cpp test vectors depend on it).
 * Writes up to cap ids and sets *n_out to the total count; returns KVS_ENOSPC (ids holds the
 * first cap) when cap was too small, so callers can retry with *n_out. */
int tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_bos, bool parse_special,
               int32_t *ids, size_t cap, size_t *n_out);

/* The bytes a token stands for in output text (U+2581 -> ' ', <0x0A> -> '\n', byte-level BPE
 * unmapped). Control, unknown and unused tokens give "". Returns the byte count (may exceed cap:
 * then only cap bytes are written) or a negative status for an invalid id. */
int tok_token_to_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap);

/* tok_decode's flags. TOK_DECODE_STRIP_SPACE: remove the one space an SPM vocab puts in front of
 * the text where it begins the output (what a full decode of a prompt wants, as Hugging Face's
 * decoder strips it; streaming completions keep it). TOK_DECODE_SPECIAL: control tokens write
 * their text ("<s>", "<|im_end|>"), as Hugging Face's decode and llama.cpp's detokenize with
 * special tokens do (POST /detokenize); without it they write nothing. */
enum { TOK_DECODE_STRIP_SPACE = 1, TOK_DECODE_SPECIAL = 2 };

/* Decodes ids into text (flags: TOK_DECODE_*). Sets *n_out to the total bytes (NUL not
 * counted); out is NUL-terminated when total < cap; KVS_ENOSPC if cap < total + 1 (out then
 * holds the first cap bytes), KVS_ERANGE for a bad id. */
int tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, unsigned flags, char *out,
               size_t cap, size_t *n_out);

/* Incremental decoding for streams: never emits half a UTF-8 character. Bytes of an
 * incomplete character are held until the character completes; invalid sequences are emitted
 * as U+FFFD. */
typedef struct tok_decoder {
    unsigned char pending[4];
    int n_pending;
} tok_decoder;

void tok_decoder_init(tok_decoder *d);
/* Appends token id's text to out (cap bytes; 64 + 3 x piece length always suffices, as each
 * invalid byte may become a 3-byte U+FFFD); returns bytes written or a negative status
 * (KVS_ENOSPC leaves d unchanged, so the call can be retried with more room). */
int tok_decoder_push(const tok_vocab *v, tok_decoder *d, int32_t id, char *out, size_t cap);
/* Emits whatever is pending at end of stream (as U+FFFD); returns bytes written. */
int tok_decoder_flush(tok_decoder *d, char *out, size_t cap);

#endif
