/* Server pieces that need no model: request validation (field named in the error), config
 * parsing (file + flags), the Prometheus text (cumulative buckets, no colons), and the relay
 * on a loopback connection. */
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/status.h"
#include "server/api.h"
#include "server/config.h"
#include "server/embeddings.h"
#include "server/tool_calls.h"
#include "engine/grammar.h"
#include "server/json_py.h"
#include "server/kv_view.h"
#include "server/http_head.h"
#include "server/metrics.h"
#include "server/reasoning.h"
#include "server/relay.h"
#include "server/response.h"

static const sampler_params k_defaults = {.temperature = 1, .top_p = 1, .repetition_penalty = 1};

static int parse(const char *body, bool chat, srv_request *r, srv_error *e)
{
    static const srv_chat_fmt plain = {.tmpl = SRV_CHAT_PLAIN};
    return srv_request_parse(body, strlen(body), chat, &plain, &k_defaults, r, e);
}

static void expect_400(const char *body, bool chat, const char *param)
{
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (parse(body, chat, &r, &e) == 0)
        fail_msg("accepted: %s", body);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    assert_string_equal(e.param, param);
}

static void test_completion_ok(void **state)
{
    (void)state;
    srv_request r;
    srv_error e;
    assert_int_equal(parse("{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0,"
                           "\"stop\":[\"a\",\"b\"],\"n\":2,\"seed\":7,\"logprobs\":3,"
                           "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                           "\"user\":\"u\",\"unknown_field\":[1,2]}",
                           false, &r, &e),
                     0);
    assert_string_equal(r.prompt_text, "Once");
    assert_true(r.has_max_tokens);
    assert_int_equal(r.max_tokens, 5);
    assert_true(r.sampling.temperature == 0.0f);
    assert_true(r.sampling.top_p == 1.0f);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "b");
    assert_int_equal(r.n, 2);
    assert_true(r.has_seed);
    assert_int_equal(r.sampling.seed, 7);
    assert_int_equal(r.n_top_logprobs, 3);
    assert_true(r.stream && r.include_usage);
    srv_request_free(&r);

    assert_int_equal(parse("{\"prompt\":[1,403,407]}", false, &r, &e), 0);
    assert_null(r.prompt_text);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[1], 403);
    assert_false(r.has_max_tokens);
    assert_int_equal(r.max_tokens, 16);
    assert_int_equal(r.n_top_logprobs, -1);
    srv_request_free(&r);

    assert_int_equal(
        parse("{\"prompt\":[\"one\"],\"max_completion_tokens\":9,\"stop\":\"x\"}", false, &r, &e),
        0);
    assert_string_equal(r.prompt_text, "one");
    assert_int_equal(r.max_tokens, 9);
    assert_int_equal(r.n_stop, 1);
    srv_request_free(&r);
}

static void test_chat_ok(void **state)
{
    (void)state;
    srv_request r;
    srv_error e;
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
                           "\"logprobs\":true,\"top_logprobs\":2}",
                           true, &r, &e),
                     0);
    assert_string_equal(r.prompt_text, "Once upon a time");
    assert_int_equal(r.n_top_logprobs, 2);
    srv_request_free(&r);
    assert_int_equal(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"A\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"B\"},"
                           "{\"type\":\"text\",\"text\":\"C\"}]}]}",
                           true, &r, &e),
                     0);
    assert_string_equal(r.prompt_text, "A\nB\nC");
    assert_int_equal(r.n_top_logprobs, -1);
    srv_request_free(&r);
}

static void test_rejects(void **state)
{
    (void)state;
    expect_400("{\"prompt\":", false, "");
    expect_400("[1,2]", false, "");
    expect_400("{}", false, "prompt");
    expect_400("{\"prompt\":5}", false, "prompt");
    expect_400("{\"prompt\":[1,\"a\"]}", false, "prompt");
    expect_400("{\"prompt\":[]}", false, "prompt");
    expect_400("{\"prompt\":[\"a\",5]}", false, "prompt"); /* a prompt array of mixed kinds */
    srv_request r;
    srv_error e;
    expect_400("{\"prompt\":\"a\",\"max_tokens\":0}", false, "max_tokens");
    expect_400("{\"prompt\":\"a\",\"max_tokens\":\"5\"}", false, "max_tokens");
    expect_400("{\"prompt\":\"a\",\"max_tokens\":1.5}", false, "max_tokens");
    expect_400("{\"prompt\":\"a\",\"max_completion_tokens\":-1}", false, "max_completion_tokens");
    expect_400("{\"prompt\":\"a\",\"temperature\":-0.1}", false, "temperature");
    expect_400("{\"prompt\":\"a\",\"temperature\":\"hot\"}", false, "temperature");
    expect_400("{\"prompt\":\"a\",\"top_p\":0}", false, "top_p");
    expect_400("{\"prompt\":\"a\",\"top_p\":1.5}", false, "top_p");
    expect_400("{\"prompt\":\"a\",\"top_k\":-2}", false, "top_k");
    expect_400("{\"prompt\":\"a\",\"min_p\":2}", false, "min_p");
    expect_400("{\"prompt\":\"a\",\"presence_penalty\":3}", false, "presence_penalty");
    expect_400("{\"prompt\":\"a\",\"frequency_penalty\":-3}", false, "frequency_penalty");
    expect_400("{\"prompt\":\"a\",\"repetition_penalty\":0}", false, "repetition_penalty");
    expect_400("{\"prompt\":\"a\",\"n\":0}", false, "n");
    expect_400("{\"prompt\":\"a\",\"n\":1000}", false, "n");
    expect_400("{\"prompt\":\"a\",\"seed\":\"x\"}", false, "seed");
    expect_400("{\"prompt\":\"a\",\"stop\":[\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\","
               "\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\"]}",
               false, "stop");
    assert_int_equal(parse("{\"prompt\":\"a\",\"stop\":[\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\","
                           "\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\"]}",
                           false, &r, &e),
                     0);
    assert_int_equal(r.n_stop, 16);
    assert_string_equal(r.stop[15], "15");
    srv_request_free(&r);
    expect_400("{\"prompt\":\"a\",\"stop\":[1]}", false, "stop");
    expect_400("{\"prompt\":\"a\",\"stop\":3}", false, "stop");
    expect_400("{\"prompt\":\"a\",\"logprobs\":6}", false, "logprobs");
    expect_400("{\"prompt\":\"a\",\"stream\":\"yes\"}", false, "stream");
    expect_400("{\"prompt\":\"a\",\"ignore_eos\":1}", false, "ignore_eos");
    expect_400("{\"prompt\":\"a\",\"model\":3}", false, "model");
    expect_400("{\"prompt\":\"a\",\"user\":3}", false, "user");
    expect_400("{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":1}}", false,
               "stream_options.include_usage");
    expect_400("{}", true, "messages");
    expect_400("{\"messages\":[]}", true, "messages");
    expect_400("{\"messages\":\"hi\"}", true, "messages");
    expect_400("{\"messages\":[{\"content\":\"hi\"}]}", true, "messages");
    expect_400("{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", true, "messages");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", true, "messages");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":3}", true,
               "logprobs");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}", true,
               "top_logprobs");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,"
               "\"top_logprobs\":21}",
               true, "top_logprobs");
}

/* Prompt arrays, logit_bias, response_format and the OpenAI fields not implemented. */
static void test_new_fields(void **state)
{
    (void)state;
    srv_request r;
    srv_error e;
    assert_int_equal(parse("{\"prompt\":[\"a\",[5,6],\"c\"],\"logit_bias\":{\"7\":-100,"
                           "\"12\":2.5}}",
                           false, &r, &e),
                     0);
    assert_string_equal(r.prompt_text, "a");
    assert_int_equal(r.n_more, 2);
    assert_int_equal(r.more[0].n_ids, 2);
    assert_int_equal(r.more[0].ids[1], 6);
    assert_string_equal(r.more[1].text, "c");
    assert_int_equal(r.n_logit_bias, 2);
    assert_int_equal(r.logit_bias[1].id, 12);
    assert_true(r.logit_bias[1].bias == 2.5f);
    assert_null(r.grammar);
    srv_request_free(&r);
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                           "{\"name\":\"n\",\"schema\":{\"type\":\"object\",\"properties\":"
                           "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}",
                           true, &r, &e),
                     0);
    assert_non_null(r.grammar);
    assert_string_equal(r.format_type, "json_schema");
    srv_request_free(&r);
    expect_400("{\"prompt\":[\"a\",7]}", false, "prompt");
    expect_400("{\"prompt\":\"a\",\"logit_bias\":{\"1\":100.5}}", false, "logit_bias");
    expect_400("{\"prompt\":\"a\",\"logit_bias\":{\"1x\":1}}", false, "logit_bias");
    expect_400("{\"prompt\":\"a\",\"response_format\":{\"type\":\"xml\"}}", false,
               "response_format.type");
    expect_400("{\"prompt\":\"a\",\"echo\":1}", false, "echo");
    expect_400("{\"prompt\":\"a\",\"echo\":false,\"max_tokens\":0}", false, "max_tokens");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", true,
               "max_tokens");
    assert_int_equal(parse("{\"prompt\":\"a\",\"echo\":true,\"max_tokens\":0}", false, &r, &e), 0);
    assert_true(r.echo);
    assert_int_equal(r.max_tokens, 0);
    srv_request_free(&r);
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", true,
               "tools");
    expect_400("{\"messages\":[{\"role\":\"user\"}]}", true, "messages");
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"tools\":[],\"store\":false,\"tool_choice\":\"none\"}",
                           true, &r, &e),
                     0);
    srv_request_free(&r);
}

