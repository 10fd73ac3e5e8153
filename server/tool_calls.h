/* Tool-call syntax per chat-template family: how a request's tools, an assistant's earlier
 * tool_calls and role "tool" results are written into the prompt, and how calls are read back
 * out of generated text.
 *
 *   CHATML (Qwen 2/2.5, Hermes)  tools listed in <tools></tools> in the system turn; a call is
 *                                <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>;
 *                                a result is a user turn <tool_response>...</tool_response>
 *   LLAMA3 (3.1+ JSON calls)     tools as JSON in the system turn; a call is one JSON object
 *                                {"name": ..., "parameters": {...}} ("arguments" read too);
 *                                a result is an "ipython" turn. LLAMA31 / LLAMA32 (their
 *                                official templates): the tools, indented 4, open the first
 *                                user turn, "Environment: ipython" in the system turn, and a
 *                                result is written as a JSON string
 *   QWEN3 and ChatML             calls and tools as Jinja's tojson prints them (json_py.h),
 *                                results in a row in one user turn
 *   MISTRAL                      [AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS] in the system text;
 *                                calls are [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...];
 *                                a result is [TOOL_RESULTS]{...}[/TOOL_RESULTS] in a user turn
 *   HARMONY (gpt-oss)            tools as a TypeScript namespace functions in the developer
 *                                message; a call is <|start|>assistant to=functions.NAME
 *                                <|channel|>commentary json<|message|>{...}<|call|> (the model
 *                                writes the recipient after the channel as well: the reasoning
 *                                splitter rewrites its calls to this form in the content); a
 *                                result is a message from functions.NAME, a JSON string
 *   GRANITE (Granite 3.1)        tools as tojson(indent=4) in a tools turn after the system
 *                                turn (its default system text then says it has tools); the model
 *                                calls with <|tool_call|>[{"name": ..., "arguments": {...}}, ...];
 *                                an earlier call is not written back (the template writes an
 *                                assistant turn's content alone); a result is a turn of role
 *                                tool, its content as it is
 *   GRANITE40 (Granite 4.0)      CHATML's tags in its own words: the tools, each tojson, in
 *                                <tools></tools> after the system text (a blank line apart;
 *                                alone when there is none); a call is <tool_call>\n{"name":
 *                                "NAME", "arguments": {...}}\n</tool_call> after the content,
 *                                a line before each but a first one with no content; results in
 *                                a row one user turn, each "\n<tool_response>\n...\n
 *                                </tool_response>"; calls read back as CHATML's
 *   LFM2 (Liquid AI LFM2, LFM2.5) the tools as "List of tools: [...]" (each tool tojson) after
 *                                the system text, a line apart (LFM2's between <|tool_list_start|>
 *                                and <|tool_list_end|>; LFM2.5-8B-A1B's a blank line apart, after
 *                                "Today's date: YYYY-MM-DD"); the model calls with
 *                                <|tool_call_start|>[f(a=1, b="x"), g()]<|tool_call_end|>, Python
 *                                calls whose arguments are Python literals (True, None, 'x', [..],
 *                                {..}; JSON's true, false, null too), the text around the block
 *                                content; an earlier call is not written back, but by
 *                                LFM2.5-8B-A1B's template (in Python form, after the content); a
 *                                result is a turn of role tool (LFM2's wrapped in
 *                                <|tool_response_start|>...<|tool_response_end|>)
 *   every other family (PLAIN…)  the generic form: CHATML's wording and <tool_call> tags
 *
 * A forced call (tool_choice "required" or a named function) is generated under the grammar of
 * srv_json_schema_compile_tools from the first token: the whole text is then one
 * {"name", "arguments"} object, whatever the family, except GRANITE's, HARMONY's and LFM2's
 * (its markers around a JSON list, llama.cpp's form, not its Python one), whose forced calls are
 * written in their own syntax (server/api.h tool_native) and read as unforced ones, and
 * GRANITE40's, "<tool_call>\n" then one call object, the block left unclosed (the grammar cannot
 * ask for text after a value), read as an unforced one too. Pure functions, any thread. */
