// kvserve through the official OpenAI Node SDK, used exactly as an application would: the
// client only gets a baseURL. Greedy text must equal llama2.c's reference to the character.
//
// Environment: KVSERVE_BIN (built kvserve) and KVS_SHARED_MODELS (folder with stories260K.gguf
// and reference/) to start a server here on a free loopback port; or KVSERVE_URL
// (e.g. http://127.0.0.1:8080) to test a server that is already running the same model.
// run.sh checks the prerequisites and exits 77 (meson's skip) when one is missing.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { startKvserve, stopKvserve } from '../kvserve_process.mjs';

const MODELS = process.env.KVS_SHARED_MODELS ?? path.resolve('../../../shared/models');
const MODEL = path.join(MODELS, 'stories260K.gguf');
const CASES = JSON.parse(
    readFileSync(path.join(MODELS, 'reference', 'stories260K-greedy.json'), 'utf8')).cases;

let server = null; // the child process when this file started kvserve
let client = null;

// Starts kvserve on port 0 and resolves with its base URL once /health answers 200.
async function startServer() {
    const bin = process.env.KVSERVE_BIN;
    assert.ok(bin, 'KVSERVE_BIN or KVSERVE_URL must be set');
    // 2048: the tools' system text takes ~600 of stories260K's tokens
    const k = await startKvserve(bin, ['-m', MODEL, '--ctx-size', '2048', '--threads', '1',
        '--chat-template', 'plain']);
    server = k.proc;
    return k.url;
}

before(async () => {
    const url = process.env.KVSERVE_URL || await startServer();
    // maxRetries 0: a failure must show up here, not be papered over by the SDK's retries.
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
    await stopKvserve(server);
});

describe('models', () => {
    test('models.list names the served model', async () => {
        const ids = [];
        for await (const m of client.models.list())
            ids.push(m.id);
        assert.equal(ids.length, 1);
        assert.equal(ids[0], 'stories260K');
    });
});

for (const c of CASES) {
    const greedy = { temperature: 0, max_tokens: c.completion_ids.length };
    const messages = [{ role: 'user', content: c.prompt }];

    describe(`reference "${c.prompt}"`, () => {
        test('completions.create', async () => {
            const r = await client.completions.create({ model: 'stories260K', prompt: c.prompt,
                ...greedy });
            assert.equal(r.object, 'text_completion');
            assert.equal(r.choices.length, 1);
            assert.equal(r.choices[0].text, c.completion_text);
            assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
            assert.equal(r.usage.completion_tokens, c.completion_ids.length);
        });

        test('completions.create stream', async () => {
            const stream = await client.completions.create({ model: 'stories260K',
                prompt: c.prompt, stream: true, ...greedy });
            let text = '';
            let finish = null;
            let chunks = 0;
            for await (const chunk of stream) {
                chunks++;
                text += chunk.choices[0].text;
                finish = chunk.choices[0].finish_reason ?? finish;
            }
            assert.equal(text, c.completion_text);
            assert.ok(chunks > 1, 'one chunk: not streamed');
            assert.ok(finish === 'length' || finish === 'stop', `finish_reason ${finish}`);
        });

        test('chat.completions.create', async () => {
            const r = await client.chat.completions.create({ model: 'stories260K', messages,
                ...greedy });
            assert.equal(r.object, 'chat.completion');
            assert.equal(r.choices[0].message.role, 'assistant');
            assert.equal(r.choices[0].message.content, c.completion_text);
            assert.equal(r.usage.completion_tokens, c.completion_ids.length);
        });

        test('chat.completions.create stream', async () => {
            const stream = await client.chat.completions.create({ model: 'stories260K',
                messages, stream: true, ...greedy });
            let text = '';
            let role = null;
            let finish = null;
            for await (const chunk of stream) {
                assert.equal(chunk.object, 'chat.completion.chunk');
                const d = chunk.choices[0].delta;
                role = d.role ?? role;
                text += d.content ?? '';
                finish = chunk.choices[0].finish_reason ?? finish;
            }
            assert.equal(role, 'assistant');
            assert.equal(text, c.completion_text);
            assert.ok(finish === 'length' || finish === 'stop', `finish_reason ${finish}`);
        });
    });
}