/* --cors-origin: repeatable on the command line, a string or array in the file; checked. */
static void test_cors_config(void **state)
{
    (void)state;
    srv_config c;
    char err[256];
    srv_config_defaults(&c);
    assert_null(c.cors_origins);
    char *argv[] = {"serve", "--cors-origin", "http://a.example", "--cors-origin=*"};
    assert_int_equal(srv_config_parse(&c, 4, argv, err, sizeof err), 0);
    assert_string_equal(c.cors_origins, "http://a.example\n*");
    assert_int_equal(
        srv_config_apply_json(&c, "{\"cors_origin\": [\"https://b.example:1\"]}", err, sizeof err),
        0);
    assert_string_equal(c.cors_origins, "https://b.example:1");
    assert_int_equal(srv_config_apply_json(&c, "{\"cors-origin\": []}", err, sizeof err), 0);
    assert_null(c.cors_origins);
    char *bad[] = {"serve", "--cors-origin", "a.example"};
    assert_int_equal(srv_config_parse(&c, 3, bad, err, sizeof err), KVS_EINVAL);
    assert_int_equal(srv_config_apply_json(&c, "{\"cors-origin\": [1]}", err, sizeof err),
                     KVS_EINVAL);
    srv_config_free(&c);
}

/* Tool-call syntax per family: calls read back out of text (only calls to known tools with
 * object arguments), everything else stays content; the renderings carry what they must. */
/* Streaming an unforced tool answer: at every prefix, what srv_tools_stream_safe lets out is
 * a prefix of the content the whole answer parses to (so nothing sent is ever taken back). */
static void stream_safe_holds(enum srv_chat_tmpl t, const cJSON *tools, const char *text,
                              size_t want_final_safe)
{
    size_t n = strlen(text);
    cJSON *calls;
    char *rest;
    int k = srv_tools_parse(t, text, n, false, tools, "s", &calls, &rest);
    assert_true(k >= 0);
    const char *content = k > 0 ? rest : text;
    for (size_t i = 0; i <= n; i++) {
        size_t safe = srv_tools_stream_safe(t, text, i);
        assert_true(safe <= i);
        assert_true(strlen(content) >= safe);
        assert_memory_equal(content, text, safe);
    }
    assert_int_equal(srv_tools_stream_safe(t, text, n), want_final_safe);
    cJSON_Delete(calls);
    free(rest);
}

static void test_tool_calls_stream_safe(void **state)
{
    (void)state;
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]");
    const char *call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    char text[256];
    snprintf(text, sizeof text, "Let me add.\n%s\nDone <tool", call);
    stream_safe_holds(SRV_CHAT_CHATML, tools, text, strlen("Let me add.\n"));
    stream_safe_holds(SRV_CHAT_QWEN3, tools, "No call here, <tool_ca", strlen("No call here, "));
    stream_safe_holds(SRV_CHAT_CHATML, tools, "<tool_call>{\"name\": \"nope\"}</tool_call>", 0);
    stream_safe_holds(SRV_CHAT_MISTRAL, tools,
                      "Ok [TOOL_CALLS][{\"name\": \"add\", \"arguments\": {}}]", 3);
    stream_safe_holds(SRV_CHAT_LLAMA3, tools, " {\"name\": \"add\", \"parameters\": {}}", 0);
    stream_safe_holds(SRV_CHAT_LLAMA3, tools, "It is 4.", 8);
    stream_safe_holds(SRV_CHAT_GRANITE, tools,
                      "Ok <|tool_call|>[{\"name\": \"add\", \"arguments\": {}}]", 3);
    stream_safe_holds(SRV_CHAT_LFM2, tools,
                      "Ok <|tool_call_start|>[add(a=1)]<|tool_call_end|> done <|tool_cal", 3);
    stream_safe_holds(SRV_CHAT_LFM25, tools, "No call <|tool_call_start|>[nope()]", 8);
    cJSON_Delete(tools);
}

/* Python's json.dumps layout, which Jinja's tojson writes: ", " and ": ", or indent=4. */
static void test_json_py(void **state)
{
    (void)state;
    cJSON *j = cJSON_Parse("{\"a\":[1,2.5,\"x\\n\\u00e9\"],\"b\":{},\"c\":[],\"d\":{\"e\":null}}");
    kvs_buf b = {0};
    srv_json_py(&b, j, 0);
    assert_string_equal(
        b.p, "{\"a\": [1, 2.5, \"x\\n\u00e9\"], \"b\": {}, \"c\": [], \"d\": {\"e\": null}}");
    kvs_buf_free(&b);
    srv_json_py(&b, j, 4);
    assert_string_equal(
        b.p, "{\n    \"a\": [\n        1,\n        2.5,\n        \"x\\n\u00e9\"\n    ],\n"
             "    \"b\": {},\n    \"c\": [],\n    \"d\": {\n        \"e\": null\n    }\n}");
    kvs_buf_free(&b);
    cJSON_Delete(j);
}

