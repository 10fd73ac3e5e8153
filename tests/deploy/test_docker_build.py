"""meson test 'docker_build': docker/Dockerfile without a Docker engine, so it cannot rot.

- The build stage's RUN commands run for real in a temp copy of the repository (the files git
  tracks, less .dockerignore), in WORKDIR's place; its apt-get install lines are checked
  against the installed packages instead of run.
- The runtime stage's apt packages must provide every shared library the built binary links
  (through their dependencies, or Debian's required packages such as libc6).
- The binary then runs with the image's ENTRYPOINT + CMD (port and model path mapped to this
  machine) and the HEALTHCHECK command must pass against it; the runtime stage is checked for a
  non-root USER, EXPOSE 8080, /models and --host 0.0.0.0; compose.yaml must point at the
  Dockerfile and nginx.conf.
Exits 77 (meson's skip) when git, dpkg or the model is missing, and in sanitizer builds (the
release build covers it; KVS_SANITIZE is set by tests/meson.build)."""
import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import kvs_e2e as e2e  # noqa: E402

DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")


def parse_dockerfile(path):
    """Returns stages: [{"from", "name", "instrs": [(INSTR, args)]}], joining continuations."""
    stages, logical, cur = [], [], ""
    with open(path) as f:
        for line in f:
            s = line.rstrip("\n")
            if not cur and (not s.strip() or s.lstrip().startswith("#")):
                continue
            if s.lstrip().startswith("#"):  # comment inside a continued instruction
                continue
            if s.endswith("\\"):
                cur += s[:-1] + " "
                continue
            logical.append(cur + s)
            cur = ""
    for line in logical:
        instr, _, args = line.strip().partition(" ")
        instr, args = instr.upper(), args.strip()
        if instr == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args, flags=re.I)
            stages.append({"from": m.group(1), "name": m.group(2), "instrs": []})
        else:
            stages[-1]["instrs"].append((instr, args))
    return stages


def exec_form(args):
    """A JSON exec form (["a", "b"]) as a list; a shell form as ["/bin/sh", "-c", args]."""
    if args.startswith("["):
        return json.loads(args)
    return ["/bin/sh", "-c", args]