// Structured outputs and tools through the SDK's own helpers: the schemas zod writes (strict,
// every property required, additionalProperties false) compile, and the answers parse.
const Person = z.object({
    name: z.string(),
    mood: z.enum(['happy', 'sad']),
    age: z.number(), // .int() writes minimum/maximum (safe-integer bounds): refused, a 400 names them
    pet: z.union([z.literal('cat'), z.literal('dog')]).nullable(),
});
const Weather = z.object({ city: z.string(), unit: z.enum(['c', 'f']) });

describe('structured outputs and tools', () => {
    test('chat.completions.parse with zodResponseFormat', async () => {
        for (let seed = 0; seed < 5; seed++) {
            const r = await client.chat.completions.parse({
                model: 'stories260K', temperature: 0.7, seed, max_tokens: 400,
                messages: [{ role: 'user', content: 'Tell me about Lily.' }],
                response_format: zodResponseFormat(Person, 'person'),
            });
            const c = r.choices[0];
            assert.equal(c.finish_reason, 'stop');
            assert.ok(c.message.parsed, c.message.content);
            Person.parse(c.message.parsed); // throws unless it validates
        }
    });

    test('a zodFunction tool with tool_choice required parses', async () => {
        const r = await client.chat.completions.parse({
            model: 'stories260K', temperature: 0.7, seed: 3, max_tokens: 300,
            messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
            tools: [zodFunction({ name: 'get_weather', parameters: Weather })],
            tool_choice: 'required',
        });
        const c = r.choices[0];
        assert.equal(c.finish_reason, 'tool_calls');
        const call = c.message.tool_calls[0];
        assert.equal(call.function.name, 'get_weather');
        Weather.parse(call.function.parsed_arguments);
    });

    test('streamed tool calls through chat.completions.stream', async () => {
        const stream = client.chat.completions.stream({
            model: 'stories260K', temperature: 0.7, seed: 5, max_tokens: 300,
            messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
            tools: [zodFunction({ name: 'get_weather', parameters: Weather })],
            tool_choice: { type: 'function', function: { name: 'get_weather' } },
        });
        const done = await stream.finalChatCompletion();
        const c = done.choices[0];
        assert.equal(c.finish_reason, 'tool_calls');
        Weather.parse(JSON.parse(c.message.tool_calls[0].function.arguments));
    });
});

describe('embeddings and scoring', () => {
    test('embeddings.create, as the SDK asks (base64) and as floats', async () => {
        const inputs = ['Once upon a time', 'Tom and Sue went to the beach'];
        const r = await client.embeddings.create({ model: 'stories260K', input: inputs });
        assert.equal(r.data.length, 2);
        const f = await client.embeddings.create({ model: 'stories260K', input: inputs,
            encoding_format: 'float' });
        for (let i = 0; i < 2; i++) {
            const v = r.data[i].embedding;
            assert.equal(v.length, 64);
            assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-5);
            assert.deepEqual(v.map(Math.fround), f.data[i].embedding.map(Math.fround));
        }
        assert.ok(r.usage.prompt_tokens > 0);
    });

    test('completions.create with echo scores the prompt', async () => {
        const c = CASES[0];
        const r = await client.completions.create({ model: 'stories260K', prompt: c.prompt,
            echo: true, logprobs: 1, max_tokens: 0, temperature: 0 });
        assert.equal(r.choices[0].text, c.prompt);
        const lp = r.choices[0].logprobs;
        assert.equal(lp.token_logprobs.length, c.prompt_ids.length);
        assert.equal(lp.token_logprobs[0], null);
        assert.ok(lp.token_logprobs.slice(1).every((x) => x < 0));
    });
});

describe('errors', () => {
    test('an invalid request raises the SDK\'s BadRequestError', async () => {
        await assert.rejects(
            client.completions.create({ model: 'stories260K', prompt: 'x', max_tokens: -1 }),
            (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
    });
});
