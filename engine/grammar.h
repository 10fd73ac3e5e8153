/* Constrained decoding: a pushdown automaton over the BYTES of JSON text, and token masks.
 *
 * Three objects, from long-lived to per-step:
 *   grammar_def    what is allowed: a graph of JSON value nodes (object with ordered
 *                  properties, array, string, number, integer, literal sets for enum/const/
 *                  true/false/null, anyOf), built with grammar_builder_* (server/json_schema.c
 *                  compiles a JSON Schema into it) or grammar_def_json_object(). Immutable once
 *                  built: any number of grammars on any threads may read one at once.
 *   grammar_vocab  a model's tokens as byte strings in a trie (tokens sharing a prefix share
 *                  its nodes), built once per vocabulary. Immutable, shareable across threads.
 *   grammar        one sequence's position in its def: a set of automaton configurations (one
 *                  stack of frames each; more than one only while anyOf alternatives are still
 *                  ambiguous). One thread at a time; n > 1 forks take grammar_clone copies.
 *
 * The language: exactly one JSON value of the def's root (preceded by raw text, or by free
 * text up to a stop, where the def says so: grammar_builder_prefixed,
 * grammar_builder_text_until); before it and in each gap between tokens of the JSON text,
 * whitespace of the form "" | " " | "\t" | "\n" [ \t]{0,max_ws} (as llama.cpp's json.gbnf:
 * compact or pretty-printed text, but a model that loves whitespace cannot loop on it, and
 * wastes at most 1 + max_ws bytes per gap); no "\r"; none after the value (so a complete object
 * ends the generation); nesting at most opts.max_depth objects/arrays deep; numbers of at most
 * GRAMMAR_MAX_*_DIGITS digits per part. Strings must be valid UTF-8 (no overlong forms, no
 * encoded surrogates) with escapes as RFC 8259 says; a \u escape of a high surrogate must be
 * followed by one of a low surrogate (as cJSON requires). Object keys of a def object must be
 * the property names in the order the def lists them (OpenAI strict mode's order), each spelled
 * as cJSON prints it; required properties cannot be skipped, optional ones can; no other keys.
 * Literals (enum, const) must appear exactly as cJSON_PrintUnformatted prints them.
 *
 * Errors are negative kvs_status codes (common/status.h); builder errors also fill err. */
#ifndef KVS_ENGINE_GRAMMAR_H
#define KVS_ENGINE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

/* Limits (frames count in 16 bits; a hostile anyOf must not fork without end). */
#define GRAMMAR_MAX_TEXT 65535       /* bytes of one literal or escaped property name */
#define GRAMMAR_MAX_PROPERTIES 65535 /* properties of one object */
#define GRAMMAR_MAX_CONFIGS 256      /* anyOf alternatives alive at once */
#define GRAMMAR_MAX_STOP 64          /* bytes of a free text's stop (matched naively per byte) */
/* Digits of a number's integer part, fraction and exponent (as llama.cpp's JSON grammars
 * bound the first two): every number allowed is a finite double (|x| < 10^16 x 10^99), so a
 * model that loves zeros cannot write one that parses as Infinity. */
#define GRAMMAR_MAX_INT_DIGITS 16
#define GRAMMAR_MAX_FRAC_DIGITS 16
#define GRAMMAR_MAX_EXP_DIGITS 2

typedef struct grammar_options {
    uint32_t max_ws;    /* spaces/tabs after a gap's newline (indentation); default 20 */
    uint32_t max_depth; /* object/array nesting bound; default 32, at most 1024 */
} grammar_options;

grammar_options grammar_default_options(void);

typedef struct grammar_def grammar_def;
typedef struct grammar_builder grammar_builder;

/* ---- building a def -------------------------------------------------------------------- */

