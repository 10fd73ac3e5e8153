"""meson test 'prometheus': /metrics after real traffic (completions, streams, chat, errors,
n > 1) must pass `promtool check metrics` with no finding, and each histogram must
be well formed with buckets that fit what it measures. Exits 77 (meson's skip) when promtool
(Debian package prometheus), the kvserve binary or the model is missing."""
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import kvs_e2e as e2e  # noqa: E402

PROMTOOL = shutil.which("promtool")


def families(text):
    """Parses exposition text into {family: {"type", "help", "samples": [(name, labels, v)]}}."""
    out, cur = {}, None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, help_ = line[7:].split(" ", 1)
            out.setdefault(name, {"samples": []})["help"] = help_
        elif line.startswith("# TYPE "):
            name, type_ = line[7:].split(" ", 1)
            out.setdefault(name, {"samples": []})["type"] = type_
            cur = name
        elif line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            out[cur]["samples"].append((name, labels.rstrip("}"), float(value)))
    return out


class Metrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = e2e.Server()
        srv, case = cls.srv, e2e.load_reference()[0]
        body = {"prompt": case["prompt"], "max_tokens": 16, "temperature": 0}
        srv.post("/v1/completions", body)
        srv.stream("/v1/completions", dict(body, stream=True))
        srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                          "max_tokens": 8})
        srv.post("/v1/completions", {"prompt": "x", "max_tokens": -1})  # 400
        srv.request("GET", "/nope")  # 404
        # n choices run as sequences of one batch: the batch-size histogram sees more than one.
        srv.post("/v1/completions", dict(body, n=4, temperature=1.0, seed=3))
        st, _, data = srv.request("GET", "/metrics")
        assert st == 200
        cls.text = data.decode()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_promtool_check_metrics(self):
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=self.text.encode(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual((r.returncode, r.stdout.decode()), (0, ""),
                         "promtool check metrics found problems")

    def test_families(self):
        fams = families(self.text)
        for name, f in fams.items():
            self.assertTrue(name.startswith("kvserve_"), name)
            self.assertIn(f.get("type"), ("counter", "gauge", "histogram"), name)
            self.assertTrue(f.get("help"), name)
            self.assertTrue(f["samples"], name + " has no samples")
            if f["type"] == "counter":
                self.assertTrue(name.endswith("_total"), name)
        self.assertGreater(self.metric(fams, "kvserve_generation_tokens_total"), 0)
        self.assertGreaterEqual(self.metric(fams, "kvserve_requests_total", 'status="400"'), 1)
        self.assertGreaterEqual(self.metric(fams, "kvserve_requests_total", 'status="404"'), 1)

    def metric(self, fams, name, labels="", family=None):
        for n, l, v in fams[family or name]["samples"]:
            if n == name and l == labels:
                return v
        self.fail("%s{%s} missing" % (name, labels))

    def test_histograms(self):
        fams = families(self.text)
        # (smallest bound at most, largest bound at least): what each histogram must resolve.
        want = {"kvserve_time_to_first_token_seconds": (0.001, 10),
                "kvserve_inter_token_latency_seconds": (0.001, 0.5),
                "kvserve_e2e_request_latency_seconds": (0.01, 60),
                "kvserve_batch_size": (1, 64)}
        for name, (lo, hi) in want.items():
            f = fams[name]
            self.assertEqual(f["type"], "histogram", name)
            buckets = [(l, v) for n, l, v in f["samples"] if n == name + "_bucket"]
            les = [l.split('"')[1] for l, _ in buckets]
            self.assertEqual(les[-1], "+Inf", name)
            bounds = [float(x) for x in les[:-1]]
            self.assertEqual(bounds, sorted(set(bounds)), name + ": bounds not ascending")
            self.assertGreaterEqual(len(bounds), 8, name + ": too coarse")
            self.assertLessEqual(bounds[0], lo, name)
            self.assertGreaterEqual(bounds[-1], hi, name)
            counts = [v for _, v in buckets]
            self.assertEqual(counts, sorted(counts), name + ": buckets not cumulative")
            count = self.metric(fams, name + "_count", family=name)
            self.assertEqual(counts[-1], count, name)
            self.assertGreater(count, 0, name + ": no observations after traffic")
            self.assertGreaterEqual(self.metric(fams, name + "_sum", family=name), 0, name)
        # The n=4 request was batched: some step carried more than one sequence.
        b = dict((l.split('"')[1], v) for n, l, v in fams["kvserve_batch_size"]["samples"]
                 if n == "kvserve_batch_size_bucket")
        self.assertLess(b["1"], b["+Inf"], "no step ran more than one sequence")


def main():
    return e2e.run_standalone(("promtool not found (Debian package prometheus; tools/setup.sh)",
                                 not PROMTOOL))


if __name__ == "__main__":
    sys.exit(main())
