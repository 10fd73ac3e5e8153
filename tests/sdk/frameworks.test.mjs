// kvserve behind the frameworks apps use, each given only a base URL: the Vercel AI SDK
// (generateObject and streamText with tools on chat completions, openai(id) on /v1/responses)
// and LangChain (withStructuredOutput, bindTools, OpenAIEmbeddings). stories260K writes
// nonsense, but under the schemas it writes nonsense that parses and validates, which is what is
// tested.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject, generateText, streamText, tool } from 'ai';
import { ChatOpenAI, OpenAIEmbeddings } from '@langchain/openai';
import { z } from 'zod';
import { startKvserve, stopKvserve } from '../kvserve_process.mjs';

const MODELS = process.env.KVS_SHARED_MODELS ?? path.resolve('../../../shared/models');
let server = null;
let url = null;

before(async () => {
    url = process.env.KVSERVE_URL;
    if (!url) {
        const k = await startKvserve(process.env.KVSERVE_BIN,
            ['-m', path.join(MODELS, 'stories260K.gguf'), '--ctx-size', '2048', '--threads', '1',
                '--chat-template', 'plain']);
        server = k.proc;
        url = k.url;
    }
});

after(async () => {
    await stopKvserve(server);
});

const Person = z.object({
    name: z.string(),
    mood: z.enum(['happy', 'sad']),
    good: z.boolean(),
});
const Weather = z.object({ city: z.string(), unit: z.enum(['c', 'f']) });

describe('Vercel AI SDK', () => {
    const provider = () => createOpenAI({ baseURL: `${url}/v1`, apiKey: 'unused' });

    test('generateObject on chat completions', async () => {
        const { object, finishReason } = await generateObject({
            model: provider().chat('stories260K'), schema: Person, temperature: 0.7, seed: 1,
            maxRetries: 0, maxOutputTokens: 400, prompt: 'Tell me about Lily.',
        });
        assert.equal(finishReason, 'stop');
        Person.parse(object);
    });

    test('streamText with a required tool', async () => {
        const result = streamText({
            model: provider().chat('stories260K'), temperature: 0.7, seed: 2, maxRetries: 0,
            maxOutputTokens: 300, prompt: 'What is the weather in Paris?',
            tools: { get_weather: tool({ description: 'Weather now', inputSchema: Weather }) },
            toolChoice: 'required',
        });
        const calls = await result.toolCalls;
        assert.equal(calls.length, 1);
        assert.equal(calls[0].toolName, 'get_weather');
        Weather.parse(calls[0].input);
        assert.equal(await result.finishReason, 'tool-calls');
    });

    test('openai(id) on /v1/responses: text and objects', async () => {
        const { text, usage } = await generateText({
            model: provider()('stories260K'), prompt: 'Once upon a time', temperature: 0,
            maxOutputTokens: 8, maxRetries: 0,
        });
        assert.ok(text.length > 0);
        assert.equal(usage.outputTokens, 8);
        const { object } = await generateObject({
            model: provider()('stories260K'), schema: Person, temperature: 0.7, seed: 3,
            maxRetries: 0, maxOutputTokens: 400, prompt: 'Tell me about Lily.',
        });
        Person.parse(object);
    });

    test('openai(id) on /v1/responses: streamed tool call', async () => {
        const result = streamText({
            model: provider()('stories260K'), temperature: 0.7, seed: 4, maxRetries: 0,
            maxOutputTokens: 300, prompt: 'What is the weather in Paris?',
            tools: { get_weather: tool({ description: 'Weather now', inputSchema: Weather }) },
            toolChoice: 'required',
        });
        const calls = await result.toolCalls;
        assert.equal(calls.length, 1);
        Weather.parse(calls[0].input);
    });
});

/* Seeded, as the Vercel ones: an unseeded sample at 0.7 could run its tool call's string
 * argument past maxTokens (CI, ASan build, 2026-12-04: no tool call after 400 tokens). */
describe('LangChain', () => {
    const llm = () => new ChatOpenAI({
        model: 'stories260K', apiKey: 'unused', temperature: 0.7, maxRetries: 0,
        maxTokens: 400, configuration: { baseURL: `${url}/v1` },
    });

    test('withStructuredOutput', async () => {
        const out = await llm().withStructuredOutput(Person, { name: 'person' })
            .invoke('Tell me about Lily.', { seed: 6 });
        Person.parse(out);
    });

    test('bindTools with tool_choice required', async () => {
        const msg = await llm().bindTools(
            [{ name: 'get_weather', description: 'Weather now', schema: Weather }],
            { tool_choice: 'required', seed: 5 }).invoke('What is the weather in Paris?');
        assert.equal(msg.tool_calls.length, 1);
        assert.equal(msg.tool_calls[0].name, 'get_weather');
        Weather.parse(msg.tool_calls[0].args);
    });

    test('OpenAIEmbeddings: documents and a query, as a vector store embeds them', async () => {
        // checkEmbeddingCtxLength false: otherwise it sends tiktoken's ids, OpenAI's vocabulary
        const emb = new OpenAIEmbeddings({ model: 'stories260K', apiKey: 'unused', maxRetries: 0,
            checkEmbeddingCtxLength: false, configuration: { baseURL: `${url}/v1` } });
        const docs = await emb.embedDocuments(['Tom had a dog.', 'Sue went to the beach.']);
        const q = await emb.embedQuery('Tom had a dog.');
        assert.equal(docs.length, 2);
        assert.equal(q.length, 64);
        assert.deepEqual(q.map(Math.fround), docs[0].map(Math.fround));
        assert.notDeepEqual(docs[0], docs[1]);
    });
});
