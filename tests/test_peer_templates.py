"""meson test 'peer_templates': the chat templates of the families kvserve detects, checked
against a real Jinja renderer. Each file in tests/data/chat_templates is a model family's
official tokenizer.chat_template (Qwen 3, Gemma 2 and 3, Phi-3.5, Llama 3.1/3.3 and 3.2,
gpt-oss, SmolLM3, Granite 3.0, 3.1, 3.2, 3.3 and 4.0, ERNIE 4.5, LFM2, LFM2.5, LFM2.5-8B-A1B,
OLMo 2, Ministral 3 Instruct and Reasoning, and Zephyr-7B-beta's, which TinyLlama's chat models
carry: its eos_token is the vocabulary's EOS text, </s> here);
a tiny kvs-mkmodel file carries it, and for each conversation below kvserve's POST
/apply-template (its own renderer, chosen by srv_chat_detect) must give exactly the text that
llama.cpp's llama-server (--jinja, the template itself) gives on its /apply-template, but for
the BOS text some templates write first (kvserve's tokenizer adds BOS as a token instead).
A case the template itself refuses is reported and not compared (for gpt-oss, kvserve must
refuse it too: REFUSES_TOO): Gemma 2's template raises on a
system message (llama-server then joins it to the first user turn with one newline, kvserve
with Gemma 3's blank line). Llama 3.1's template dates its system turn "26 Jul 2024" unless
the caller defines date_string, as Hugging Face's renderer (and so vLLM) leaves it; llama-server
defines it as today, so it is given --chat-template-kwargs with the template's own date.
gpt-oss's template (harmony) dates its system message with today's date, as both servers do;
its reasoning_effort switch is compared, and the conversations its template raises on but
llama-server renders are listed in TEMPLATE_RAISES. SmolLM3's dates its system turn with today's
date too; its /think, /no_think and /system_override in the system message are compared.
Granite 3.1's template dates its default system message with today's date too; it writes an
assistant turn's content alone (earlier calls are not in its prompt), so kvserve leaves them out
as well. Granite 3.2's and 3.3's read chat_template_kwargs.thinking (llama-server hands the
kwargs to the template as they are), compared on and off, with tools and a system message
(which both take over from it).
Granite 4.0's is compared with an empty system message (its default text then), tools, calls
written back after content and without, and tool results in a row.
LFM2's and LFM2.5's are compared with tools (two, one without parameters), an empty system
message, earlier answers' think blocks, and calls whose arguments LFM2.5-8B-A1B's template writes
back in Python form (strings, numbers, True/False/None, lists and dicts), and the switches that
keep earlier answers' think blocks (keep_past_thinking, 8B's preserve_thinking); llama-server (d32676d)
hands them no "thinking" field (8B's template reads one), so reasoning_content is not rendered by
either.
Ministral 3's are compared with calls after content (llama-server hands the template the object an
arguments string holds, so the call is written as its tojson: kvserve writes it so), results in a
row, an earlier answer's [THINK] block and reasoning_content (a thinking chunk for the Reasoning
template; the Instruct one raises on it, and kvserve refuses it), and the turns the templates
raise on (REFUSES_TOO).
Exits 77 (meson's skip) with the reason when llama-server (KVS_PEER/llama.cpp/bin) is absent.
Environment: KVSERVE_BIN, KVS_MKMODEL, KVS_PEER; by hand: test_peer_templates.py [NAME ...]."""
import json
import os
import re
import subprocess
import sys
import tempfile

import peer_util

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "data", "chat_templates")
# name -> the family srv_chat_detect must pick (kvserve logs it at start)
FAMILIES = {"qwen2.5": "chatml", "qwen3": "qwen3", "gemma2": "gemma", "gemma3": "gemma",
            "gemma3n": "gemma", "phi3": "phi3",
            "llama3.1": "llama3.1", "llama3.2": "llama3.2", "gpt-oss": "harmony",
            "smollm3": "smollm3", "granite3.1": "granite", "granite3.0": "granite3.0",
            "granite3.2": "granite3.2", "granite3.3": "granite3.3",
            "granite3.3-spaced": "granite3.3", "granite4.0": "granite4.0", "ernie4.5": "ernie4.5",
            "zephyr": "zephyr", "olmo2": "olmo2",
            "lfm2": "lfm2", "lfm2.5": "lfm2.5", "lfm2.5-8b": "lfm2.5-8b",
            "ministral3": "mistral3", "ministral3-reasoning": "mistral3-think"}