/* Node ids are small non-negative integers returned through *id. Every builder call is all or
 * nothing: on failure the builder is unchanged. KVS_ENOMEM, KVS_EINVAL (an id that is not a
 * node of this builder, a property on a non-object, a duplicate property name, a text over
 * GRAMMAR_MAX_TEXT, more than GRAMMAR_MAX_PROPERTIES properties). */
int grammar_builder_create(grammar_builder **out);
void grammar_builder_destroy(grammar_builder *b);

/* A placeholder for a node defined later with grammar_builder_alias (recursive $ref). */
int grammar_builder_reserve(grammar_builder *b, int32_t *id);
/* Makes the reserved node `id` stand for `target`. */
int grammar_builder_alias(grammar_builder *b, int32_t id, int32_t target);

int grammar_builder_any(grammar_builder *b, int32_t *id); /* any JSON value */
int grammar_builder_string(grammar_builder *b, int32_t *id);
int grammar_builder_number(grammar_builder *b, bool integer, int32_t *id);
/* One of n JSON texts, each exactly as given (texts[i], lens[i] bytes; copied). The texts
 * must be complete JSON values with no whitespace (cJSON_PrintUnformatted's output). */
int grammar_builder_literals(grammar_builder *b, size_t n, const char *const *texts,
                             const size_t *lens, int32_t *id);
int grammar_builder_array(grammar_builder *b, int32_t items, int32_t *id);
/* An array of at least min_items and at most max_items items (max_items 0: no most), e.g. a
 * list of tool calls that holds one call or more. KVS_EINVAL for a bound over 65535 or
 * min_items > max_items. */
int grammar_builder_array_bounded(grammar_builder *b, int32_t items, uint32_t min_items,
                                  uint32_t max_items, int32_t *id);
/* An object with only the properties added below, in that order. */
int grammar_builder_object(grammar_builder *b, int32_t *id);
/* Appends property `name` (raw UTF-8, len bytes; the builder escapes it as cJSON does). */
int grammar_builder_property(grammar_builder *b, int32_t object, const char *name, size_t len,
                             int32_t value, bool required);
/* Raw text, then a value of `value` with no whitespace between: the len bytes of text exactly
 * (any bytes, not JSON; copied), e.g. gpt-oss's "NAME <|constrain|>json<|message|>" before a
 * call's arguments, which a harmony vocabulary's special tokens spell too, their pieces being
 * that text. A def whose root is one (or an anyOf with one among its alternatives) allows no
 * whitespace before the root. KVS_EINVAL for len 0 or over GRAMMAR_MAX_TEXT. */
int grammar_builder_prefixed(grammar_builder *b, const char *text, size_t len, int32_t value,
                             int32_t *id);
/* Free text ended by a stop, then a value of `value` with no whitespace between: any bytes
 * (not checked as UTF-8) that do not hold the len bytes of stop, then stop (its first
 * occurrence ends the text), e.g. a gpt-oss analysis message's body and its "<|end|>". A def
 * whose root is one (or an anyOf with one among its alternatives) allows no whitespace before
 * the root. KVS_EINVAL for len 0 or over GRAMMAR_MAX_STOP. */
int grammar_builder_text_until(grammar_builder *b, const char *stop, size_t len, int32_t value,
                               int32_t *id);
/* An object with any keys, every value matching `value`. */
int grammar_builder_free_object(grammar_builder *b, int32_t value, int32_t *id);
/* A value matching at least one of alts (n >= 1). Alternatives that are literal nodes are
 * merged into one literal set (an anyOf of many consts is one matcher, not many forks). */
int grammar_builder_any_of(grammar_builder *b, size_t n, const int32_t *alts, int32_t *id);

/* Checks and freezes the graph rooted at root into a new def (*out; the builder stays valid
 * and is still the caller's to destroy); opts NULL means grammar_default_options(). KVS_EINVAL
 * with err naming the problem: a reserved node never aliased, an alias cycle, an anyOf that
 * reaches itself before consuming a byte, a root with no finite instance (a required property
 * that recurses for ever) or needing more than max_depth levels, options out of range;
 * KVS_ENOMEM. *out is untouched on failure. */
