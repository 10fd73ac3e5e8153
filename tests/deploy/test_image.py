"""meson test 'image': the real container image, built from docker/Dockerfile with podman
(tools/image.sh; ../shared/guide/CONTAINERS.md) and run: /health, the stories260K greedy
reference through the image, a streamed chat request, the HEALTHCHECK command, the kernels
the image picks against the native build's, and a clean exit on SIGTERM.
Its speed against the native build is bench/image.sh's (tests never assert timings).
Exits 77 (meson's skip) in sanitizer builds (the release build covers it), and when podman
cannot be installed or the base image cannot be made here, saying why."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import kvs_e2e as e2e  # noqa: E402

TAG = "localhost/kvserve:test"
PODMAN = ["podman", "--runtime", "/usr/sbin/runc"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
built = None  # why the build failed, or "" once built


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def build_image():
    global built
    if built is None:
        r = subprocess.run(["bash", os.path.join(ROOT, "tools", "image.sh"), TAG], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=1800)
        built = "" if r.returncode == 0 else r.stdout[-4000:]
    return built


class Container:
    """A kvserve container on the host network (podman here has no -p mapping)."""

    def __init__(self, *args):
        self.port = free_port()
        self.name = "kvs-test-%d-%d" % (os.getpid(), self.port)
        cmd = PODMAN + ["run", "-d", "--name", self.name, "--network", "host"] + LIMITS + [
            "-v", os.path.abspath(e2e.MODELS) + ":/models:ro", TAG,
            "-m", "/models/stories260K.gguf", "--port", str(self.port)] + list(args)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=120)
        self.srv = e2e.Server.__new__(e2e.Server)  # reuse its HTTP helpers only
        self.srv.port = self.port

    def logs(self):
        return subprocess.run(PODMAN + ["logs", self.name], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60).stdout

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                st, _, _ = self.srv.request("GET", "/health")
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("the container did not become ready:\n" + self.logs())

    def stop(self):
        """SIGTERM (podman stop) and the exit code."""
        subprocess.run(PODMAN + ["stop", "-t", "40", self.name], stdout=subprocess.DEVNULL,
                       timeout=120)
        r = subprocess.run(PODMAN + ["inspect", "-f", "{{.State.ExitCode}}", self.name],
                           stdout=subprocess.PIPE, text=True, timeout=60)
        return int(r.stdout.strip() or -1)

    def remove(self):
        subprocess.run(PODMAN + ["rm", "-f", self.name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)


class Image(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = build_image()
        if why:
            raise AssertionError("tools/image.sh failed:\n" + why)
        cls.c = Container("--served-model-name", "stories260K")
        cls.c.wait_ready()

    @classmethod
    def tearDownClass(cls):
        cls.c.remove()

    def test_reference_through_the_image(self):
        for case in e2e.load_reference():
            with self.subTest(prompt=case["prompt"]):
                n = len(case["completion_ids"]) + (1 if case["stop"] == "bos" else 0)
                st, r = self.c.srv.post("/v1/completions", {
                    "prompt": case["prompt"], "max_tokens": n, "temperature": 0})
                self.assertEqual(st, 200, r)
                self.assertEqual(r["choices"][0]["text"], case["completion_text"])

    def test_streamed_chat(self):
        st, events, done = self.c.srv.stream("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 24,
            "stream": True, "stream_options": {"include_usage": True}})
        self.assertEqual(st, 200)
        self.assertTrue(done)
        text = "".join(ch["delta"].get("content") or "" for ev in events
                       for ch in ev.get("choices", []))
        self.assertTrue(text)
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 24)

    def test_healthcheck_and_metrics(self):
        # the Dockerfile's HEALTHCHECK command, run inside the container (port 8080 there is
        # the ENTRYPOINT's; this container listens on --port, so run the same probe on it)
        r = subprocess.run(PODMAN + ["image", "inspect", TAG], stdout=subprocess.PIPE,
                           text=True, timeout=60)
        hc = json.loads(r.stdout)[0].get("Healthcheck")
        self.assertTrue(hc, "the image has no HEALTHCHECK (podman build needs --format docker)")
        probe = hc["Test"][-1].replace("8080", str(self.c.port))
        r = subprocess.run(PODMAN + ["exec", self.c.name, "bash", "-c", probe], timeout=60)
        self.assertEqual(r.returncode, 0, "HEALTHCHECK failed")
        st, _, body = self.c.srv.request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertTrue(b"\nkvserve_kv_blocks_used " in body, "no kvserve_kv_blocks_used")

    def test_kernels_as_native(self):
        """The image is built portable (-Dnative=false): it must still pick the kernels this
        CPU has, the same as the native build does."""
        pick = re.compile(r"kernels: (\S+)")
        m = pick.search(self.c.logs())
        self.assertIsNotNone(m, "no 'kernels:' line in the container's log:\n" + self.c.logs())
        native = e2e.Server()
        try:
            n = pick.search(native.stderr())
        finally:
            native.stop()
        self.assertIsNotNone(n)
        self.assertEqual(m.group(1), n.group(1))


class Lifecycle(unittest.TestCase):
    def test_sigterm_exits_cleanly(self):
        why = build_image()
        if why:
            raise AssertionError("tools/image.sh failed:\n" + why)
        c = Container()
        try:
            c.wait_ready()
            self.assertEqual(c.stop(), 0, c.logs())
        finally:
            c.remove()


def main():
    if os.environ.get("KVS_SANITIZE", "none") not in ("", "none"):
        print("SKIP: sanitizer build (the release build runs the image test)")
        return 77
    if not shutil.which("podman") and subprocess.run(
            ["bash", "-c", "command -v apt-get"], stdout=subprocess.DEVNULL).returncode:
        print("SKIP: podman not installed and no apt-get to install it")
        return 77
    return e2e.run_standalone()


if __name__ == "__main__":
    sys.exit(main())
