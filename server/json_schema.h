/* JSON Schema -> grammar_def (engine/grammar.h): the subset OpenAI's strict structured outputs
 * accept. Supported: type (a name or a list of names) object / array / string / number /
 * integer / boolean / null; properties (kept in the schema's order), required,
 * additionalProperties false (or absent: no other keys either way); items (absent: any value);
 * enum and const (of any JSON values; the model must write them as cJSON_PrintUnformatted
 * does); anyOf; $ref to "#" or a JSON pointer into the document ($defs, definitions),
 * recursive too; the annotations title, description, $comment, examples, default, $schema,
 * $id, deprecated, readOnly, writeOnly (ignored). A schema with no type, enum, const, anyOf or
 * $ref is any value ({} and true), or an object if it has properties. Anything else is refused,
 * never ignored, so the output can always be trusted to satisfy the schema. */
#ifndef KVS_SERVER_JSON_SCHEMA_H
#define KVS_SERVER_JSON_SCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "engine/grammar.h"

/* Compiles schema into a new def (*out, the caller's to grammar_def_destroy; untouched on
 * failure). Errors, with err naming the problem and the JSON pointer of the offending keyword
 * (e.g. `unsupported keyword "pattern" at #/properties/name/pattern`), ready for a 400:
 * KVS_EUNSUPPORTED for a keyword or form outside the subset, KVS_EINVAL for a malformed schema
 * (a required name not in properties, a $ref that resolves to nothing, a schema with no
 * finite instance), KVS_ENOMEM. Pure: any thread. */
int srv_json_schema_compile(const cJSON *schema, const grammar_options *opts, grammar_def **out,
                            char *err, size_t err_len);

/* Tool calls (tool_choice "required" or a named function): one JSON object
 * {"name": "<function name>", "arguments": <an instance of its parameters schema>}, keys in that
 * order, for any of tools (an OpenAI tools array of {"type": "function", "function": {"name",
 * "parameters"}}), or only for the function named only (NULL: any). Each tool's parameters is
 * compiled as its own document (its "#" is itself); no parameters means {}. Errors as above,
 * prefixed with "tools[i].function.parameters: "; KVS_EINVAL if only names no tool. */
int srv_json_schema_compile_tools(const cJSON *tools, const char *only, const grammar_options *opts,
                                  grammar_def **out, char *err, size_t err_len);

/* The calls of tools (or of the one named only, NULL: any) as one node *id of b, for a family
 * whose own call syntax wraps them (server/api.c): sep NULL, each call the {"name",
 * "arguments"} object above; else raw text NAME sep ARGS (grammar_builder_prefixed), NAME a
 * tool's name as it is (not JSON), e.g. gpt-oss's " <|constrain|>json<|message|>" before the
 * arguments. Errors as above; on failure b may hold nodes that nothing refers to (the caller
 * destroys it). */
int srv_json_schema_tool_calls(grammar_builder *b, const cJSON *tools, const char *only,
                               const char *sep, int32_t *id, char *err, size_t err_len);

#endif
