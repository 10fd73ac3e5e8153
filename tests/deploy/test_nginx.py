"""meson test 'nginx': docker/nginx.conf for real, on loopback, in front of two kvserve
processes (as docker/compose.yaml runs it in front of two replicas).

The test writes a small main nginx.conf in a temp folder that includes docker/nginx.conf with
only its upstream server, listen and access_log lines rewritten, runs nginx in the foreground,
and checks: a streaming completion through the proxy equals the reference text; sequential
requests reach both backends; and least_conn sends new requests away from a backend that is busy
with a long one. Exits 77 (meson's skip) when nginx, kvserve or the model is missing."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import kvs_e2e as e2e  # noqa: E402

NGINX_CONF = os.path.join(HERE, "..", "..", "docker", "nginx.conf")
NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(p, os.X_OK)), None)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rewrite(conf, backends, port, access_log):
    """docker/nginx.conf with its compose-specific lines pointed at this machine. Each rewrite
    must match exactly once, so a change to the file's shape fails here instead of passing
    untested."""
    def sub(pattern, repl, text):
        out, n = re.subn(pattern, repl, text, flags=re.M)
        if n != 1:
            raise AssertionError("docker/nginx.conf: %r matched %d times" % (pattern, n))
        return out
    conf = sub(r"^(\s*)server kvserve:8080(.*)$",
               lambda m: "\n".join("%sserver 127.0.0.1:%d%s" % (m.group(1), p, m.group(2))
                                   for p in backends), conf)
    conf = sub(r"^(\s*)listen 80;", r"\1listen 127.0.0.1:%d;" % port, conf)
    conf = sub(r"^(\s*)access_log /var/log/nginx/access.log kvserve;",
               r"\1access_log %s kvserve;" % access_log, conf)
    return conf


class Nginx:
    """nginx -g 'daemon off;' with everything (pid, logs, temp files) in a temp folder."""

    def __init__(self, backends):
        self.dir = tempfile.mkdtemp(prefix="kvserve-nginx-")
        os.chmod(self.dir, 0o755)  # run as root, nginx's workers are nobody: they need to enter
        self.port = free_port()
        self.access_log = os.path.join(self.dir, "access.log")
        with open(NGINX_CONF) as f:
            site = rewrite(f.read(), backends, self.port, self.access_log)
        with open(os.path.join(self.dir, "kvserve.conf"), "w") as f:
            f.write(site)
        user = "user nobody nogroup;\n" if os.geteuid() == 0 else ""
        temps = "".join("    %s_temp_path %s;\n" % (t, os.path.join(self.dir, t))
                        for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        with open(os.path.join(self.dir, "nginx.conf"), "w") as f:
            f.write("%sworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log info;\n"
                    "events { worker_connections 256; }\n"
                    "http {\n%s    include %s/kvserve.conf;\n}\n"
                    % (user, self.dir, self.dir, temps, self.dir))
        self.proc = subprocess.Popen(
            [NGINX, "-p", self.dir, "-c", os.path.join(self.dir, "nginx.conf"),
             "-e", os.path.join(self.dir, "error.log"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited with %d:\n%s" % (self.proc.returncode,
                                                                  self.error_log()))
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("nginx did not answer /health:\n" + self.error_log())

    def error_log(self):
        try:
            with open(os.path.join(self.dir, "error.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r, r.read()
        finally:
            c.close()

    def upstreams(self):
        """The upstream port of each logged request, in log order (nginx logs at the end)."""
        with open(self.access_log) as f:
            return [(int(m.group(2)), m.group(1)) for m in
                    (re.search(r'"(\S+ \S+) [^"]*".*upstream=127\.0\.0\.1:(\d+)', line)
                     for line in f) if m]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: finish, flush logs
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class ThroughNginx(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.backends = [e2e.Server(), e2e.Server()]
        try:
            cls.nginx = Nginx([b.port for b in cls.backends])
        except Exception:
            for b in cls.backends:
                b.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.nginx.stop()
        for b in cls.backends:
            b.stop()

    def test_0_config_is_streaming_friendly(self):
        # Buffering cannot be told apart by timing with a model this fast: read the directives.
        with open(NGINX_CONF) as f:
            conf = re.sub(r"#.*", "", f.read())
        directives = dict(re.findall(r"^\s*(\w+)\s+([^;{]*);", conf, flags=re.M))
        self.assertIn("least_conn;", conf)
        self.assertEqual(directives.get("proxy_buffering"), "off")
        self.assertEqual(directives.get("proxy_http_version"), "1.1")
        self.assertRegex(conf, r'proxy_set_header\s+Connection\s+"";')
        m = re.fullmatch(r"(\d+)([smhd]?)", directives.get("proxy_read_timeout", ""))
        self.assertIsNotNone(m, "proxy_read_timeout missing")
        secs = int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        self.assertGreaterEqual(secs, 600, "streams may idle in the queue for minutes")

    def test_1_stream_equals_reference(self):
        case = e2e.load_reference()[0]
        body = {"prompt": case["prompt"], "max_tokens": len(case["completion_ids"]),
                "temperature": 0, "stream": True}
        c = http.client.HTTPConnection("127.0.0.1", self.nginx.port, timeout=60)
        try:
            c.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            self.assertTrue(r.getheader("Content-Type", "").startswith("text/event-stream"))
            # Unbuffered pass-through: the body arrives chunked as kvserve wrote it, not as one
            # buffered block with a Content-Length.
            self.assertIsNone(r.getheader("Content-Length"))
            events, done = e2e.parse_sse(r.read().decode())
        finally:
            c.close()
        self.assertTrue(done, "no data: [DONE]")
        self.assertGreater(len(events), 1)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events),
                         case["completion_text"])

    def test_2_requests_reach_both_backends(self):
        # Finished generations per backend (requests_total would also count the /metrics calls).
        done = "kvserve_e2e_request_latency_seconds_count"
        before = [b.metrics()[done] for b in self.backends]
        for i in range(8):
            st, _, data = self.nginx.request("POST", "/v1/completions",
                                             {"prompt": "Once", "max_tokens": 4, "seed": i})
            self.assertEqual(st, 200, data)
        after = [b.metrics()[done] for b in self.backends]
        served = [a - b for a, b in zip(after, before)]
        self.assertEqual(sum(served), 8, served)
        # One at a time, least_conn ties break round-robin: both replicas share the load.
        self.assertTrue(all(s >= 2 for s in served), "spread %s" % served)
        ports = {p for p, _ in self.nginx.upstreams()}
        self.assertEqual(ports, {b.port for b in self.backends}, "access log upstreams")

    def test_3_least_conn_avoids_busy_backend(self):
        # One long request (16 sequences x 480 tokens, about a second here) keeps one backend
        # busy; short requests sent meanwhile must all go to the other one. Round-robin would
        # send half of them to the busy backend.
        n_logged = len(self.nginx.upstreams())
        long_body = {"prompt": "Once upon a time", "max_tokens": 480, "n": 16,
                     "ignore_eos": True}
        result = {}

        def long_request():
            result["status"] = self.nginx.request("POST", "/v1/completions", long_body)[0]

        t = threading.Thread(target=long_request)
        t.start()
        # Wait until a backend has the long request running.
        deadline = time.time() + 10
        busy = None
        while busy is None and time.time() < deadline and t.is_alive():
            for b in self.backends:
                if b.metrics()["kvserve_num_requests_running"] > 0:
                    busy = b.port
            time.sleep(0.005)
        shorts = []
        while t.is_alive() and len(shorts) < 4:
            st, _, _ = self.nginx.request("POST", "/v1/completions",
                                          {"prompt": "Once", "max_tokens": 2})
            self.assertEqual(st, 200)
            shorts.append(st)
        t.join()
        self.assertEqual(result.get("status"), 200)
        self.assertIsNotNone(busy, "never saw the long request running")
        log = self.nginx.upstreams()[n_logged:]
        # nginx logs a request when it ends: short ones logged before the long one overlapped it.
        self.assertEqual(log[-1][0], busy, "the long request is logged last, on the busy one")
        overlapped = [port for port, _ in log[:-1]]
        self.assertGreaterEqual(len(overlapped), 3,
                                "the long request ended too soon to test (%s)" % log)
        self.assertNotIn(busy, overlapped, "least_conn sent work to the busy backend: %s" % log)


def main():
    return e2e.run_standalone(("nginx not found (Debian package nginx; tools/setup.sh)", not NGINX))


if __name__ == "__main__":
    sys.exit(main())