static void test_tool_calls(void **state)
{
    (void)state;
    char *out_py;
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"add\"}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"w\"}}]");
    assert_non_null(tools);
    cJSON *calls;
    char *rest;
    const char *hermes = "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n"
                         "</tool_call>\n<tool_call>{\"name\":\"nope\",\"arguments\":{}}</tool_call>"
                         "<tool_call>{\"name\":\"w\",\"arguments\":{}}</tool_call>";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_CHATML, hermes, strlen(hermes), false, tools, "x", &calls, &rest),
        2);
    const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "add");
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"a\":1}");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "id")->valuestring,
                        "call_x_1");
    assert_non_null(strstr(rest, "Sure."));
    assert_non_null(strstr(rest, "nope")); /* an unknown tool stays text */
    assert_null(strstr(rest, "\"add\""));
    cJSON_Delete(calls);
    free(rest);

    const char *l3 = "{\"name\": \"w\", \"parameters\": {\"city\": \"P\"}}";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_LLAMA3, l3, strlen(l3), false, tools, "y", &calls, &rest), 1);
    assert_string_equal(rest, "");
    cJSON_Delete(calls);
    free(rest);
    /* Llama 3.1 and 3.2 templates speak the same call syntax. */
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_LLAMA32, l3, strlen(l3), false, tools, "y", &calls, &rest), 1);
    cJSON_Delete(calls);
    free(rest);
    const char *story = "Once upon a time {\"name\": \"w\", \"parameters\": {}}";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_LLAMA3, story, strlen(story), false, tools, "y", &calls, &rest),
        0);
    assert_null(calls);

    const char *mi = "[TOOL_CALLS][{\"name\":\"add\",\"arguments\":{\"a\":2}},{\"name\":\"w\","
                     "\"arguments\":{}}]";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_MISTRAL, mi, strlen(mi), false, tools, "z", &calls, &rest), 2);
    cJSON_Delete(calls);
    free(rest);
    /* Granite: <|tool_call|> and a JSON list, the text before it content */
    const char *gr = "Sure.<|tool_call|>[{\"name\": \"add\", \"arguments\": {\"a\": 2}}]";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_GRANITE, gr, strlen(gr), false, tools, "g", &calls, &rest), 1);
    assert_string_equal(rest, "Sure.");
    cJSON_Delete(calls);
    free(rest);
    /* LFM2: Python calls between <|tool_call_start|> and <|tool_call_end|>, the text around
     * them content; Python literals (and JSON's) as JSON */
    const char *lf = "Sure. <|tool_call_start|>[add(a=1, b=\"x\\\"y\\n\\u00e9\", c='it\\'s', "
                     "d=True, e=None, f=-2.5e3, g=[1, 'two', (3, false)], h={'k': null, \"l\": "
                     "{}},), w()]<|tool_call_end|> Done.";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_LFM2, lf, strlen(lf), false, tools, "l", &calls, &rest), 2);
    assert_string_equal(rest, "Sure.  Done.");
    fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "add");
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring,
                        "{\"a\":1,\"b\":\"x\\\"y\\né\",\"c\":\"it's\",\"d\":true,"
                        "\"e\":null,\"f\":-2500,\"g\":[1,\"two\",[3,false]],\"h\":{\"k\":null,"
                        "\"l\":{}}}");
    fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "function");
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "w");
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{}");
    cJSON_Delete(calls);
    free(rest);
    /* llama.cpp's LFM2 form, a JSON list of {"name", "arguments"} in the block, closed or (a
     * forced call's) ending the text */
    static const char *const json_forms[] = {
        "Ok <|tool_call_start|>[{\"name\": \"w\", \"arguments\": {}}, {\"name\": \"add\", "
        "\"arguments\": {\"a\": 2}}]<|tool_call_end|>",
        "<|tool_call_start|>[{\"name\":\"w\",\"arguments\":{}},{\"name\":\"add\","
        "\"arguments\":{\"a\":2}}] \n",
    };
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(srv_tools_parse(SRV_CHAT_LFM2, json_forms[i], strlen(json_forms[i]), false,
                                         tools, "j", &calls, &rest),
                         2);
        assert_string_equal(rest, i ? "" : "Ok ");
        fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "function");
        assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "add");
        assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"a\":2}");
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "id")->valuestring,
                            "call_j_1");
        cJSON_Delete(calls);
        free(rest);
    }
    /* an unknown tool, a block that is not Python calls, an unclosed one (unless a JSON list of
     * calls ends the text), a JSON list with a non-call: all text */
    static const char *const not_calls[] = {
        "<|tool_call_start|>[{\"name\": \"add\", \"arguments\": {}}, 3]<|tool_call_end|>",
        "<|tool_call_start|>[{\"name\": \"add\", \"arguments\": {}}] more",
        "<|tool_call_start|>[{\"name\": \"nope\", \"arguments\": {}}]",
        "<|tool_call_start|>[nope(a=1)]<|tool_call_end|>",
        "<|tool_call_start|>[add(a=)]<|tool_call_end|>",
        "<|tool_call_start|>[add(1)]<|tool_call_end|>",
        "<|tool_call_start|>[add(a=1]<|tool_call_end|>",
        "<|tool_call_start|>[add(a='x)]<|tool_call_end|>",
        "<|tool_call_start|>[add(a=1)] x<|tool_call_end|>",
        "<|tool_call_start|>[add(a=1)]",
    };
    for (size_t i = 0; i < sizeof not_calls / sizeof not_calls[0]; i++) {
        assert_int_equal(srv_tools_parse(SRV_CHAT_LFM25, not_calls[i], strlen(not_calls[i]), false,
                                         tools, "n", &calls, &rest),
                         0);
        assert_null(calls);
    }
    /* LFM2.5-8B-A1B's template writes a call back in its Python form */
    cJSON *py = cJSON_Parse("[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                            "\"add\",\"arguments\":\"{\\\"s\\\":\\\"it's\\\",\\\"t\\\":true,"
                            "\\\"n\\\":null,\\\"x\\\":2.5,\\\"l\\\":[\\\"a\\\",\\\"b'c\\\",false],"
                            "\\\"d\\\":{\\\"k\\\":1}}\"}},{\"id\":\"c2\",\"type\":\"function\","
                            "\"function\":{\"name\":\"w\",\"arguments\":\"{}\"}}]");
    assert_non_null(py);
    assert_int_equal(srv_tools_render_calls_apart(SRV_CHAT_LFM25_8B, py, &out_py), 0);
    assert_string_equal(out_py, "<|tool_call_start|>[add(s='it's', t=True, n=None, x=2.5, "
                                "l=['a', \"b'c\", False], d={\"k\": 1}), w()]<|tool_call_end|>");
    free(out_py);
    assert_int_equal(srv_tools_render_calls_apart(SRV_CHAT_LFM25, py, &out_py), 0);
    assert_null(out_py);
    assert_int_equal(srv_tools_render_calls(SRV_CHAT_LFM25_8B, "Ok.", py, &out_py), 0);
    assert_string_equal(out_py, "Ok."); /* the calls go apart */
    free(out_py);
    cJSON_Delete(py);
    /* forced: the whole text is one object, whatever the family */
    const char *forced = " {\"name\":\"add\",\"arguments\":{\"a\":3}}";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_CHATML, forced, strlen(forced), true, tools, "f", &calls, &rest),
        1);
    cJSON_Delete(calls);
    free(rest);
    /* arguments must be an object */
    const char *bad = "<tool_call>{\"name\":\"add\",\"arguments\":\"a=1\"}</tool_call>";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_CHATML, bad, strlen(bad), false, tools, "b", &calls, &rest), 0);

    char *out;
    assert_int_equal(srv_tools_render_system(SRV_CHAT_CHATML, tools, &out), 0);
    assert_non_null(strstr(out, "<tools>"));
    assert_non_null(strstr(out, "\"name\": \"add\"")); /* as a template's tojson prints it */
    free(out);
    cJSON *hist = cJSON_Parse("[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                              "\"add\",\"arguments\":\"{\\\"a\\\":1}\"}}]");
    assert_int_equal(srv_tools_render_calls(SRV_CHAT_LLAMA3, NULL, hist, &out), 0);
    assert_string_equal(out, "{\"name\": \"add\", \"parameters\": {\"a\": 1}}");
    free(out);
    assert_int_equal(srv_tools_render_calls(SRV_CHAT_MISTRAL, "", hist, &out), 0);
    assert_string_equal(out, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}}]");
    free(out);
    const char *role;
    assert_int_equal(srv_tools_render_result(SRV_CHAT_LLAMA3, "c1", "42", &role, &out), 0);
    assert_string_equal(role, "ipython");
    assert_string_equal(out, "42");
    free(out);
    assert_int_equal(srv_tools_render_result(SRV_CHAT_CHATML, "c1", "42", &role, &out), 0);
    assert_string_equal(out, "<tool_response>\n42\n</tool_response>");
    free(out);
    /* LFM2: its tools between markers after "List of tools: ", a line after the system text;
     * a result wrapped in its markers (LFM2.5's as it is) */
    assert_int_equal(srv_tools_render_system(SRV_CHAT_LFM2, tools, &out), 0);
    assert_string_equal(out, "List of tools: <|tool_list_start|>[{\"type\": \"function\", "
                             "\"function\": {\"name\": \"add\"}}, {\"type\": \"function\", "
                             "\"function\": {\"name\": \"w\"}}]<|tool_list_end|>");
    free(out);
    assert_int_equal(srv_tools_render_system(SRV_CHAT_LFM25, tools, &out), 0);
    assert_ptr_equal(strstr(out, "List of tools: [{\"type\""), out);
    free(out);
    assert_int_equal(srv_tools_render_system(SRV_CHAT_LFM25_8B, tools, &out), 0);
    assert_ptr_equal(strstr(out, "Today's date: 2"), out);
    assert_non_null(strstr(out, "\n\nList of tools: [{\"type\""));
    free(out);
    assert_string_equal(srv_tools_system_sep(SRV_CHAT_LFM2, "Be brief."), "\n");
    assert_string_equal(srv_tools_system_sep(SRV_CHAT_LFM25, ""), "");
    assert_string_equal(srv_tools_system_sep(SRV_CHAT_LFM25_8B, "x"), "\n\n");
    assert_string_equal(srv_tools_system_sep(SRV_CHAT_CHATML, ""), "\n\n");
    assert_int_equal(srv_tools_render_result(SRV_CHAT_LFM2, "c1", "42", &role, &out), 0);
    assert_string_equal(role, "tool");
    assert_string_equal(out, "<|tool_response_start|>42<|tool_response_end|>");
    free(out);
    assert_int_equal(srv_tools_render_result(SRV_CHAT_LFM25, "c1", "42", &role, &out), 0);
    assert_string_equal(out, "42");
    free(out);
    assert_null(srv_tools_merge_sep(SRV_CHAT_LFM2));
    assert_int_equal(srv_tools_render_calls(SRV_CHAT_LFM2, "Ok.", hist, &out), 0);
    assert_string_equal(out, "Ok."); /* LFM2's template writes content alone */
    free(out);
    cJSON_Delete(hist);
    cJSON_Delete(tools);
}

static void test_error_json(void **state)
{
    (void)state;
    srv_error e;
    srv_error_set(&e, 400, "max_tokens", "context_length_exceeded", "too long: %d", 3);
    char *s = srv_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"too long: 3\",\"type\":"
                           "\"invalid_request_error\",\"param\":\"max_tokens\",\"code\":"
                           "\"context_length_exceeded\"}}");
    free(s);
    srv_error_set(&e, 429, NULL, NULL, "busy");
    s = srv_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"busy\",\"type\":\"rate_limit_error\","
                           "\"param\":null,\"code\":null}}");
    free(s);
}

static void test_config(void **state)
{
    (void)state;
    char path[] = "/tmp/kvs_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *json = "{\"port\": 9000, \"max_queue\": 3, \"kv-cache-mb\": 64, "
                       "\"api_key\": \"k\", \"no-prefix-cache\": true, \"shutdown_timeout\": 2.5}";
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);

    srv_config c;
    srv_config_defaults(&c);
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.block_size, 16);
    assert_string_equal(c.host, "127.0.0.1");
    char err[256];
    char *argv[] = {"serve", "--port", "9001", "--config", path, "-m", "x.gguf", "--ctx-size=512"};
    assert_int_equal(srv_config_parse(&c, 8, argv, err, sizeof err), 0);
    assert_int_equal(c.port, 9001); /* the flag beats the file */
    assert_int_equal(c.max_queue, 3);
    assert_int_equal(c.kv_cache_mb, 64);
    assert_int_equal(c.ctx_size, 512);
    assert_string_equal(c.api_key, "k");
    assert_string_equal(c.model, "x.gguf");
    assert_true(c.no_prefix_cache);
    assert_true(c.shutdown_timeout == 2.5);
    srv_config_free(&c);

    srv_config_defaults(&c);
    assert_int_equal(srv_config_apply_json(&c, "{\"prot\": 1}", err, sizeof err), KVS_EINVAL);
    assert_non_null(strstr(err, "prot"));
    assert_int_equal(srv_config_apply_json(&c, "{\"port\": \"x\"}", err, sizeof err), KVS_EINVAL);
    char *bad[] = {"serve", "--bogus"};
    assert_int_equal(srv_config_parse(&c, 2, bad, err, sizeof err), KVS_EINVAL);
    char *badv[] = {"serve", "--port", "-3"};
    assert_int_equal(srv_config_parse(&c, 3, badv, err, sizeof err), KVS_EINVAL);
    srv_config_free(&c);
    unlink(path);
}

