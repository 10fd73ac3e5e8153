// kvserve's web page in a real browser (Debian's chromium, headless, driven by playwright-core):
// open /, type a prompt, press Enter, the streamed reply appears; the KV grid shows the
// sequence's blocks while it runs and gives them back (free or cached) after; Stop cancels the
// request on the server. The page must reference no other host and log no console errors.
// A screenshot mid-generation goes to $KVS_WEBUI_SCREENSHOT when set (docs/webui.png).
//
// Environment: KVSERVE_BIN, KVS_MKMODEL, KVS_SHARED_MODELS (its vocab/); CHROMIUM (default
// /usr/bin/chromium).
// run.sh checks the prerequisites and exits 77 (meson's skip) when one is missing.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { startKvserve, stopKvserve } from '../kvserve_process.mjs';

const MODELS = process.env.KVS_SHARED_MODELS ?? path.resolve('../../../shared/models');
// A 110m-shape model (random weights) from kvs-mkmodel: slow enough on one thread (tens of
// tokens a second) that a person, and this test, can watch its blocks fill the grid.
const TMP = mkdtempSync(path.join(tmpdir(), 'kvs-webui-'));
const MODEL = path.join(TMP, '110m-f16.gguf');
let server = null, url = '', browser = null;

async function startServer(extra) {
    execFileSync(process.env.KVS_MKMODEL, ['--shape', '110m', '--type', 'f16', '--vocab',
        path.join(MODELS, 'vocab', 'ggml-vocab-llama-spm.gguf'), '-o', MODEL],
    { stdio: 'ignore' });
    const k = await startKvserve(process.env.KVSERVE_BIN, ['-m', MODEL, '--ctx-size', '512',
        '--threads', '1', '--served-model-name', '110m-random', '--kv-cache-mb', '64', ...extra]);
    server = k.proc;
    return k.url;
}

async function metric(name) {
    const text = await (await fetch(`${url}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
    return line ? Number(line.split(' ').pop()) : NaN;
}

before(async () => {
    url = await startServer([]);
    browser = await chromium.launch({
        executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
        args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    });
});

after(async () => {
    if (browser)
        await browser.close();
    await stopKvserve(server);
    rmSync(TMP, { recursive: true, force: true });
});

async function openPage() {
    const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    const problems = [];
    page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
    page.on('pageerror', (e) => problems.push(String(e)));
    const foreign = [];
    page.on('request', (r) => {
        if (!r.url().startsWith(url) && !r.url().startsWith('data:')) foreign.push(r.url());
    });
    const res = await page.goto(url + '/');
    assert.equal(res.status(), 200);
    assert.match(res.headers()['content-type'], /^text\/html/);
    await page.waitForFunction(() => document.getElementById('kv-free').textContent !== '–');
    return { page, problems, foreign };
}

test('GET / is the page and names no other host', async () => {
    const r = await fetch(url + '/');
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/html/);
    const html = await r.text();
    assert.doesNotMatch(html, /(src|href)\s*=\s*["']?(https?:)?\/\//i);
    assert.doesNotMatch(html, /fetch\(\s*["'`]https?:/i);
});

test('chat: Enter sends, the reply streams in, the grid shows its blocks and then frees them',
    async () => {
        const { page, problems, foreign } = await openPage();
        await page.fill('#max_tokens', '40');
        await page.fill('#temperature', '0.9');
        await page.fill('#prompt', 'Once upon a time');
        // streamed: text appears while the reply is still running. Seen by an observer of the
        // page's mutations rather than a poll: on a starved machine the whole stream may be
        // buffered by the time the page runs, and read through in one go between two polls.
        await page.evaluate(() => {
            window.streamedText = false;
            new MutationObserver(() => {
                const m = document.querySelector('.msg.assistant.streaming .body');
                if (m && m.textContent.length > 0)
                    window.streamedText = true;
            }).observe(document.body, { subtree: true, childList: true, characterData: true });
        });
        await page.press('#prompt', 'Enter');
        await page.waitForFunction(() => window.streamedText, null, { timeout: 60000 });
        // the grid shows the running sequence's blocks
        await page.waitForFunction(() => Number(document.getElementById('kv-used').textContent) > 0 &&
            Number(document.getElementById('kv-running').textContent) >= 1, null, { timeout: 30000 });
        if (process.env.KVS_WEBUI_SCREENSHOT) {
            // for the picture: an API client's n = 3 request beside the chat, its choices
            // sharing their prompt's blocks
            const other = fetch(url + '/v1/completions', { method: 'POST',
                headers: { 'Content-Type': 'application/json' },
                body: JSON.stringify({ prompt: 'The little dog ran to the big park and ' +
                    'the little dog was happy to see the big park', n: 3, max_tokens: 24 }) });
            await page.waitForFunction(() => Number(document.getElementById('kv-shared')
                .textContent) > 0, null, { timeout: 30000 });
            await page.screenshot({ path: process.env.KVS_WEBUI_SCREENSHOT });
            await other;
        }
        await page.waitForSelector('.msg.assistant[data-done="done"]', { timeout: 120000 });
        const stats = await page.textContent('.msg.assistant .stats');
        assert.match(stats, /generated tokens/);
        assert.match(stats, /tok\/s/);
        // and back: nothing used, the full blocks kept for reuse
        await page.waitForFunction(() => document.getElementById('kv-used').textContent === '0' &&
            Number(document.getElementById('kv-cached').textContent) > 0, null, { timeout: 10000 });
        const reply = await page.textContent('.msg.assistant .body');
        assert.ok(reply.length > 0);
        assert.deepEqual(problems, []);
        assert.deepEqual(foreign, []);
        await page.close();
    });

test('stop cancels the request on the server and its blocks come back', async () => {
    const { page, problems } = await openPage();
    const cancelled = await metric('kvserve_requests_total{status="499"}');
    await page.fill('#max_tokens', '400');
    await page.fill('#prompt', 'Tell me a very long story');
    await page.press('#prompt', 'Enter');
    await page.waitForFunction(() => Number(document.getElementById('kv-used').textContent) > 0,
        null, { timeout: 30000 });
    await page.click('#stop');
    await page.waitForSelector('.msg.assistant[data-done="stopped"]', { timeout: 10000 });
    await page.waitForFunction(() => document.getElementById('kv-used').textContent === '0',
        null, { timeout: 10000 });
    assert.equal(await metric('kvserve_kv_blocks_used'), 0);
    assert.equal(await metric('kvserve_requests_total{status="499"}'), cancelled + 1);
    assert.deepEqual(problems, []);
    await page.close();
});