int grammar_builder_finish(grammar_builder *b, int32_t root, const grammar_options *opts,
                           grammar_def **out, char *err, size_t err_len);

/* response_format {"type": "json_object"}: any JSON object. KVS_ENOMEM. */
int grammar_def_json_object(const grammar_options *opts, grammar_def **out);
void grammar_def_destroy(grammar_def *d);

/* ---- a vocabulary as a trie ------------------------------------------------------------ */

typedef struct grammar_vocab grammar_vocab;

/* Reads every token's bytes with tok_token_to_piece. Tokens whose piece is empty (control,
 * unknown, unused) are never allowed, except the end tokens: end_ids (n_end of them), or
 * tok_eos(v) when end_ids is NULL, which are allowed exactly when the value is complete.
 * KVS_ENOMEM, KVS_EINVAL. The vocab does not refer to v afterwards. */
int grammar_vocab_create(const tok_vocab *v, const int32_t *end_ids, size_t n_end,
                         grammar_vocab **out);
void grammar_vocab_destroy(grammar_vocab *gv);
int32_t grammar_vocab_n_tokens(const grammar_vocab *gv);
/* Trie size, for benchmarks and logs. */
size_t grammar_vocab_n_nodes(const grammar_vocab *gv);

/* ---- one sequence's state -------------------------------------------------------------- */

typedef struct grammar grammar;

/* A grammar at the start of d's language. d must outlive it (a request owns its def and all
 * of its forks). KVS_ENOMEM. */
int grammar_create(const grammar_def *d, grammar **out);
void grammar_destroy(grammar *g);
/* An independent copy: advancing one never changes the other. KVS_ENOMEM. */
int grammar_clone(const grammar *g, grammar **out);

/* Advances by len bytes. All or nothing: returns false and leaves g unchanged if any byte is
 * not allowed (or memory ran out, or more than GRAMMAR_MAX_CONFIGS anyOf alternatives would be
 * alive at once). */
bool grammar_accept_bytes(grammar *g, const void *bytes, size_t len);
/* Advances by a token's bytes. An end token is accepted iff grammar_is_complete(g), and then
 * leaves g unchanged; an empty-piece token or an id out of range is refused. */
bool grammar_accept_token(grammar *g, const grammar_vocab *gv, int32_t token);

/* The text so far is one complete value: an end token (EOS) is allowed now. */
bool grammar_is_complete(const grammar *g);
/* Complete, and no byte may follow: the sequence should stop (finish_reason "stop"). Tries
 * every byte on g's scratch memory (a few µs when complete, nothing otherwise): like
 * grammar_mask, not concurrently with other calls on the same g. */
bool grammar_is_finished(grammar *g);

/* Words of a mask for n tokens: bit (id % 32) of word (id / 32) is token id. */
static inline size_t grammar_mask_words(int32_t n_tokens)
{
    return ((size_t)n_tokens + 31) / 32;
}

/* Sets mask (grammar_mask_words(n_tokens) words) to the tokens allowed now: those whose
 * every byte the automaton accepts from here, plus the end tokens iff complete. One walk of
 * the vocab's trie; subtrees of plain string text are taken whole. Returns the number of
 * allowed tokens (0 only if the state is a dead end), KVS_ENOMEM, or KVS_ERANGE when some token
 * would keep more than GRAMMAR_MAX_CONFIGS anyOf alternatives alive (a schema that ambiguous
 * fails its request); mask is undefined on error.
 * Uses g's scratch memory: not concurrently with other calls on the same g. */
int grammar_mask(grammar *g, const grammar_vocab *gv, uint32_t *mask);

/* Sets the logits of tokens not in mask to -INFINITY (what the sampler does before drawing). */
void grammar_mask_logits(const uint32_t *mask, int32_t n_tokens, float *logits);

#endif