/* configs/default.json must hold exactly the defaults (every key accepted, values unchanged). */
static void test_default_json(void **state)
{
    (void)state;
    FILE *f = fopen(KVS_SOURCE_ROOT "/configs/default.json", "rb");
    assert_non_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    srv_config a, b;
    srv_config_defaults(&a);
    srv_config_defaults(&b);
    char err[256] = "";
    if (srv_config_apply_json(&b, buf, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(a.port, b.port);
    assert_int_equal(a.kv_cache_mb, b.kv_cache_mb);
    assert_int_equal(a.max_body_bytes, b.max_body_bytes);
    assert_int_equal(a.max_queue, b.max_queue);
    assert_true(a.shutdown_timeout == b.shutdown_timeout);
    assert_string_equal(a.host, b.host);
    srv_config_free(&a);
    srv_config_free(&b);
}

static void test_metrics(void **state)
{
    (void)state;
    sched_metrics m;
    memset(&m, 0, sizeof m);
    m.kv_blocks_total = 100;
    m.kv_blocks_used = 7;
    m.generation_tokens_total = 42;
    sched_hist *h = &m.time_to_first_token_seconds;
    h->n_bounds = 3;
    h->bounds[0] = 0.01;
    h->bounds[1] = 0.1;
    h->bounds[2] = 1;
    h->counts[0] = 2;
    h->counts[1] = 3;
    h->counts[2] = 0;
    h->counts[3] = 1;
    h->count = 6;
    h->sum = 2.5;
    uint64_t req[SRV_N_STATUS] = {0};
    req[srv_status_index(200)] = 5;
    req[srv_status_index(429)] = 1;
    char *t = srv_metrics_format(&m, req, "avx2");
    assert_non_null(t);
    assert_non_null(strstr(t, "# TYPE kvserve_build_info gauge\n"));
    assert_non_null(strstr(t, ",kernels=\"avx2\"} 1\n"));
    assert_non_null(strstr(t, "# TYPE kvserve_kv_blocks_used gauge\nkvserve_kv_blocks_used 7\n"));
    assert_non_null(strstr(t, "kvserve_generation_tokens_total 42\n"));
    assert_non_null(strstr(t, "kvserve_requests_total{status=\"200\"} 5\n"));
    assert_non_null(strstr(t, "kvserve_requests_total{status=\"429\"} 1\n"));
    assert_non_null(strstr(t, "# TYPE kvserve_time_to_first_token_seconds histogram\n"));
    assert_non_null(strstr(t, "kvserve_time_to_first_token_seconds_bucket{le=\"0.01\"} 2\n"));
    assert_non_null(strstr(t, "kvserve_time_to_first_token_seconds_bucket{le=\"0.1\"} 5\n"));
    assert_non_null(strstr(t, "kvserve_time_to_first_token_seconds_sum 2.5\n"));
    assert_non_null(strstr(t, "kvserve_kv_blocks_capacity 100\n"));
    assert_null(strstr(t, "kvserve_kv_blocks_total"));
    assert_non_null(strstr(t, "kvserve_time_to_first_token_seconds_bucket{le=\"1\"} 5\n"));
    assert_non_null(strstr(t, "kvserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 6\n"));
    assert_non_null(strstr(t, "kvserve_time_to_first_token_seconds_count 6\n"));
    /* Every sample line belongs to a family with HELP and TYPE, and no name has a colon. */
    for (char *line = t; *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        if (line[0] != '#') {
            char *sp = strpbrk(line, "{ ");
            assert_non_null(sp);
            assert_null(memchr(line, ':', (size_t)(sp - line)));
            assert_memory_equal(line, "kvserve_", 8);
        }
        line = nl + 1;
    }
    free(t);
}

/* /kv-cache's JSON: cells show the busiest block they cover, counts add up, owners and
 * sequences come through, a large pool folds into at most max_cells cells. */
static void test_kv_view(void **state)
{
    (void)state;
    enum { N = 10 };
    uint8_t st[N] = {0, 1, 2, 2, 2, 0, 0, 1, 2, 0};
    uint16_t refs[N] = {0, 0, 1, 2, 1, 0, 0, 0, 1, 0};
    int32_t owner[N] = {-1, -1, 0, 0, 1, -1, -1, -1, 1, -1};
    sched_kv_seq seqs[2] = {{7, 0, 40, 3, 0}, {7, 1, 36, 3, 0}};
    sched_kv_snapshot k = {.steps = 5,
                           .block_size = 16,
                           .n_blocks = N,
                           .state = st,
                           .refs = refs,
                           .owner = owner,
                           .n_seqs = 2,
                           .seqs = seqs,
                           .n_waiting = 1};
    srv_kv_model m = {"m", "llama", "F16", "avx2", 512};
    char *j = srv_kv_json(&k, &m, 99, 4096);
    assert_non_null(j);
    cJSON *r = cJSON_Parse(j);
    free(j);
    assert_non_null(r);
    assert_string_equal(cJSON_GetObjectItem(r, "cells")->valuestring, ".cusu..cu.");
    assert_int_equal(cJSON_GetObjectItem(r, "blocks_per_cell")->valueint, 1);
    cJSON *bl = cJSON_GetObjectItem(r, "blocks");
    assert_int_equal(cJSON_GetObjectItem(bl, "used")->valueint, 4);
    assert_int_equal(cJSON_GetObjectItem(bl, "shared")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(bl, "cached")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(bl, "free")->valueint, 4);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "owners"), 4)->valueint, 1);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r, "seqs")), 2);
    assert_int_equal(cJSON_GetObjectItem(r, "waiting")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(r, "generation_tokens")->valueint, 99);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "kernels")->valuestring, "avx2");
    cJSON_Delete(r);
    /* folded: 3 cells of 4, 4 and 2 blocks, each its busiest state and that block's owner */
    j = srv_kv_json(&k, &m, 99, 3);
    r = cJSON_Parse(j);
    free(j);
    assert_string_equal(cJSON_GetObjectItem(r, "cells")->valuestring, "suu");
    assert_int_equal(cJSON_GetObjectItem(r, "blocks_per_cell")->valueint, 4);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "owners"), 0)->valueint, 0);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "owners"), 1)->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "blocks"), "free")->valueint, 4);
    cJSON_Delete(r);
}

/* Request heads: complete or not, each RFC 9112 refusal with its status, and the framing
 * rules the kept-alive path applies field by field. */
static int head(const char *h, srv_head *out, srv_error *e)
{
    return srv_head_parse(h, strlen(h), 256, 8, out, e);
}

/* Chunked bodies: size lines with and without extensions, each refusal, incomplete lines;
 * trailer lines; the refusal response's framing. */
static void test_chunk_lines(void **state)
{
    (void)state;
    uint64_t size;
    size_t n;
    srv_error e;
    static const struct {
        const char *line;
        uint64_t size;
    } good[] = {
        {"0\r\n", 0},           {"1e\r\n", 30},           {"FF\r\n", 255},
        {"5;a=b\r\n", 5},       {"5 ; a=\"b c\"\r\n", 5}, {"ffffffffffffffff\r\n", UINT64_MAX},
        {"0000000a;x\r\n", 10},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t len = strlen(good[i].line);
        assert_int_equal(srv_chunk_line_parse(good[i].line, len, &size, &n, &e), 1);
        assert_true(size == good[i].size);
        assert_int_equal(n, len);
        /* one byte short of its LF: incomplete, not refused */
        assert_int_equal(srv_chunk_line_parse(good[i].line, len - 1, &size, &n, &e), 0);
    }
    static const char *bad[] = {
        "\r\n", "zz\r\n", "-5\r\n",      " 5\r\n",      "5 \r\n",
        "5\n",  "5x\r\n", "5;a\x01\r\n", "5;a\x7f\r\n", "10000000000000000\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.status = 0;
        assert_int_equal(srv_chunk_line_parse(bad[i], strlen(bad[i]), &size, &n, &e), -1);
        assert_int_equal(e.status, 400);
    }
    char long_line[SRV_CHUNK_LINE_MAX + 8];
    memset(long_line, 'a', sizeof long_line);
    long_line[0] = '5';
    long_line[1] = ';';
    assert_int_equal(srv_chunk_line_parse(long_line, SRV_CHUNK_LINE_MAX - 1, &size, &n, &e), 0);
    assert_int_equal(srv_chunk_line_parse(long_line, sizeof long_line, &size, &n, &e), -1);
    assert_int_equal(e.status, 400);

    bool last;
    assert_int_equal(srv_trailer_line_parse("X-A: b\r\nrest", 12, 64, &n, &last, &e), 1);
    assert_int_equal(n, 8);
    assert_false(last);
    assert_int_equal(srv_trailer_line_parse("\r\n", 2, 64, &n, &last, &e), 1);
    assert_true(last);
    assert_int_equal(srv_trailer_line_parse("X-A: b", 6, 64, &n, &last, &e), 0);
    assert_int_equal(srv_trailer_line_parse("X-A: b\n", 7, 64, &n, &last, &e), -1);
    assert_int_equal(e.status, 400);
    assert_int_equal(srv_trailer_line_parse("no colon\r\n", 10, 64, &n, &last, &e), -1);
    assert_int_equal(e.status, 400);
    assert_int_equal(srv_trailer_line_parse("X-A: bbbbbbbb", 13, 8, &n, &last, &e), -1);
    assert_int_equal(e.status, 431);

    char out[1024];
    srv_error_set(&e, 505, NULL, NULL, "HTTP version not supported");
    size_t len = srv_refusal_format(&e, out, sizeof out);
    assert_int_equal(len, strlen(out));
    assert_true(!strncmp(out, "HTTP/1.1 505 HTTP Version Not Supported\r\n", 41));
    assert_non_null(strstr(out, "\r\nConnection: close\r\n"));
    const char *body = strstr(out, "\r\n\r\n") + 4;
    size_t clen = strtoul(strstr(out, "Content-Length: ") + 16, NULL, 10);
    assert_int_equal(clen, strlen(body));
    cJSON *j = cJSON_Parse(body);
    assert_non_null(cJSON_GetObjectItem(j, "error"));
    cJSON_Delete(j);
}