def apt_packages(cmd):
    """Packages named by the 'apt-get install' steps of a shell command, and the command's
    other steps (apt-get update and apt list cleanup dropped)."""
    pkgs, rest = [], []
    for step in re.split(r"\s*&&\s*", cmd.strip()):
        words = shlex.split(step)
        words = [w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # env prefixes
        if words[:2] == ["apt-get", "install"]:
            pkgs += [w for w in words[2:] if not w.startswith("-")]
        elif words[:2] == ["apt-get", "update"] or step.startswith("rm -rf /var/lib/apt/lists"):
            continue
        else:
            rest.append(step)
    return pkgs, rest


def dpkg_installed(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL)
    return r.returncode == 0 and b"install ok installed" in r.stdout


def dpkg_field(pkg, field):
    r = subprocess.run(["dpkg-query", "-W", "-f=${%s}" % field, pkg], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL)
    return r.stdout.decode() if r.returncode == 0 else ""


def dependency_closure(pkgs):
    """Installed packages reachable through Depends/Pre-Depends (any alternative counts)."""
    seen, todo = set(), list(pkgs)
    while todo:
        p = todo.pop().split(":")[0]
        if p in seen:
            continue
        seen.add(p)
        deps = dpkg_field(p, "Depends") + "," + dpkg_field(p, "Pre-Depends")
        for alt in deps.split(","):
            for d in alt.split("|"):
                name = d.strip().split(" ")[0]
                if name:
                    todo.append(name)
    return seen


def owner_package(path):
    """The package owning a file, trying the path and its canonical form (usrmerge)."""
    for p in (path, os.path.realpath(path), path.replace("/usr/lib/", "/lib/", 1)):
        r = subprocess.run(["dpkg", "-S", p], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            return r.stdout.decode().split(":")[0].split(",")[0].strip()
    return None


def repo_copy(dst):
    """The files git tracks (what a fresh clone has), less .dockerignore's patterns."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], stdout=subprocess.PIPE,
                           check=True).stdout.decode().split("\0")
    ignore = []
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignore = [ln.strip().lstrip("*/") for ln in f if ln.strip() and not ln.startswith("#")]
    n = 0
    for rel in filter(None, files):
        parts = rel.split("/")
        if any(fnmatch.fnmatch(rel, pat) or any(fnmatch.fnmatch(p, pat) for p in parts)
               for pat in ignore):
            continue
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue  # deleted in the work tree
        os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, rel))
        n += 1
    return n


class Dockerfile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stages = parse_dockerfile(DOCKERFILE)
        cls.tmp = tempfile.mkdtemp(prefix="kvserve-docker-")
        cls.built = None  # the binary the build stage produced, mapped to this machine

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_1_stages(self):
        self.assertEqual(len(self.stages), 2, "build stage + runtime stage")
        self.assertEqual([s["from"] for s in self.stages], ["debian:12", "debian:12"])
        self.assertEqual(self.stages[0]["name"], "build")
        rt = dict((i, a) for i, a in self.stages[1]["instrs"])
        self.assertIn("USER", rt)
        self.assertNotIn(rt["USER"], ("root", "0"))
        self.assertEqual(rt.get("EXPOSE"), "8080")
        self.assertIn("/models", rt.get("VOLUME", ""))
        self.assertIn("/health", rt.get("HEALTHCHECK", ""))
        entry = exec_form(rt["ENTRYPOINT"]) + exec_form(rt["CMD"])
        self.assertIn("--host", entry)
        self.assertEqual(entry[entry.index("--host") + 1], "0.0.0.0")
        self.assertEqual(entry[entry.index("--port") + 1], "8080")
        self.assertTrue(entry[entry.index("-m") + 1].startswith("/models/"))
        # Only the binary comes from the build stage.
        copies = [a for i, a in self.stages[1]["instrs"] if i == "COPY"]
        self.assertEqual(len(copies), 1, copies)
        self.assertTrue(copies[0].startswith("--from=build "), copies)

    def test_2_build_stage_runs(self):
        build = self.stages[0]
        src = os.path.join(self.tmp, "src")
        os.makedirs(src)
        workdir, env = None, dict(os.environ)
        for instr, args in build["instrs"]:
            if instr == "WORKDIR":
                workdir = args
            elif instr == "COPY":
                self.assertEqual(args, ". .", "build stage: only COPY . . is understood here")
                self.assertGreater(repo_copy(src), 50)
            elif instr == "ENV":
                k, _, v = args.partition("=")
                env[k.strip()] = v.strip()
            elif instr == "RUN":
                pkgs, rest = apt_packages(args)
                missing = [p for p in pkgs if not dpkg_installed(p)]
                self.assertEqual(missing, [], "build stage needs packages not installed here")
                if rest:
                    cmd = " && ".join(rest)
                    r = subprocess.run(["bash", "-ec", cmd], cwd=src, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                    self.assertEqual(r.returncode, 0, "RUN %s\n%s" % (cmd, r.stdout.decode()[-4000:]))
            else:
                self.fail("build stage: instruction %s not understood by this test" % instr)
        self.assertIsNotNone(workdir)
        copy = [a for i, a in self.stages[1]["instrs"] if i == "COPY"][0].split()
        path = copy[1]
        self.assertTrue(path.startswith(workdir.rstrip("/") + "/"), path)
        local = os.path.join(src, path[len(workdir.rstrip("/")) + 1:])
        self.assertTrue(os.access(local, os.X_OK), local + " not built")
        type(self).built = local

    def needs_binary(self):
        if not self.built:
            self.skipTest("the build stage did not produce the binary")

    def test_3_runtime_packages_cover_libraries(self):
        self.needs_binary()
        pkgs = []
        for instr, args in self.stages[1]["instrs"]:
            if instr == "RUN":
                pkgs += apt_packages(args)[0]
        self.assertTrue(pkgs)
        for p in pkgs:
            self.assertTrue(dpkg_installed(p), "runtime package %s unknown here" % p)
        # What debian:12 itself has: the Essential packages and what they depend on.
        q = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Essential}\\n"],
                           stdout=subprocess.PIPE, check=True).stdout.decode()
        base = dependency_closure([ln.split()[0] for ln in q.splitlines()
                                   if ln.endswith(" yes")])
        closure = dependency_closure(pkgs)
        ldd = subprocess.run(["ldd", self.built], stdout=subprocess.PIPE, check=True)
        libs = dict(re.findall(r"^\s*(\S+)\s+=>\s+(/\S+)", ldd.stdout.decode(), flags=re.M))
        # The dynamic loader is listed by path alone ("/lib64/ld-linux-x86-64.so.2 (0x…)").
        libs.update((os.path.basename(p), p) for p in
                    re.findall(r"^\s*(/\S+)\s+\(", ldd.stdout.decode(), flags=re.M))
        dyn = subprocess.run(["readelf", "-d", self.built], stdout=subprocess.PIPE, check=True)
        needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dyn.stdout.decode())
        self.assertIn("libmicrohttpd.so.12", needed)
        for soname in needed:  # linked directly: the runtime stage names its package
            owner = owner_package(libs[soname])
            self.assertTrue(owner in pkgs or owner == "libc6",
                            "%s (%s) is linked but the runtime stage does not install it"
                            % (soname, owner))
        for soname, lib in libs.items():  # pulled in by those: their dependencies or the base
            owner = owner_package(lib)
            self.assertTrue(owner in closure or owner in base,
                            "%s (%s) would be missing at run time" % (soname, owner))

    def test_4_entrypoint_serves_and_healthcheck_passes(self):
        self.needs_binary()
        if not os.path.exists(e2e.MODEL):
            self.skipTest(e2e.MODEL + " not found")
        rt = dict((i, a) for i, a in self.stages[1]["instrs"])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]

        def local(arg):  # container paths and port -> this machine (loopback only)
            arg = arg.replace("8080", str(port)).replace("0.0.0.0", "127.0.0.1")
            return re.sub(r"^/models/\S+$", e2e.MODEL, arg)
        argv = [local(a) for a in exec_form(rt["ENTRYPOINT"]) + exec_form(rt["CMD"])]
        self.assertEqual(argv[0], "kvserve")
        argv = [self.built] + argv[1:] + ["--threads", "1", "--ctx-size", "512"]
        hc = rt["HEALTHCHECK"]
        self.assertIn(" CMD ", " " + hc)
        check = [local(a) for a in exec_form(hc.split("CMD", 1)[1].strip())]
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
            try:
                ok, deadline = False, time.time() + 30
                while not ok and time.time() < deadline and proc.poll() is None:
                    ok = subprocess.run(check, timeout=10, stderr=subprocess.DEVNULL).returncode == 0
                    time.sleep(0.1)
                log.seek(0)
                self.assertTrue(ok, "HEALTHCHECK never passed:\n" + log.read().decode())
            finally:
                proc.terminate()
                proc.wait(30)
        # The same check fails once nothing listens: it can tell.
        self.assertNotEqual(subprocess.run(check, timeout=10, stderr=subprocess.DEVNULL).returncode, 0)

    def test_5_compose(self):
        try:
            import yaml
        except ImportError:
            self.skipTest("python3-yaml not installed")
        with open(os.path.join(ROOT, "docker", "compose.yaml")) as f:
            c = yaml.safe_load(f)
        kv, ngx = c["services"]["kvserve"], c["services"]["nginx"]
        base = os.path.join(ROOT, "docker")
        self.assertTrue(os.path.samefile(
            os.path.join(base, kv["build"]["context"], kv["build"]["dockerfile"]), DOCKERFILE))
        self.assertIn("replicas", kv["deploy"])
        def mount(v):  # "SRC:DST[:ro]" where SRC may hold ${VAR:-default}
            v = re.sub(r":(ro|rw)$", "", v)
            return tuple(v.rsplit(":", 1))
        self.assertIn("/models", [mount(v)[1] for v in kv["volumes"]])
        mounts = dict(mount(v) for v in ngx["volumes"])
        self.assertTrue(os.path.samefile(os.path.join(base, next(
            k for k, v in mounts.items() if v.startswith("/etc/nginx/"))), os.path.join(
                base, "nginx.conf")))
        self.assertEqual(ngx["depends_on"]["kvserve"]["condition"], "service_healthy")

    def test_6_kubernetes_manifests_in_deploy_md(self):
        try:
            import yaml
        except ImportError:
            self.skipTest("python3-yaml not installed")
        with open(os.path.join(ROOT, "docs", "DEPLOY.md")) as f:
            blocks = re.findall(r"```yaml\n(.*?)```", f.read(), flags=re.S)
        docs = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict)]
        kinds = {d.get("kind"): d for d in docs}
        dep, svc = kinds["Deployment"], kinds["Service"]
        pod = dep["spec"]["template"]["spec"]
        self.assertEqual(dep["spec"]["selector"]["matchLabels"], svc["spec"]["selector"])
        c = pod["containers"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["httpGet"]["path"], "/health", probe)
        self.assertEqual(str(c["resources"]["requests"]["cpu"]), "2")
        self.assertEqual(c["args"][c["args"].index("--threads") + 1], "2")
        self.assertTrue(c["args"][c["args"].index("-m") + 1].startswith("/models/"))
        self.assertIn(8080, [p["containerPort"] for p in c["ports"]])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        self.assertIn("/models", mounts.values())
        self.assertIn(next(k for k, v in mounts.items() if v == "/models"),
                      [v["name"] for v in pod["volumes"]])
        # The uid the manifest runs as is the one the image creates.
        useradd = [a for i, a in self.stages[1]["instrs"] if i == "RUN" and "useradd" in a][0]
        uid = int(re.search(r"--uid (\d+)", useradd).group(1))
        self.assertEqual(pod["securityContext"]["runAsUser"], uid)
        self.assertGreater(pod["terminationGracePeriodSeconds"], 30, "> --shutdown-timeout")


def main():
    if os.environ.get("KVS_SANITIZE", "none") not in ("", "none"):
        print("SKIP: sanitizer build (%s); the release build runs this test"
              % os.environ["KVS_SANITIZE"])
        return 77
    for tool in ("git", "dpkg-query", "ldd", "bash"):
        if not shutil.which(tool):
            print("SKIP: %s not found" % tool)
            return 77
    if subprocess.run(["git", "-C", ROOT, "rev-parse"], stderr=subprocess.DEVNULL).returncode:
        print("SKIP: %s is not a git checkout (the build copies the files git tracks)" % ROOT)
        return 77
    prog = unittest.main(exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
