// Starting and stopping a real kvserve for the Node test suites (tests/sdk, tests/webui):
// `kvserve serve ARGS --host 127.0.0.1 --port 0`, ready once /health answers 200 on the port
// it logs. Node's standard library only.
import { spawn } from 'node:child_process';

// Resolves with { url, proc, stderr() } once the server answers; rejects with its log if it
// exits or is not ready within 30 s.
export async function startKvserve(bin, args) {
    const proc = spawn(bin, ['serve', ...args, '--host', '127.0.0.1', '--port', '0'],
        { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => { log += d; });
    const deadline = Date.now() + 30000;
    while (Date.now() < deadline) {
        if (proc.exitCode !== null)
            throw new Error(`kvserve exited with ${proc.exitCode}:\n${log}`);
        const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log);
        if (m) {
            const url = `http://127.0.0.1:${m[1]}`;
            try {
                if ((await fetch(`${url}/health`)).status === 200)
                    return { url, proc, stderr: () => log };
            } catch { /* not accepting yet */ }
        }
        await new Promise((r) => setTimeout(r, 50));
    }
    proc.kill('SIGKILL');
    throw new Error(`kvserve did not become ready:\n${log}`);
}

// SIGTERM, and wait for the exit (a no-op for a server that already exited).
export async function stopKvserve(proc) {
    if (!proc || proc.exitCode !== null)
        return;
    const exited = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGTERM');
    await exited;
}