static void test_http_head(void **state)
{
    (void)state;
    srv_head h;
    srv_error e;
    assert_int_equal(head("GET /health HTTP/1.1\r\nHost: x\r\n", &h, &e), 0);
    assert_int_equal(head("\r\nGET /a?b=1&c HTTP/1.0\nHost: x\n\nrest", &h, &e), 1);
    assert_int_equal(h.len, strlen("\r\nGET /a?b=1&c HTTP/1.0\nHost: x\n\n"));
    assert_true(h.http10);
    assert_int_equal(h.n_fields, 3);
    assert_int_equal(h.target_len, 8);
    static const struct {
        const char *head;
        int status;
    } bad[] = {
        {"GET /a HTTP/2.0\r\n\r\n", 505},
        {"GET  /a HTTP/1.1\r\n\r\n", 400},
        {"GET /a HTTP/1.1 \r\n\r\n", 400},
        {"GET /a\x01 HTTP/1.1\r\n\r\n", 400},
        {"GET /a HTTP/1.1\r\nHost : x\r\n\r\n", 400},
        {"GET /a HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400},
        {"GET /a HTTP/1.1\r\nA: b\x7f\r\n\r\n", 400},
        {"POST /a HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
        {"POST /a HTTP/1.1\r\nContent-Length:\r\n\r\n", 400},
        {"POST /a HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 3\r\n\r\n", 400},
        {"POST /a HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
        {"POST /a HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
        {"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400},
        {"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
        {"GET /a?1&2&3&4&5&6&7&8 HTTP/1.1\r\nHost: x\r\n\r\n", 431},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.status = 0;
        assert_int_equal(head(bad[i].head, &h, &e), -1);
        assert_int_equal(e.status, bad[i].status);
    }
    char big[300];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET /", 5);
    assert_int_equal(srv_head_parse(big, sizeof big, 256, 8, &h, &e), -1);
    assert_int_equal(e.status, 431);
    /* The same lists of lengths are one length; two codings in two fields are a list. */
    assert_int_equal(head("POST /a HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", &h, &e), 1);
    assert_int_equal(h.framing.length, 5);
    srv_framing f = {0};
    srv_framing_add(&f, "Transfer-Encoding", 17, "gzip", 4);
    srv_framing_add(&f, "transfer-encoding", 17, "chunked", 7);
    assert_int_equal(srv_framing_check(&f, false, &e), -1);
    assert_int_equal(e.status, 501);

    char path[32];
    assert_int_equal(srv_target_path("http://h:1/v1/models?x", 22, path, sizeof path, &e), 0);
    assert_string_equal(path, "/v1/models");
    assert_int_equal(srv_target_path("http://h:1", 10, path, sizeof path, &e), 0);
    assert_string_equal(path, "/");
    assert_int_equal(srv_target_path("/a%2Fb%20c", 10, path, sizeof path, &e), 0);
    assert_string_equal(path, "/a/b c");
    assert_int_equal(srv_target_path("/health%00x", 11, path, sizeof path, &e), -1);
    assert_int_equal(srv_target_path("/a%0a", 5, path, sizeof path, &e), -1);
    assert_int_equal(srv_target_path("/a%4", 4, path, sizeof path, &e), -1);

    char out[32];
    srv_log_escape("/a\nb \"\\\xff", 8, out, sizeof out);
    assert_string_equal(out, "/a\\x0ab\\x20\\x22\\x5c\\xff");
    assert_int_equal(srv_log_escape("\n\n\n", 3, out, 6), 4); /* whole escapes only */
}

/* Splits text whole, and fed at every cut point and byte by byte: every way gives the same. */
static void split_as(enum srv_chat_tmpl tmpl, const char *text, const char *want_r,
                     const char *want_c)
{
    size_t n = strlen(text);
    for (size_t cut = 0; cut <= n + 1; cut++) {
        srv_think t = {0};
        srv_think_set_format(&t, tmpl);
        kvs_buf r = {0}, c = {0};
        if (cut <= n) {
            srv_think_feed(&t, text, cut, &r, &c);
            srv_think_feed(&t, text + cut, n - cut, &r, &c);
        } else {
            for (size_t i = 0; i < n; i++)
                srv_think_feed(&t, text + i, 1, &r, &c);
        }
        srv_think_end(&t, &r, &c);
        assert_false(r.oom || c.oom);
        assert_string_equal(r.p ? r.p : "", want_r);
        assert_string_equal(c.p ? c.p : "", want_c);
        kvs_buf_free(&r);
        kvs_buf_free(&c);
    }
}

static void think_split(const char *text, const char *want_r, const char *want_c)
{
    split_as(SRV_CHAT_QWEN3, text, want_r, want_c);
}

/* Granite 3.2's phrases in the tags' place (as vLLM's granite reasoning parser reads them);
 * Granite 3.3's <think> as Qwen 3's, its <response> tags left in the content (as llama-server
 * leaves them). */
static void test_granite_split(void **state)
{
    (void)state;
    split_as(SRV_CHAT_GRANITE32,
             "Here is my thought process:\n\nA TSP.\n\nHere is my response:\n\nUse a heuristic.",
             "A TSP.", "Use a heuristic.");
    split_as(SRV_CHAT_GRANITE32, "Here is my thought process: hmm", " hmm", "");
    split_as(SRV_CHAT_GRANITE32, "Here is my", "", "Here is my");
    split_as(SRV_CHAT_GRANITE32, "Hello! Here is my thought process:", "",
             "Hello! Here is my thought process:");
    split_as(SRV_CHAT_GRANITE32, "<think>a</think>b", "", "<think>a</think>b");
    split_as(SRV_CHAT_GRANITE33, "<think>a</think><response>b</response>", "a",
             "<response>b</response>");
}

/* gpt-oss's channels (reasoning.h), as llama.cpp's --reasoning-format auto splits them. */
static void test_harmony_split(void **state)
{
    (void)state;
    const char *call = "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>"
                       "{\"a\": 2}<|call|>";
    split_as(SRV_CHAT_HARMONY,
             "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>"
             "final<|message|>Hello! <|end of it|>",
             "User says hi.", "Hello! <|end of it|>");
    /* no analysis; a final answer cut by max_tokens */
    split_as(SRV_CHAT_HARMONY, "<|channel|>final<|message|>Hel", "", "Hel");
    /* cut inside the analysis, or inside the next header: what was said is kept */
    split_as(SRV_CHAT_HARMONY, "<|channel|>analysis<|message|>hmm <|en", "hmm <|en", "");
    split_as(SRV_CHAT_HARMONY, "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|chan",
             "hmm", "");
    /* not harmony at all: all content */
    split_as(SRV_CHAT_HARMONY, "Just text <|channel|>", "", "Just text <|channel|>");
    split_as(SRV_CHAT_HARMONY, "<|chan", "", "<|chan");
    split_as(SRV_CHAT_HARMONY, "", "", "");
    /* a call, the recipient after the channel (and the constraint) or before it */
    split_as(SRV_CHAT_HARMONY,
             "<|channel|>analysis<|message|>Use add.<|end|><|start|>assistant<|channel|>"
             "commentary to=functions.add <|constrain|>json<|message|>{\"a\": 2}",
             "Use add.", call);
    split_as(SRV_CHAT_HARMONY, " to=functions.add<|channel|>commentary json<|message|>{\"a\": 2}",
             "", call);
    /* commentary without a recipient (a preamble) is content; reasoning parts are joined */
    split_as(SRV_CHAT_HARMONY,
             "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary"
             "<|message|>Let me check.<|end|><|start|>assistant<|channel|>analysis<|message|>b"
             "<|end|><|start|>assistant<|channel|>final<|message|>c",
             "ab", "Let me check.c");

    /* the call read out of the content as message.tool_calls */
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]");
    cJSON *calls = NULL;
    char *rest = NULL;
    char text[512];
    snprintf(text, sizeof text, "Let me check.%s", call);
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_HARMONY, text, strlen(text), false, tools, "x", &calls, &rest), 1);
    assert_string_equal(rest, "Let me check.");
    const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "add");
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"a\":2}");
    cJSON_Delete(calls);
    free(rest);
    /* an unknown function stays text; streaming holds back from a call's start */
    const char *other = "<|start|>assistant to=functions.sub<|channel|>commentary json"
                        "<|message|>{}<|call|>";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_HARMONY, other, strlen(other), false, tools, "x", &calls, &rest),
        0);
    assert_int_equal(srv_tools_stream_safe(SRV_CHAT_HARMONY, text, strlen(text)),
                     strlen("Let me check."));
    cJSON_Delete(tools);
}

/* gpt-oss with a forced call: the prompt ends where the assistant's turn begins, as unforced,
 * and the grammar allows only an optional analysis message (free text up to its first <|end|>)
 * then a commentary message calling one of the tools (the named one, for a named choice), in
 * gpt-oss's format; that output reads back through the splitter as the reasoning and the call. */