# variants made here from a file: name -> (file, [(old, new)])
VARIANTS = {
    # the copy of Granite 3.3's template in llama.cpp's models/templates joins the default
    # system message's date line with spaces
    "granite3.3-spaced": ("granite3.3", [("April 2024.\\nToday's Date: \" + strftime_now"
                                          "('%B %d, %Y') + \".\\nYou are Granite",
                                          "April 2024. Today's Date: \" + strftime_now"
                                          "('%B %d, %Y') + \". You are Granite")]),
}
# the chat_template_kwargs each family's template reads (any other is refused by kvserve)
SWITCHES = {"qwen3": {"enable_thinking"}, "harmony": {"reasoning_effort", "model_identity"},
            "smollm3": {"enable_thinking"}, "granite3.2": {"thinking"}, "granite3.3": {"thinking"},
            "lfm2.5": {"keep_past_thinking"}, "lfm2.5-8b": {"preserve_thinking"}}

S, U, A = "system", "user", "assistant"
CASES = [
    ("one user turn", [(U, "Hi")], None),
    ("system and user", [(S, "Be brief."), (U, "Hi")], None),
    ("two exchanges", [(S, "Be brief."), (U, "Hi"), (A, "Hello!"), (U, "Bye")], None),
    ("spaces around contents",
     [(S, "  Be brief. \n"), (U, " Hi \n"), (A, "\nHello! "), (U, "Bye")], None),
    ("reasoning in an earlier turn",
     [(U, "Hi"), (A, "<think>\nhmm\n</think>\n\nHello!"), (U, "Bye")], None),
    # A tool result (a user turn wrapped in <tool_response>) is not a query: Qwen 3 keeps the
    # reasoning of the turn before it. (A conversation that ends with an assistant turn is not
    # compared: llama-server continues that turn, a prefill, where kvserve, like vLLM without
    # continue_final_message, closes it and opens a new one.)
    ("reasoning before a tool result",
     [(U, "Hi"), (A, "\n<think>plan</think>Done."), (U, "<tool_response>\n42\n</tool_response>")],
     None),
    # An assistant turn sent back with its reasoning_content beside the content (as vLLM and
    # llama.cpp return it): the template reads it from there.
    ("reasoning_content sent back",
     [(U, "Hi"), {"role": A, "content": "Done.", "reasoning_content": "plan"},
      (U, "<tool_response>\n42\n</tool_response>")], None),
    ("thinking off", [(U, "Hi")], {"enable_thinking": False}),
    ("thinking on", [(U, "Hi")], {"enable_thinking": True}),
    ("reasoning effort high", [(S, "Be brief."), (U, "Hi")], {"reasoning_effort": "high"}),
    ("reasoning effort low", [(U, "Hi")], {"reasoning_effort": "low"}),
    ("model identity", [(U, "Hi")], {"model_identity": "You are a test.", "reasoning_effort": "low"}),
    # gpt-oss: a system message after the first is not rendered; a developer message is one
    ("a later system message", [(U, "Hi"), (A, "Hello!"), (S, "Be brief."), (U, "Bye")], None),
    ("developer role", [{"role": "developer", "content": "Be brief."}, (U, "Hi")], None),
    ("reasoning_content without calls",
     [(U, "Hi"), {"role": A, "content": "Hello!", "reasoning_content": "greet"}, (U, "Bye")],
     None),
]
BOS_TEXTS = ("<s>", "<bos>", "<|begin_of_text|>")
# Tool cases, for the templates that write tools themselves (the others have no tools syntax
# of their own: kvserve writes its generic form where their templates would drop the tools).
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Adds two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                   "b": {"type": "number"}},
                   "required": ["a", "b"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}