#ifndef KVS_SERVER_TOOL_CALLS_H
#define KVS_SERVER_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/chat_template.h"

/* The system text that presents tools (an OpenAI tools array, already validated) to the
 * model. Returns 0 and a malloc'd *out, or KVS_ENOMEM. */
int srv_tools_render_system(enum srv_chat_tmpl t, const cJSON *tools, char **out);

/* An assistant message's earlier tool_calls (OpenAI array of {id, type, function: {name,
 * arguments (a JSON string)}}, already validated) as family t writes them, after content
 * (may be NULL). Returns 0 and a malloc'd *out, or KVS_ENOMEM. */
int srv_tools_render_calls(enum srv_chat_tmpl t, const char *content, const cJSON *tool_calls,
                           char **out);

/* What separates a request's system text from the tools' text (srv_tools_render_system) in
 * the system turn: "\n\n", but for LFM2 and LFM2.5 "\n" (LFM2.5-8B-A1B "\n\n"), and nothing
 * after an empty system text. Static. */
const char *srv_tools_system_sep(enum srv_chat_tmpl t, const char *system);

/* The calls family t's template writes apart from an assistant's content (LFM2.5-8B-A1B: its
 * Python form, <|tool_call_start|>[f(a=1, b='x')]<|tool_call_end|>, after the content: for
 * srv_chat_extra.calls): 0 and a malloc'd *out, *out NULL for the other families; KVS_ENOMEM. */
int srv_tools_render_calls_apart(enum srv_chat_tmpl t, const cJSON *tool_calls, char **out);

/* Harmony (gpt-oss): the first call's arguments (tool_calls already validated) as its
 * template's tojson writes them. Returns 0 and a malloc'd *out, or KVS_ENOMEM. */
int srv_tools_render_call_args(enum srv_chat_tmpl t, const cJSON *tool_calls, char **out);

/* A role "tool" message: the role its turn is rendered with (static) and its content
 * (malloc'd). Returns 0 or KVS_ENOMEM. */
int srv_tools_render_result(enum srv_chat_tmpl t, const char *call_id, const char *content,
                            const char **role, char **out);

/* Whether the family's template places the tools itself (Llama 3.1/3.2: in the first user
 * turn; Granite: in a turn of their own): srv_tools_render_system's text then goes to
 * srv_chat_opts.tools_user. */
bool srv_tools_in_user_turn(enum srv_chat_tmpl t);
/* Whether results in a row are one turn: NULL if not, else what joins their texts (static):
 * "\n" for the Hermes-style families, "" for Granite 4.0 (each of its results opens with a
 * newline). */
const char *srv_tools_merge_sep(enum srv_chat_tmpl t);

/* Reads calls out of generated text (len bytes). forced: the text is one {"name",
 * "arguments"} object. Only calls naming one of tools with an object as arguments count; in
 * the unforced case anything else stays content. On success returns the number of calls
 * (0: none, the text is all content) with *calls an OpenAI tool_calls array (ids
 * "call_<id_base>_<i>", arguments as JSON strings) and *content the text outside the calls
 * (both malloc'd, NULL when there are no calls); KVS_ENOMEM. */
int srv_tools_parse(enum srv_chat_tmpl t, const char *text, size_t len, bool forced,
                    const cJSON *tools, const char *id_base, cJSON **calls, char **content);

/* How many leading bytes of text (a stream's answer so far, len bytes, not forced) are content
 * whatever comes next, so they can be streamed before the answer ends: up to where a call's
 * marker (<tool_call>, [TOOL_CALLS], <|tool_call_start|>) starts or may be starting, none while a
 * Llama 3 answer is blank or opens with "{" (its calls are the whole text). Those bytes are always
 * a prefix of srv_tools_parse's *content (or of the text, when it finds no calls). */
size_t srv_tools_stream_safe(enum srv_chat_tmpl t, const char *text, size_t len);

#endif