static void test_harmony_required(void **state)
{
    (void)state;
    static const srv_chat_fmt harmony = {.tmpl = SRV_CHAT_HARMONY};
    static const char tools[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}"
        ","
        "{\"type\":\"function\",\"function\":{\"name\":\"add_all\"}}]";
#define H_CALL(name, args)                                                                         \
    "<|channel|>commentary to=functions." name " <|constrain|>json<|message|>" args
#define H_THINK(text) "<|channel|>analysis<|message|>" text "<|end|><|start|>assistant"
    static const char add1[] = H_CALL("add", "{\"a\": 1}"), all[] = H_CALL("add_all", "{}"),
                      think_add[] = H_THINK("Add 1. <b>|x|</b> <|en\n") H_CALL("add", "{\"a\": 1}");
    static const struct {
        const char *text;
        bool required, named; /* accepted for "required", for the named "add" */
    } cases[] = {
        {add1, true, true},
        {all, true, false},
        {think_add, true, true},
        {H_THINK("") H_CALL("add_all", "{}"), true, false},
        {H_THINK("x"), false, false}, /* no call */
        {H_THINK("x") H_THINK("y") H_CALL("add", "{\"a\": 1}"), false, false},
        {H_THINK("x") "<|channel|>final<|message|>hi", false, false},
        {"<|channel|>final<|message|>hi", false, false},
        {"<|channel|>analysis<|message|>x<|end|>" H_CALL("add", "{\"a\": 1}"), false, false},
        {H_CALL("add", "{}"), false, false},             /* add's schema */
        {H_CALL("add_all", "{\"a\":1}"), false, false},  /* no parameters: {} */
        {" " H_CALL("add", "{\"a\": 1}"), false, false}, /* no gap before the header */
        {H_CALL("add", " {\"a\": 1}"), false, false},    /* nor before the arguments */
        {H_CALL("sub", "{}"), false, false},
        {"{\"name\": \"add\", \"arguments\": {\"a\": 1}}", false, false}, /* the generic form */
        {H_CALL("add", ""), false, false},
    };
    for (int named = 0; named < 2; named++) {
        char body[1024];
        snprintf(
            body, sizeof body,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":%s}", tools,
            named ? "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}" : "\"required\"");
        srv_request r;
        srv_error e;
        memset(&e, 0, sizeof e);
        assert_int_equal(srv_request_parse(body, strlen(body), true, &harmony, &k_defaults, &r, &e),
                         0);
        assert_true(r.tool_native);
        const char *head = "<|start|>assistant";
        size_t pl = strlen(r.prompt_text);
        assert_string_equal(r.prompt_text + pl - strlen(head), head);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            bool want = named ? cases[i].named : cases[i].required;
            grammar *g;
            assert_int_equal(grammar_create(r.grammar, &g), 0);
            bool ok = grammar_accept_bytes(g, cases[i].text, strlen(cases[i].text)) &&
                      grammar_is_complete(g);
            if (ok != want)
                fail_msg("%s: %s: %s", named ? "named" : "required", cases[i].text,
                         ok ? "accepted" : "refused");
            grammar_destroy(g);
        }
        srv_request_free(&r);
    }
    /* read back: the splitter gives the analysis as reasoning and the call to the call reader */
    cJSON *tl = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]");
    srv_think t = {.harmony = true};
    kvs_buf rs = {0}, content = {0};
    srv_think_feed(&t, think_add, strlen(think_add), &rs, &content);
    srv_think_end(&t, &rs, &content);
    assert_int_equal(rs.len, strlen("Add 1. <b>|x|</b> <|en\n"));
    assert_memory_equal(rs.p, "Add 1. <b>|x|</b> <|en\n", rs.len);
    cJSON *calls = NULL;
    char *rest = NULL;
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_HARMONY, content.p, content.len, false, tl, "x", &calls, &rest),
        1);
    assert_string_equal(rest, "");
    const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "add");
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"a\":1}");
    cJSON_Delete(calls);
    cJSON_Delete(tl);
    free(rest);
    kvs_buf_free(&rs);
    kvs_buf_free(&content);
#undef H_CALL
#undef H_THINK

    /* other templates keep the generic form; a name the header cannot carry is a 400 */
    char body[1024];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":"
             "\"required\"}",
             tools);
    srv_request r;
    srv_error e;
    assert_int_equal(parse(body, true, &r, &e), 0);
    assert_false(r.tool_native);
    srv_request_free(&r);
    static const char spaced[] =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"a b\"}}],\"tool_choice\":\"required\"}";
    memset(&e, 0, sizeof e);
    assert_int_not_equal(
        srv_request_parse(spaced, strlen(spaced), true, &harmony, &k_defaults, &r, &e), 0);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "tools");
}

/* Granite with a forced call: the grammar allows only Granite's own call syntax, <|tool_call|>
 * then a JSON list of the tools' calls (one or more for "required", exactly one for a named
 * function or with parallel_tool_calls false), and the output reads back through the unforced
 * Granite reader. */
static void test_granite_required(void **state)
{
    (void)state;
    static const srv_chat_fmt granite = {.tmpl = SRV_CHAT_GRANITE};
    static const char tools[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}"
        ",{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    static const char one[] = "<|tool_call|>[{\"name\": \"add\", \"arguments\": {\"a\": 1}}]",
                      two[] = "<|tool_call|>[{\"name\": \"add\", \"arguments\": {\"a\": 1}}, "
                              "{\"name\": \"now\", \"arguments\": {}}]";
    static const struct {
        const char *choice; /* tool_choice, and parallel_tool_calls where given */
        const char *text;
        bool ok;
    } cases[] = {
        {"\"required\"", one, true},
        {"\"required\"", two, true},
        {"\"required\"", "<|tool_call|>[\n  {\"name\": \"now\", \"arguments\": {}}\n]", true},
        {"\"required\"", "<|tool_call|>[]", false},
        {"\"required\"", "<|tool_call|> [{\"name\": \"now\", \"arguments\": {}}]", false},
        {"\"required\"", " <|tool_call|>[{\"name\": \"now\", \"arguments\": {}}]", false},
        {"\"required\"", "<|tool_call|>{\"name\": \"now\", \"arguments\": {}}", false},
        {"\"required\"", "{\"name\": \"now\", \"arguments\": {}}", false}, /* the generic form */
        {"\"required\"", "[{\"name\": \"now\", \"arguments\": {}}]", false},
        {"\"required\"", "<|tool_call|>[{\"name\": \"sub\", \"arguments\": {}}]", false},
        {"\"required\",\"parallel_tool_calls\":false", one, true},
        {"\"required\",\"parallel_tool_calls\":false", two, false},
        {"{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", one, true},
        {"{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", two, false},
        {"{\"type\":\"function\",\"function\":{\"name\":\"now\"}}", one, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":%s}",
                 tools, cases[i].choice);
        srv_request r;
        srv_error e;
        memset(&e, 0, sizeof e);
        assert_int_equal(srv_request_parse(body, strlen(body), true, &granite, &k_defaults, &r, &e),
                         0);
        assert_true(r.tool_native);
        /* the prompt ends where the assistant's turn begins, as unforced */
        const char *gen = "<|start_of_role|>assistant<|end_of_role|>";
        size_t pl = strlen(r.prompt_text);
        assert_string_equal(r.prompt_text + pl - strlen(gen), gen);
        grammar *g;
        assert_int_equal(grammar_create(r.grammar, &g), 0);
        bool ok =
            grammar_accept_bytes(g, cases[i].text, strlen(cases[i].text)) && grammar_is_complete(g);
        if (ok != cases[i].ok)
            fail_msg("%s: %s: %s", cases[i].choice, cases[i].text, ok ? "accepted" : "refused");
        grammar_destroy(g);
        if (ok) { /* read back as Granite's unforced call */
            cJSON *calls = NULL;
            char *rest = NULL;
            int n = srv_tools_parse(SRV_CHAT_GRANITE, cases[i].text, strlen(cases[i].text), false,
                                    r.tools, "x", &calls, &rest);
            assert_int_equal(n, cases[i].text == two ? 2 : 1);
            assert_string_equal(rest, "");
            const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
            assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring,
                                cases[i].text == one || cases[i].text == two ? "add" : "now");
            cJSON_Delete(calls);
            free(rest);
        }
        srv_request_free(&r);
    }
}

/* Granite 4.0: the tools in its system turn (after the request's system text), earlier calls
 * written back after the content, results in a row as one user turn of <tool_response> blocks;
 * its calls read back whole and streamed as Hermes's; a forced call is "<tool_call>\n" then one
 * call object, unclosed (the grammar cannot ask for "</tool_call>" after it), read back by the
 * unforced reader. */
static void test_granite40_tools(void **state)
{
    (void)state;
    static const srv_chat_fmt g4 = {.tmpl = SRV_CHAT_GRANITE40};
    static const char tools[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}"
        ",{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
             "{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":"
             "\"Ok.\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{"
             "\"name\":\"add\",\"arguments\":\"{\\\"a\\\":1}\"}},{\"id\":\"c2\",\"type\":"
             "\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"2\"},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"noon\"}],%s}",
             tools);
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    assert_int_equal(srv_request_parse(body, strlen(body), true, &g4, &k_defaults, &r, &e), 0);
    assert_string_equal(
        r.prompt_text,
        "<|start_of_role|>system<|end_of_role|>Be brief.\n\nYou are a helpful assistant with "
        "access to the following tools. You may call one or more tools to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": "
        "[\"a\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\"}}\n</tools>\n\n"
        "For each tool call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call>. If a tool does not exist in the "
        "provided list of tools, notify the user that you do not have the ability to fulfill the "
        "request.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>x<|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>Ok.\n<tool_call>\n{\"name\": \"add\", "
        "\"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": "
        "{}}\n</tool_call><|end_of_text|>\n<|start_of_role|>user<|end_of_role|>\n<tool_response>\n"
        "2\n</tool_response>\n<tool_response>\nnoon\n</tool_response><|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>");
    assert_false(r.tool_native);
    srv_request_free(&r);

    /* read back: one block or more, the text around them content; streamed up to a tag */
    cJSON *tl = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"add\"}},"
                            "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]");
    const char *two = "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n"
                      "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
                      "</tool_call>";
    cJSON *calls = NULL;
    char *rest = NULL;
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_GRANITE40, two, strlen(two), false, tl, "g", &calls, &rest), 2);
    assert_string_equal(rest, "Sure.\n\n");
    cJSON_Delete(calls);
    free(rest);
    stream_safe_holds(SRV_CHAT_GRANITE40, tl, two, strlen("Sure.\n"));
    stream_safe_holds(SRV_CHAT_GRANITE40, tl, "No call <tool_ca", strlen("No call "));
    cJSON_Delete(tl);

    static const char one[] = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
                      now[] = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}";
    static const struct {
        const char *choice; /* tool_choice, and parallel_tool_calls where given */
        const char *text;
        bool ok;
    } cases[] = {
        {"\"required\"", one, true},
        {"\"required\"", now, true},
        {"\"required\"", "<tool_call>\n{\n  \"name\": \"now\",\n  \"arguments\": {}\n}", true},
        {"\"required\"", "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
         false},
        {"\"required\"", "<tool_call>{\"name\": \"now\", \"arguments\": {}}", false},
        {"\"required\"", "<tool_call>\n[{\"name\": \"now\", \"arguments\": {}}]", false},
        {"\"required\"", "{\"name\": \"now\", \"arguments\": {}}", false}, /* the generic form */
        {"\"required\"", "<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}", false},
        {"\"required\",\"parallel_tool_calls\":false", one, true},
        {"{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", one, true},
        {"{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", now, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":%s}",
                 tools, cases[i].choice);
        memset(&e, 0, sizeof e);
        assert_int_equal(srv_request_parse(body, strlen(body), true, &g4, &k_defaults, &r, &e), 0);
        assert_true(r.tool_native);
        const char *gen = "<|start_of_role|>assistant<|end_of_role|>";
        size_t pl = strlen(r.prompt_text);
        assert_string_equal(r.prompt_text + pl - strlen(gen), gen);
        grammar *g;
        assert_int_equal(grammar_create(r.grammar, &g), 0);
        bool ok =
            grammar_accept_bytes(g, cases[i].text, strlen(cases[i].text)) && grammar_is_complete(g);
        if (ok != cases[i].ok)
            fail_msg("%s: %s: %s", cases[i].choice, cases[i].text, ok ? "accepted" : "refused");
        grammar_destroy(g);
        if (ok) { /* read back as an unforced call, the block left open */
            int n = srv_tools_parse(SRV_CHAT_GRANITE40, cases[i].text, strlen(cases[i].text), false,
                                    r.tools, "x", &calls, &rest);
            assert_int_equal(n, 1);
            assert_string_equal(rest, "");
            const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
            assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring,
                                cases[i].text == one ? "add" : "now");
            cJSON_Delete(calls);
            free(rest);
        }
        srv_request_free(&r);
    }
}