TOOL_CASES = [
    ("tools", [(U, "Add 2 and 3")]),
    ("tools and a system message", [(S, "Be brief."), (U, "Add 2 and 3")]),
    ("a call and its result",
     [(U, "Add 2 and 3"), {"role": A, "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"}]),
    ("two results in a row",
     [(U, "Add"), {"role": A, "content": "Both.", "tool_calls": [CALL, dict(CALL, id="call_2")]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"},
      {"role": "tool", "tool_call_id": "call_2", "content": "5"}]),
]
# gpt-oss writes the analysis before a call unless a later turn answers; its result names the
# call's function; the tools are a TypeScript namespace (enums, arrays, defaults, nesting)
TOOLS_RICH = TOOLS + [{"type": "function", "function": {
    "name": "search", "description": "Searches the web.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to look for."},
        "lang": {"type": "string", "enum": ["en", "fr"], "default": "en"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "limit": {"type": "integer", "default": 10},
        "strict": {"type": "boolean", "nullable": True},
        "filter": {"type": "object", "properties": {"site": {"type": "string"},
                                                     "year": {"type": "integer"}},
                   "required": ["site"]},
        "ids": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "number"}}}},
        "any": {},
        "mode": {"oneOf": [{"type": "string", "description": "a name"},
                           {"type": "number", "default": 1}], "default": "x"},
        "kinds": {"type": ["string", "null"]},
        "deep": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}},
        "required": ["query"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}}]
TOOLS_LFM2 = TOOLS + [{"type": "function", "function": {"name": "now", "description": "The time.",
                                                    "parameters": {"type": "object", "properties": {}}}}]