static void test_reasoning_split(void **state)
{
    (void)state;
    think_split("<think>\nLet me see.\n2+2=4\n</think>\n\nIt is 4.", "Let me see.\n2+2=4",
                "It is 4.");
    think_split("<think>\n\n</think>\n\nHi", "", "Hi"); /* the empty block */
    think_split("No thinking here.\n", "", "No thinking here.\n");
    think_split("<thin", "", "<thin");                          /* a tag that never opened */
    think_split("<think>cut by max_tok", "cut by max_tok", ""); /* never closed */
    think_split("<think>a </thin b\n</think>x", "a </thin b", "x");
    think_split("<think>a</think>b</think>c", "a", "b</think>c"); /* one block only */
    think_split(" <think>x</think>", "", " <think>x</think>");    /* not at the start */
    think_split("", "", "");

    /* A whole choice: the block moves to reasoning_content; the message keeps the answer. */
    srv_choice ch = {0};
    const char *raw = "<think>\nplan\n</think>\n\nDone.";
    ch.text = strdup(raw);
    ch.len = strlen(raw);
    ch.cap = ch.len + 1;
    ch.finish = SCHED_FINISH_STOP;
    assert_int_equal(srv_choice_split_reasoning(&ch, SRV_CHAT_QWEN3), 0);
    assert_string_equal(ch.reasoning, "plan");
    assert_string_equal(ch.text, "Done.");
    srv_resp_ctx x = {.chat = true, .id = "chatcmpl-1", .model = "m", .n_top_logprobs = -1};
    char *body = srv_resp_full(&x, &ch, 1, 3, 0);
    cJSON *j = cJSON_Parse(body);
    cJSON *m =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message");
    assert_string_equal(cJSON_GetObjectItem(m, "reasoning_content")->valuestring, "plan");
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "Done.");
    cJSON_Delete(j);
    free(body);
    srv_choice_free(&ch);
    /* Text without a block is left alone, with no reasoning. */
    ch.text = strdup("plain");
    ch.len = ch.cap = 5;
    assert_int_equal(srv_choice_split_reasoning(&ch, SRV_CHAT_QWEN3), 0);
    assert_null(ch.reasoning);
    assert_string_equal(ch.text, "plain");
    srv_choice_free(&ch);
    char *chunk = srv_resp_reasoning_chunk(&x, 0, "hmm", 3, NULL, 0);
    assert_non_null(strstr(chunk, "\"delta\":{\"reasoning_content\":\"hmm\"}"));
    free(chunk);
}

/* The daemon's end of the relay's pair, kept by the test as libmicrohttpd would keep it. */
static int keep_daemon_end(void *ud, int fd, const struct sockaddr *addr, socklen_t addr_len)
{
    (void)addr;
    (void)addr_len;
    *(int *)ud = fd;
    return 0;
}

/* The relay sends what the daemon wrote at once, so a client's socket has Nagle off: with it
 * on, a stream's first event waited for the client's delayed ACK of the response head. */
static void test_relay_no_nagle(void **state)
{
    (void)state;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 1), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    int cfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(cfd, (struct sockaddr *)&a, sizeof a), 0);
    int sfd = accept(lfd, NULL, NULL);
    assert_true(sfd >= 0);
    assert_int_equal(fcntl(sfd, F_SETFL, O_NONBLOCK), 0);
    int v = 1;
    socklen_t vl = sizeof v;
    assert_int_equal(getsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &v, &vl), 0);
    assert_int_equal(v, 0); /* as accepted: Nagle on */

    int dfd = -1;
    srv_relay_params p = {
        .head_limit = 4096, .max_fields = 64, .handoff = keep_daemon_end, .ud = &dfd};
    srv_relay *r;
    assert_int_equal(srv_relay_start(&p, &r), 0);
    assert_int_equal(srv_relay_add(r, sfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_true(dfd >= 0);
    assert_int_equal(getsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &v, &vl), 0);
    assert_int_not_equal(v, 0);

    /* and it is the relayed connection: what the daemon writes reaches the client */
    static const char head[] = "HTTP/1.1 200 OK\r\n";
    assert_int_equal(write(dfd, head, sizeof head - 1), sizeof head - 1);
    struct pollfd pf = {.fd = cfd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 10000), 1);
    char got[sizeof head] = {0};
    assert_int_equal(read(cfd, got, sizeof got), sizeof head - 1);
    assert_string_equal(got, head);

    close(dfd); /* the daemon goes first, as at a real stop */
    srv_relay_destroy(r);
    close(cfd);
    close(lfd);
}

/* /v1/embeddings: the input forms, the refusals, and the body (floats that parse back to the
 * same float32, base64 of little-endian float32). */
static void test_embeddings(void **state)
{
    (void)state;
    srv_embed_request r;
    srv_error e;
    const char *ok = "{\"input\":[\"a\",[1,2,3]],\"model\":\"m\",\"encoding_format\":\"base64\","
                     "\"dimensions\":8,\"user\":\"u\"}";
    assert_int_equal(srv_embed_parse(ok, strlen(ok), &r, &e), 0);
    assert_int_equal(r.n_inputs, 2);
    assert_string_equal(r.inputs[0].text, "a");
    assert_int_equal(r.inputs[1].n_ids, 3);
    assert_int_equal(r.inputs[1].ids[2], 3);
    assert_true(r.base64);
    assert_int_equal(r.dimensions, 8);
    assert_string_equal(r.model, "m");
    srv_embed_request_free(&r);
    const char *one = "{\"input\":[5,6]}";
    assert_int_equal(srv_embed_parse(one, strlen(one), &r, &e), 0);
    assert_int_equal(r.n_inputs, 1);
    assert_int_equal(r.inputs[0].n_ids, 2);
    assert_false(r.base64);
    assert_int_equal(r.dimensions, -1);
    srv_embed_request_free(&r);
    static const char *const bad[] = {"{}",
                                      "{\"input\":\"\"}",
                                      "{\"input\":[]}",
                                      "{\"input\":[[]]}",
                                      "{\"input\":[1,-1]}",
                                      "{\"input\":[1,1e20]}",
                                      "{\"input\":[1.5]}",
                                      "{\"input\":[\"a\",{}]}",
                                      "{\"input\":7}",
                                      "{\"input\":\"a\",\"encoding_format\":\"hex\"}",
                                      "{\"input\":\"a\",\"dimensions\":0}",
                                      "{\"input\":\"a\",\"dimensions\":1e300}",
                                      "{\"input\":\"a\",\"user\":1}",
                                      "{\"input\":\"a\",\"model\":1}",
                                      "[1]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&e, 0, sizeof e);
        if (srv_embed_parse(bad[i], strlen(bad[i]), &r, &e) == 0)
            fail_msg("accepted %s", bad[i]);
        assert_int_equal(e.status, 400);
        assert_null(r.inputs);
    }
    float v[4] = {1.0f, -2.0f, 0.1f, 3.0e-8f};
    char *body = srv_embed_response("m\"x", v, 2, 2, true, 7);
    assert_non_null(body);
    cJSON *j = cJSON_Parse(body);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "m\"x");
    cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    assert_string_equal(cJSON_GetObjectItem(d0, "embedding")->valuestring, "AACAPwAAAMA=");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valueint,
                     7);
    cJSON_Delete(j);
    free(body);
    body = srv_embed_response("m", v, 2, 2, false, 7);
    j = cJSON_Parse(body);
    assert_non_null(j);
    cJSON *d1 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 1);
    assert_int_equal(cJSON_GetObjectItem(d1, "index")->valueint, 1);
    cJSON *emb = cJSON_GetObjectItem(d1, "embedding");
    assert_int_equal(cJSON_GetArraySize(emb), 2);
    assert_true((float)cJSON_GetArrayItem(emb, 0)->valuedouble == v[2]);
    assert_true((float)cJSON_GetArrayItem(emb, 1)->valuedouble == v[3]);
    cJSON_Delete(j);
    free(body);
}

/* Mistral's current calls: [TOOL_CALLS]name[ARGS]{...} one after another, the text before the
 * first content; v3's list still read; anything that is not all calls of the tools is text. */
static void test_mistral3_calls(void **state)
{
    (void)state;
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"add\"}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"w.x-1\"}}]");
    cJSON *calls = NULL;
    char *rest = NULL;
    const char *two = "Sure. [TOOL_CALLS]add[ARGS]{\"a\": [1, {\"b\": \"[ARGS]\"}]} \n"
                      "[TOOL_CALLS]w.x-1[ARGS] {}\n";
    for (int t = SRV_CHAT_MISTRAL3; t <= SRV_CHAT_MISTRAL3_THINK; t++) {
        assert_int_equal(srv_tools_parse((enum srv_chat_tmpl)t, two, strlen(two), false, tools, "m",
                                         &calls, &rest),
                         2);
        assert_string_equal(rest, "Sure. ");
        const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
        assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "add");
        assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring,
                            "{\"a\":[1,{\"b\":\"[ARGS]\"}]}");
        fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "function");
        assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "w.x-1");
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "id")->valuestring,
                            "call_m_1");
        cJSON_Delete(calls);
        free(rest);
    }
    const char *v3 = "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 2}}]";
    assert_int_equal(
        srv_tools_parse(SRV_CHAT_MISTRAL3, v3, strlen(v3), false, tools, "v", &calls, &rest), 1);
    assert_string_equal(rest, "");
    cJSON_Delete(calls);
    free(rest);
    static const char *const not_calls[] = {
        "[TOOL_CALLS]nope[ARGS]{}",                                /* not a tool */
        "[TOOL_CALLS]add[ARGS]{\"a\": 1}[TOOL_CALLS]nope[ARGS]{}", /* one of them not */
        "[TOOL_CALLS]add[ARGS][1]",                                /* not an object */
        "[TOOL_CALLS]add[ARGS]{\"a\": ",                           /* cut */
        "[TOOL_CALLS]add{\"a\": 1}",                               /* no [ARGS] */
        "[TOOL_CALLS]add[ARGS]{} trailing text",                   /* text after a call */
        "[TOOL_CALLS][ARGS]{}",                                    /* no name */
        "[TOOL_CALLS]",
    };
    for (size_t i = 0; i < sizeof not_calls / sizeof not_calls[0]; i++) {
        assert_int_equal(srv_tools_parse(SRV_CHAT_MISTRAL3, not_calls[i], strlen(not_calls[i]),
                                         false, tools, "n", &calls, &rest),
                         0);
        assert_null(calls);
    }
    /* an earlier call written back: [TOOL_CALLS]name[ARGS] and the arguments' object as tojson
     * prints it (as llama-server hands it to the template) */
    cJSON *tc = cJSON_Parse("[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                            "\"add\",\"arguments\":\"{\\\"a\\\":2,  \\\"b\\\":2.50}\"}},{\"id\":"
                            "\"c2\",\"type\":\"function\",\"function\":{\"name\":\"w.x-1\","
                            "\"arguments\":\"{}\"}}]");
    assert_non_null(tc);
    char *out = NULL;
    assert_int_equal(srv_tools_render_calls(SRV_CHAT_MISTRAL3, "Ok.", tc, &out), 0);
    assert_string_equal(out, "Ok.[TOOL_CALLS]add[ARGS]{\"a\": 2, \"b\": 2.5}[TOOL_CALLS]w.x-1"
                             "[ARGS]{}");
    free(out);
    const char *role = NULL;
    assert_int_equal(srv_tools_render_result(SRV_CHAT_MISTRAL3, "c1", " 5\n", &role, &out), 0);
    assert_string_equal(role, "tool");
    assert_string_equal(out, "[TOOL_RESULTS] 5\n[/TOOL_RESULTS]");
    free(out);
    assert_true(srv_tools_in_user_turn(SRV_CHAT_MISTRAL3_THINK));
    cJSON_Delete(tc);
    cJSON_Delete(tools);
}

/* Granite 3.2's phrases in the tags' place (as vLLM's granite reasoning parser reads them);
 * Granite 3.3's <think> as Qwen 3's, its <response> tags left in the content (as llama-server
 * leaves them). */
/* Ministral 3 Reasoning's and Magistral's [THINK] block in the tags' place (as llama-server
 * splits them); the Instruct family does not split. */
static void test_mistral3_split(void **state)
{
    (void)state;
    split_as(SRV_CHAT_MISTRAL3_THINK, "[THINK]\nPlan.\n[/THINK]\nAnswer.", "Plan.", "Answer.");
    split_as(SRV_CHAT_MISTRAL3_THINK, "[THINK]cut", "cut", "");
    split_as(SRV_CHAT_MISTRAL3_THINK, "[THI", "", "[THI");
    split_as(SRV_CHAT_MISTRAL3_THINK, "Hi [THINK]x[/THINK]", "", "Hi [THINK]x[/THINK]");
    split_as(SRV_CHAT_MISTRAL3_THINK, "<think>a</think>b", "", "<think>a</think>b");
    split_as(SRV_CHAT_MISTRAL3_THINK, "[THINK]a[/THINK][TOOL_CALLS]add[ARGS]{}", "a",
             "[TOOL_CALLS]add[ARGS]{}");
}

/* Mistral's current format with a forced call: the grammar allows only its own call syntax,
 * [TOOL_CALLS]NAME[ARGS]ARGS, one call (the named function's for a named choice), read back by
 * the unforced reader; the prompt is the unforced one. */
static void test_mistral3_required(void **state)
{
    (void)state;
    static const srv_chat_fmt m3 = {.tmpl = SRV_CHAT_MISTRAL3_THINK};
    static const char tools[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}"
        ",{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    static const char one[] = "[TOOL_CALLS]add[ARGS]{\"a\": 1}";
    static const struct {
        const char *choice;
        const char *text;
        bool ok;
    } cases[] = {
        {"\"required\"", one, true},
        {"\"required\"", "[TOOL_CALLS]now[ARGS]{}", true},
        {"\"required\"", "[TOOL_CALLS]add[ARGS]{\"a\": 1}[TOOL_CALLS]now[ARGS]{}", false},
        {"\"required\"", "[TOOL_CALLS]add[ARGS]{\"a\": \"x\"}", false},
        {"\"required\"", "[TOOL_CALLS]sub[ARGS]{}", false},
        {"\"required\"", " [TOOL_CALLS]now[ARGS]{}", false},
        {"\"required\"", "[THINK]x[/THINK][TOOL_CALLS]now[ARGS]{}", false},
        {"\"required\"", "{\"name\": \"now\", \"arguments\": {}}", false}, /* generic */
        {"\"required\"", "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}]", false},
        {"{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", one, true},
        {"{\"type\":\"function\",\"function\":{\"name\":\"now\"}}", one, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":%s}",
                 tools, cases[i].choice);
        srv_request r;
        srv_error e;
        memset(&e, 0, sizeof e);
        assert_int_equal(srv_request_parse(body, strlen(body), true, &m3, &k_defaults, &r, &e), 0);
        assert_true(r.tool_native);
        size_t pl = strlen(r.prompt_text);
        assert_string_equal(r.prompt_text + pl - strlen("[INST]x[/INST]"), "[INST]x[/INST]");
        grammar *g;
        assert_int_equal(grammar_create(r.grammar, &g), 0);
        bool ok =
            grammar_accept_bytes(g, cases[i].text, strlen(cases[i].text)) && grammar_is_complete(g);
        if (ok != cases[i].ok)
            fail_msg("%s: %s: %s", cases[i].choice, cases[i].text, ok ? "accepted" : "refused");
        grammar_destroy(g);
        if (ok) {
            cJSON *calls = NULL;
            char *rest = NULL;
            assert_int_equal(srv_tools_parse(SRV_CHAT_MISTRAL3_THINK, cases[i].text,
                                             strlen(cases[i].text), false, r.tools, "x", &calls,
                                             &rest),
                             1);
            assert_string_equal(rest, "");
            cJSON_Delete(calls);
            free(rest);
        }
        srv_request_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_ok),     cmocka_unit_test(test_chat_ok),
        cmocka_unit_test(test_reasoning_split),   cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_error_json),        cmocka_unit_test(test_config),
        cmocka_unit_test(test_default_json),      cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_kv_view),           cmocka_unit_test(test_http_head),
        cmocka_unit_test(test_chunk_lines),       cmocka_unit_test(test_new_fields),
        cmocka_unit_test(test_cors_config),       cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_json_py),           cmocka_unit_test(test_tool_calls_stream_safe),
        cmocka_unit_test(test_relay_no_nagle),    cmocka_unit_test(test_embeddings),
        cmocka_unit_test(test_harmony_split),     cmocka_unit_test(test_granite_split),
        cmocka_unit_test(test_harmony_required),  cmocka_unit_test(test_granite_required),
        cmocka_unit_test(test_mistral3_split),    cmocka_unit_test(test_mistral3_calls),
        cmocka_unit_test(test_mistral3_required), cmocka_unit_test(test_granite40_tools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