HARMONY_TOOL_CASES = [
    ("a call with reasoning_content",
     [(U, "Add 2 and 3"), {"role": A, "content": None, "reasoning_content": "use add",
                           "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5 \"exact\"\n"}]),
    ("non-ASCII in a call and its result",
     [(U, "Add"), {"role": A, "content": None, "tool_calls": [
         dict(CALL, function={"name": "add", "arguments": "{\"a\": \"caf\u00e9 \u2615\", \"b\": [1, 2.5]}"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "caf\u00e9 \u2615 \t\\"}]),
    ("a call answered later",
     [(U, "Add 2 and 3"), {"role": A, "content": "use add", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"}, (A, "It is 5."), (U, "Thanks")]),
    ("content and reasoning_content with a call",
     [(U, "Add"), {"role": A, "content": "x", "reasoning_content": "y", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"}]),
    ("channel tags in content",
     [(U, "Hi"), (A, "<|channel|>analysis<|message|>hmm"), (U, "Bye")]),
    ("a tool result without a call", [(U, "Add"), {"role": "tool", "tool_call_id": "c",
                                                   "content": "5"}]),
]
# SmolLM3: the system message's switches and override, which beat enable_thinking; a system
# message that is only a switch (the default instructions then); a later system message
SMOLLM3_CASES = [
    ("/no_think in the system message", [(S, "Be brief. /no_think"), (U, "Hi"), (A, "\n\nHello!"),
                                         (U, "Bye")], None),
    ("/think beats enable_thinking", [(S, "/think  Be brief.\n "), (U, "Hi")],
     {"enable_thinking": False}),
    ("/no_think alone", [(S, "/no_think"), (U, "Hi")], None),
    ("/system_override", [(S, "You are Bob. /system_override /no_think\n"), (U, "Hi")], None),
    ("a later /no_think system message", [(U, "Hi"), (A, "Hello!"), (S, "/no_think"), (U, "Bye")],
     None),
    ("thinking off, two exchanges", [(U, "Hi"), (A, "Hello!"), (U, "Bye")],
     {"enable_thinking": False}),
]
WITH_TOOLS = ("qwen2.5", "qwen3", "llama3.1", "llama3.2", "gpt-oss", "granite3.1", "granite3.0",
              "granite3.2", "granite3.3", "granite4.0", "lfm2", "lfm2.5", "lfm2.5-8b", "ministral3",
              "ministral3-reasoning")
# LFM2 and LFM2.5: an empty system message (no system turn), a later one (a turn of its own),
# earlier answers' think blocks (LFM2.5 keeps the last answer's, 8B the answers' after the last
# user turn), tools with an empty system message, calls' arguments in Python form (8B writes
# them back: strings quoted as they are, True/None, lists and dicts), a call after content
# with a think block, tool results in a row, two tools
LFM2_THINK = [(U, "Hi"), (A, "<think>\nhmm\n</think>\n\n Hello! "), (U, "Bye"),
              (A, "<think>a</think>b</think>  c "), (U, "x"), (A, " <think>y</think> z "),
              {"role": "tool", "tool_call_id": "c", "content": "5"}]
LFM2_CASES = [
    ("an empty system message", [(S, ""), (U, "Hi")], None),
    ("a later system message", [(U, "Hi"), (A, "Hello!"), (S, "Be brief."), (U, "Bye")], None),
    ("think blocks in earlier answers", LFM2_THINK, None),
    # the switches that keep them: 1.2B's keep_past_thinking, 8B's preserve_thinking
    ("keep_past_thinking", LFM2_THINK, {"keep_past_thinking": True}),
    ("keep_past_thinking off", LFM2_THINK, {"keep_past_thinking": False}),
    ("preserve_thinking", LFM2_THINK, {"preserve_thinking": True}),
]
LFM2_TOOL_CASES = [
    ("tools and an empty system message", [(S, ""), (U, "Add 2 and 3")]),
    ("a call with Python values",
     [(U, "Add"), {"role": A, "content": "<think>plan</think>  Calling. ", "tool_calls": [
         dict(CALL, function={"name": "add", "arguments": json.dumps(
             {"t": True, "f": False, "n": None, "fl": 2.5, "big": 1e20, "i": -3,
              "l": [1, "a'b", "x\"y", "c\nd\\", "x\"y'z\n", True, None, {"k": "v"}, [2.5]],
              "d": {"x": [1, 2], "y": "\u00e9\n"}, "s": "it's \"q\"\n", "z": 0.1})}),
         dict(CALL, id="call_2", function={"name": "now", "arguments": "{}"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"},
      {"role": "tool", "tool_call_id": "call_2", "content": "noon"}, (U, "Thanks")]),
]
# Ministral 3: calls' arguments written as the request's strings (spacing kept; "" as {}), a
# call after content, a [THINK] block in an earlier answer, an empty system message; turns that
# do not alternate, which the templates raise on (and kvserve refuses: REFUSES_TOO)
MISTRAL3_CASES = [
    ("raw arguments",
     [(U, "Add"), {"role": A, "content": "Sure. ", "tool_calls": [
         dict(CALL, function={"name": "add", "arguments": "{\"a\":2,  \"b\" : [1, 2.50]}"}),
         dict(CALL, id="call_2", function={"name": "now", "arguments": "{}"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": " 5\n"},
      {"role": "tool", "tool_call_id": "call_2", "content": "noon"}, (A, "Done."), (U, "Thanks")]),
    ("a think block in an earlier answer",
     [(U, "Hi"), (A, "[THINK]hmm[/THINK]Hello!"), (U, "Bye")]),
    ("an empty system message", [(S, ""), (U, "Hi")]),
    ("empty arguments", [(U, "Add"), {"role": A, "content": None, "tool_calls": [
        dict(CALL, function={"name": "now", "arguments": ""})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "noon"}]),
    ("reasoning_content with a call",
     [(U, "Add"), {"role": A, "content": "Sure.", "reasoning_content": "use add",
                   "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]),
    ("an empty reasoning_content",
     [(U, "Hi"), {"role": A, "content": "Hello!", "reasoning_content": ""}, (U, "Bye")]),
    ("two user turns in a row", [(U, "Hi"), (U, "Bye")]),
    ("an empty assistant turn", [(U, "Hi"), (A, ""), (U, "Bye")]),
    ("a tool result first", [{"role": "tool", "tool_call_id": "c", "content": "5"}, (U, "Hi")]),
]
# Granite 3.2 and 3.3: the thinking switch, which only the default system message reads (a
# conversation's own system message, or tools, take its place)
GRANITE_THINKING_CASES = [
    ("granite thinking on", [(U, "Hi")], {"chat_template_kwargs": {"thinking": True}}),
    ("granite thinking off", [(U, "Hi"), (A, "Hello!"), (U, "Bye")],
     {"chat_template_kwargs": {"thinking": False}}),
    ("granite thinking and a system message", [(S, "Be brief."), (U, "Hi")],
     {"chat_template_kwargs": {"thinking": True}}),
    ("granite thinking and tools", [(U, "Add 2 and 3")],
     {"chat_template_kwargs": {"thinking": True}, "tools": TOOLS}),
]
# Granite 4.0: an empty system message (its default text then), with tools too; a later system
# message; calls after content and without, two in a turn, non-ASCII and nested arguments;
# results in a row and apart; content given as text parts
GRANITE4_CASES = [
    ("an empty system message", [(S, ""), (U, "Hi")], None),
    ("a later system message", [(U, "Hi"), (A, "Hello!"), (S, "Be brief."), (U, "Bye")], None),
    ("text parts", [{"role": S, "content": [{"type": "text", "text": "Be"},
                                            {"type": "text", "text": "brief."}]},
                    {"role": U, "content": [{"type": "text", "text": "Hi"},
                                            {"type": "text", "text": "there"}]}], None),
]
GRANITE4_TOOL_CASES = [
    ("tools and an empty system message", [(S, ""), (U, "Add 2 and 3")]),
    ("calls in turns apart",
     [(S, "Be brief."), (U, "Add"), {"role": A, "content": "", "tool_calls": [
         dict(CALL, function={"name": "now", "arguments": "{}"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "noon"},
      {"role": A, "content": "Adding.\n", "tool_calls": [
          dict(CALL, function={"name": "add", "arguments": json.dumps(
              {"a": "caf\u00e9 \u2615", "b": [1, 2.5, True, None], "c": {"d": "x\"y\n"}})}),
          dict(CALL, id="call_2")]},
      {"role": "tool", "tool_call_id": "call_1", "content": " 5 \n"},
      {"role": "tool", "tool_call_id": "call_2", "content": "{\"r\": 5}"},
      (A, "Both are 5."), (U, "Thanks")]),
    # arguments sent compact and unordered: written back as tojson writes the object
    ("compact arguments",
     [(U, "Add"), {"role": A, "content": None, "tool_calls": [
         dict(CALL, function={"name": "add", "arguments": "{\"b\":3,\"a\":[1,{\"x\":\"\u00e9\"}]}"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"}]),
]
# Where gpt-oss's template raises an exception but llama-server renders anyway (it hands the
# reasoning of a call to the template as "thinking" and drops the content; it does not see the
# channel tags): kvserve refuses them with a 400, as the template (and Hugging Face's renderer)
# does.
REFUSES_TOO = ("gpt-oss", "ministral3", "ministral3-reasoning")  # families whose refusals kvserve must give too (a 400)
TEMPLATE_RAISES = {("gpt-oss", "content and reasoning_content with a call"),
                   ("gpt-oss", "channel tags in content")}


def main():
    kvserve, mkmodel, bindir = peer_util.tools()
    names = sys.argv[1:] or list(FAMILIES)
    failures = compared = 0
    with tempfile.TemporaryDirectory(prefix="kvs-peer-templates-") as tmp:
        for name in names:
            base, edits = VARIANTS.get(name, (name, []))
            with open(os.path.join(TEMPLATES, base + ".jinja")) as f:
                template = f.read()
            for old, new in edits:
                assert old in template, (name, old)
                template = template.replace(old, new)
            model = os.path.join(tmp, name + ".gguf")
            subprocess.run([mkmodel, "--shape", "tiny", "-o", model, "--chat-template", template],
                           check=True, capture_output=True)
            klog, plog = os.path.join(tmp, name + ".kvs.log"), os.path.join(tmp, name + ".peer.log")
            kproc, kurl = peer_util.start_server([kvserve, "serve", "-m", model, "--host",
                                                  "127.0.0.1", "--port", "0", "--threads", "1"],
                                                 klog)
            port = peer_util.free_port()
            extra = (["--chat-template-kwargs", '{"date_string": "26 Jul 2024"}']
                     if name == "llama3.1" else [])
            pproc, purl = peer_util.start_server(
                [os.path.join(bindir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port",
                 str(port), "-t", "1", "-c", "256", "--jinja"] + extra, plog, port)
            try:
                detected = re.search(r"chat template[: =]+([\w.-]+)", open(klog).read())
                if detected and detected.group(1) != FAMILIES[name]:
                    print("%-9s detected as %s, expected %s" % (name, detected.group(1),
                                                                FAMILIES[name]))
                    failures += 1
                cases = CASES + ([(label, msgs, {"tools": TOOLS}) for label, msgs in TOOL_CASES]
                                 if name in WITH_TOOLS or name in VARIANTS else [])
                if name == "smollm3":
                    cases += SMOLLM3_CASES
                if name == "gpt-oss":
                    cases += [(label, msgs, {"tools": TOOLS}) for label, msgs in HARMONY_TOOL_CASES]
                    cases.append(("a rich tool list", [(U, "Hi")], {"tools": TOOLS_RICH}))
                    cases.append(("a tool without description", [(U, "Hi")], {"tools": [
                        {"type": "function", "function": {"name": "now"}}]}))
                if FAMILIES[name] in ("granite3.2", "granite3.3"):
                    cases += GRANITE_THINKING_CASES
                if name.startswith("lfm2"):
                    cases += LFM2_CASES
                    cases += [(label, msgs, {"tools": TOOLS_LFM2}) for label, msgs in LFM2_TOOL_CASES]
                if name == "granite4.0":
                    cases += GRANITE4_CASES
                    cases += [(label, msgs, {"tools": TOOLS_LFM2})
                              for label, msgs in GRANITE4_TOOL_CASES]
                if name.startswith("ministral3"):
                    cases += [(label, msgs, {"tools": TOOLS_LFM2}) for label, msgs in MISTRAL3_CASES]
                if name.startswith("granite"):  # the generation prompt follows the last turn
                    cases.append(("a system message alone", [(S, "Be brief.")], None))
                    cases.append(("a tool role", [(U, "Hi"), {"role": "tool", "tool_call_id": "c",
                                                              "content": "5"}], None))
                for label, msgs, kwargs in cases:
                    body = {"messages": [m if isinstance(m, dict) else {"role": m[0], "content": m[1]}
                                         for m in msgs]}
                    if kwargs and ("tools" in kwargs or "chat_template_kwargs" in kwargs):
                        body.update(kwargs)
                        kwargs = body.get("chat_template_kwargs")
                    elif kwargs:
                        body["chat_template_kwargs"] = kwargs
                    if name == "gemma2" and body["messages"][0]["role"] in (S, "developer"):
                        print("%-9s %-30s not compared: the template refuses system messages"
                              % (name, label))
                        continue
                    pst, pans = peer_util.post_json(purl + "/apply-template", body)
                    kst, kans = peer_util.post_json(kurl + "/apply-template", body)
                    if (name, label) in TEMPLATE_RAISES:
                        ok = kst == 400
                        print("%-9s %-30s %s" % (name, label, "refused: the template raises" if ok
                                                 else "NOT REFUSED: %d %s" % (kst, kans)))
                        failures += not ok
                        continue
                    if kwargs and not set(kwargs) <= SWITCHES.get(FAMILIES[name], set()):
                        # no such switch in the template: kvserve refuses what it cannot do
                        ok = kst == 400
                        print("%-9s %-30s %s" % (name, label, "refused (no switch)" if ok else
                                                 "NOT REFUSED: %d %s" % (kst, kans)))
                        failures += not ok
                        continue
                    if pst != 200 and name in REFUSES_TOO:
                        ok = kst == 400
                        print("%-9s %-30s the template refuses it (llama-server %d), kvserve %s"
                              % (name, label, pst, "too" if ok else "NOT: %d %s" % (kst, kans)))
                        failures += not ok
                        continue
                    if pst != 200:
                        print("%-9s %-30s the template refuses it (llama-server %d)"
                              % (name, label, pst))
                        continue
                    want = pans["prompt"]
                    for bos in BOS_TEXTS:
                        if want.startswith(bos):
                            want = want[len(bos):]
                            break
                    got = kans.get("prompt") if kst == 200 else "HTTP %d %s" % (kst, kans)
                    compared += 1
                    if got == want:
                        print("%-9s %-30s same" % (name, label))
                    else:
                        failures += 1
                        print("%-9s %-30s DIFFERENT\n  llama.cpp: %r\n  kvserve:   %r"
                              % (name, label, want, got))
            finally:
                peer_util.stop_server(kproc)
                peer_util.stop_server(pproc)
    print("%d renderings compared, %d differences" % (compared, failures))
    return 1 if failures or not compared else 0


if __name__ == "__main__":
    sys.exit(main())
