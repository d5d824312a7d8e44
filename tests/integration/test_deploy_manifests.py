"""deploy/ as shipped: every file there must be accepted by the tool that
reads it, and must only name flags and environment variables that the
darkserve binary accepts, so the manifests cannot drift from the binary.

- yamllint (pinned in tests/requirements.txt, rules in .yamllint, --strict)
  over deploy/, CI workflows and .yamllint itself;
- kubernetes-validate (pinned) over every Kubernetes object in deploy/k8s/
  against the schemas of Kubernetes K8S_VERSION, which the package ships (no
  network), --strict (unknown fields fail); every object must be reported
  as validated (the tool only warns about a kind it has no schema for);
  kustomization.yaml must list exactly the manifests in the folder;
- how the pieces fit together: probes, grace periods against the drain
  timeout, selectors, names, the Redis address, resources;
- the compose files: `docker compose config` where docker has the compose
  plugin, and a structural check with PyYAML everywhere;
- `nginx -t` (Debian's nginx; scripts/deps.sh installs it) over
  deploy/nginx.conf and deploy/nginx.scaleout.conf, rendered with paths and
  host names a test can use, and the streaming directives of
  nginx-proxy.conf; its client_max_body_size must admit the largest state
  import the real server accepts (read from the 413 it answers);
- where each container spools large bodies (--upload-dir, as --print-config
  shows it with the definition's flags and environment) has room for
  --max-uploads of those largest imports: a volume with a size at least
  that, or one without a bound; never a read-only root file system;
- every DARKSERVE_* name anywhere in deploy/ and the Dockerfile, and every
  flag of the commands there, must be in `darkserve serve --help`; each
  process definition (compose services, the Deployment with its ConfigMap,
  the systemd unit, the image's CMD) is run through `darkserve serve
  --print-config` with its flags and environment, which checks the values.
"""
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

from ds_server import BIN, MODEL, ROOT, Server

DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
K8S_VERSION = "1.30.0"  # the Kubernetes whose API the manifests target
TOOL_S = 120


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def load(path):
    docs = load_all(path)
    assert len(docs) == 1, f"{path}: {len(docs)} documents"
    return docs[0]


def k8s_files():
    return sorted(os.path.join(K8S, f) for f in os.listdir(K8S)
                  if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml")


def k8s_objects():
    """-> {(kind, name): object} over every manifest of deploy/k8s/."""
    objs = {}
    for path in k8s_files():
        for d in load_all(path):
            key = (d["kind"], d["metadata"]["name"])
            assert key not in objs, f"{key} defined twice"
            objs[key] = d
    return objs


def run(cmd, **kw):
    kw.setdefault("timeout", TOOL_S)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def duration_s(v):
    """darkserve's duration syntax (seconds, or s/m/h/d) -> seconds."""
    m = re.fullmatch(r"(\d+)([smhd]?)", str(v))
    assert m, f"duration {v!r}"
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def nginx_size(v):
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", v)
    assert m, f"nginx size {v!r}"
    return int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]


# ---- yamllint ----------------------------------------------------------------

def yaml_targets():
    out = [DEPLOY, os.path.join(ROOT, ".yamllint")]
    wf = os.path.join(ROOT, ".github", "workflows")
    if os.path.isdir(wf):
        out.append(wf)
    return out


def test_yamllint():
    r = run([sys.executable, "-m", "yamllint", "--strict", "-f", "parsable",
             "-c", os.path.join(ROOT, ".yamllint")] + yaml_targets(), cwd=ROOT)
    assert r.returncode == 0, f"yamllint:\n{r.stdout}{r.stderr}"


# ---- Kubernetes ----------------------------------------------------------------

def test_kustomization_lists_every_manifest():
    k = load(os.path.join(K8S, "kustomization.yaml"))
    assert k["kind"] == "Kustomization"
    listed = sorted(os.path.join(K8S, r) for r in k["resources"])
    assert listed == k8s_files(), \
        "kustomization.yaml resources and the manifests in deploy/k8s/ differ"


def test_kubernetes_validate():
    files = k8s_files()
    r = run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", K8S_VERSION]
            + files, cwd=ROOT)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"kubernetes-validate:\n{out}"
    # a kind without a schema (a typo'd apiVersion) is only a warning there
    passed = set(re.findall(r"passed for resource (\S+)/(\S+) against", out))
    want = {(kind.lower(), name) for kind, name in k8s_objects()}
    assert passed == want, f"validated {sorted(passed)}, defined {sorted(want)}:\n{out}"


def container(objs, kind, name):
    spec = objs[(kind, name)]["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == name]
    return spec, c


def test_k8s_pieces_fit():
    objs = k8s_objects()
    dep = objs[("Deployment", "darkserve")]
    pod, c = container(objs, "Deployment", "darkserve")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # the HPA owns the replica count; rolling updates keep capacity
    assert "replicas" not in dep["spec"]
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0

    env_cms = [e["configMapRef"]["name"] for e in c.get("envFrom", [])]
    assert env_cms, "the Deployment takes its settings from a ConfigMap"
    env = {}
    for name in env_cms:
        env.update(objs[("ConfigMap", name)]["data"])

    # probes: /health on the named port; readiness drops a loading or
    # draining pod at once, liveness outlasts a drain
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        g = c[probe]["httpGet"]
        assert g["path"] == "/health" and g["port"] in ports, probe
    drain = duration_s(env["DARKSERVE_DRAIN_TIMEOUT"])
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > drain
    assert c["readinessProbe"]["failureThreshold"] == 1
    # SIGTERM comes after preStop; both fit in the grace period with a margin
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] >= int(pre[1]) + drain + 5

    # resources: the measured RSS (~150 MB idle, <= 400 MB with 16 streams)
    # fits the request; the state budget on top of it fits the limit
    res = c["resources"]
    mi = {"Mi": 1 << 20, "Gi": 1 << 30}

    def mem(v):
        return int(v[:-2]) * mi[v[-2:]]
    assert mem(res["requests"]["memory"]) >= 400 << 20
    budget = int(env["DARKSERVE_MAX_STATE_MEMORY"].rstrip("M")) << 20
    prefix = int(env.get("DARKSERVE_PREFIX_CACHE_MB", "256")) << 20
    assert mem(res["limits"]["memory"]) >= (150 << 20) + budget + prefix
    assert res["limits"]["cpu"] == res["requests"]["cpu"]
    threads = [e for e in c["env"] if e["name"] == "DARKSERVE_THREADS"]
    assert threads and threads[0]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"

    # sessions in Redis through its Service; the StatefulSet keeps its AOF
    m = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", env["DARKSERVE_SESSION_STORE"])
    assert m, env["DARKSERVE_SESSION_STORE"]
    svc = objs[("Service", m.group(1))]
    assert int(m.group(2)) in [p["port"] for p in svc["spec"]["ports"]]
    sts = objs[("StatefulSet", "redis")]
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert sts["spec"]["serviceName"] in {n for k, n in objs if k == "Service"}
    _, rc = container(objs, "StatefulSet", "redis")
    args = rc["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    claims = [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]]
    assert [v["name"] for v in rc["volumeMounts"] if v["mountPath"] == "/data"][0] in claims
    # no pod volume holds sessions any more
    assert not any("persistentVolumeClaim" in v for v in pod.get("volumes", []))

    # the Service, HPA and PDB point at these pods
    svc = objs[("Service", "darkserve")]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] in ports
    hpa = objs[("HorizontalPodAutoscaler", "darkserve")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"]) \
        == ("Deployment", "darkserve")
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    pdb = objs[("PodDisruptionBudget", "darkserve")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


# ---- compose ----------------------------------------------------------------

def docker_compose():
    """The docker compose command where it works here, else None."""
    if not shutil.which("docker"):
        return None
    try:
        r = run(["docker", "compose", "version"], timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ["docker", "compose"] if r.returncode == 0 else None


@pytest.mark.parametrize("name", ["compose.yaml", "compose.scaleout.yaml"])
def test_compose_config(name):
    path = os.path.join(DEPLOY, name)
    dc = docker_compose()
    if dc:
        r = run(dc + ["-f", path, "config", "--quiet"], cwd=DEPLOY)
        assert r.returncode == 0, f"docker compose config {name}:\n{r.stdout}{r.stderr}"
    c = load(path)
    assert c["name"] and c["services"]
    named = set(c.get("volumes") or {})
    for sname, s in c["services"].items():
        assert "image" in s or "build" in s, sname
        # compose.yaml's one darkserve has the image's HEALTHCHECK
        assert "healthcheck" in s or name == "compose.yaml", f"{name}: {sname}: no healthcheck"
        for v in s.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                assert os.path.exists(os.path.join(DEPLOY, src)), f"{name}: {sname}: {v}"
            else:
                assert src in named, f"{name}: {sname}: volume {src} not declared"
        for p in s.get("ports", []):
            assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+", p), f"{name}: {sname}: port {p}"
        for dep, cond in (s.get("depends_on") or {}).items():
            assert dep in c["services"], f"{name}: {sname} depends on {dep}"
            assert cond["condition"] in ("service_healthy", "service_started")
        env = s.get("environment") or {}
        assert isinstance(env, dict), f"{name}: {sname}: environment as a mapping"
        assert all(isinstance(v, str) for v in env.values()), \
            f"{name}: {sname}: environment values must be strings (quote numbers)"
        if sname.startswith("darkserve"):
            # SIGTERM drains for DARKSERVE_DRAIN_TIMEOUT (30 s by default)
            drain = duration_s(env.get("DARKSERVE_DRAIN_TIMEOUT", "30s"))
            assert duration_s(s["stop_grace_period"]) >= drain + 5, \
                f"{name}: {sname}: stop_grace_period shorter than a drain"


def test_compose_scaleout_shape():
    c = load(os.path.join(DEPLOY, "compose.scaleout.yaml"))
    sv = c["services"]
    assert set(sv) == {"redis", "darkserve-1", "darkserve-2", "nginx"}
    r = sv["redis"]["command"]
    assert r[r.index("--appendonly") + 1] == "yes"
    assert r[r.index("--maxmemory-policy") + 1] == "noeviction"
    assert any(v.endswith(":/data") for v in sv["redis"]["volumes"])
    replicas = [sv["darkserve-1"], sv["darkserve-2"]]
    for s in replicas:
        cmd = s["command"]
        assert cmd[cmd.index("--session-store") + 1] == "redis://redis:6379/0"
        assert "--session-dir" not in cmd
        assert s["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "ports" not in s, "replicas are reached through nginx only"
        assert s["environment"]["DARKSERVE_MAX_CONNECTIONS_PER_ADDRESS"] == "0"
    assert replicas[0]["image"] == replicas[1]["image"]
    n = sv["nginx"]
    assert {d: v["condition"] for d, v in n["depends_on"].items()} == \
        {"darkserve-1": "service_healthy", "darkserve-2": "service_healthy"}
    mounts = {v.split(":")[1]: v.split(":")[0] for v in n["volumes"]}
    assert mounts["/etc/nginx/nginx.conf"] == "./nginx.scaleout.conf"
    assert mounts["/etc/nginx/nginx-proxy.conf"] == "./nginx-proxy.conf"
    # nginx's upstream names the replicas, and it listens where compose publishes
    conf = open(os.path.join(DEPLOY, "nginx.scaleout.conf"), encoding="utf-8").read()
    assert set(re.findall(r"^\s*server\s+([\w-]+):8080\b", conf, re.M)) == \
        {"darkserve-1", "darkserve-2"}
    listen = re.search(r"^\s*listen\s+(\d+);", conf, re.M).group(1)
    assert [p.rsplit(":", 1)[1] for p in n["ports"]] == [listen]


# ---- nginx ----------------------------------------------------------------

def nginx_bin():
    for p in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    pytest.fail("nginx missing: scripts/deps.sh installs the Debian package nginx")


def render_nginx(src, tmp):
    """deploy's nginx config -> a copy nginx -t can check unprivileged: pid and
    logs in tmp, upstream host names that resolve, nginx-proxy.conf beside it."""
    text = open(os.path.join(DEPLOY, src), encoding="utf-8").read()
    text = re.sub(r"^(\s*pid\s+)\S+;", rf"\g<1>{tmp}/nginx.pid;", text, flags=re.M)
    text = re.sub(r"(_log\s+)/var/log/nginx/", rf"\g<1>{tmp}/", text)
    text = re.sub(r"^(\s*server\s+)darkserve-\d+(:\d+)", r"\g<1>127.0.0.1\2", text, flags=re.M)
    shutil.copy(os.path.join(DEPLOY, "nginx-proxy.conf"), tmp)
    out = os.path.join(tmp, "nginx.conf")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out


@pytest.mark.parametrize("src", ["nginx.conf", "nginx.scaleout.conf"])
def test_nginx_t(src, tmp_path):
    conf = render_nginx(src, str(tmp_path))
    r = run([nginx_bin(), "-t", "-q", "-e", "stderr", "-p", str(tmp_path), "-c", conf])
    assert r.returncode == 0, f"nginx -t {src}:\n{r.stdout}{r.stderr}"
    text = open(conf, encoding="utf-8").read()
    # the streaming settings reach the proxied location
    assert re.search(r"location / \{[^}]*proxy_pass http://darkserve;[^}]*"
                     r"include nginx-proxy\.conf;", text), src


def proxy_directives():
    d = {}
    with open(os.path.join(DEPLOY, "nginx-proxy.conf"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                assert line.endswith(";"), line
                k, _, v = line[:-1].partition(" ")
                d.setdefault(k, []).append(v.strip())
    return d


def test_nginx_proxy_streaming_settings():
    d = proxy_directives()
    for k in ("server", "upstream", "listen", "location", "http", "events"):
        assert k not in d, f"nginx-proxy.conf is for a location block: no {k}"
    assert d["proxy_http_version"] == ["1.1"]
    assert 'Connection ""' in d["proxy_set_header"]
    for k in ("proxy_buffering", "proxy_cache", "gzip", "proxy_ignore_client_abort"):
        assert d[k] == ["off"], k
    for k in ("proxy_read_timeout", "proxy_send_timeout"):
        assert duration_s(d[k][0]) >= 600, f"{k}: a quiet stream is cut after {d[k][0]}"


def state_import_limit(srv):
    """The body limit of PUT /v1/sessions/{id}/state, from the 413 a
    Content-Length past anything answers (no body is sent)."""
    st, sess, _ = srv.post("/v1/sessions", {})
    assert st == 201, sess
    with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as s:
        s.sendall((f"PUT /v1/sessions/{sess['id']}/state HTTP/1.1\r\nHost: x\r\n"
                   "Content-Type: application/octet-stream\r\n"
                   "Content-Length: 999999999999\r\n\r\n").encode())
        data = b""
        while b"}}" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert b" 413 " in data.split(b"\r\n", 1)[0], data
    m = re.search(rb"exceeds the limit of (\d+) bytes", data)
    assert m, data
    return int(m.group(1))


@pytest.fixture(scope="module")
def import_limit(tmp_path_factory):
    """The state import limit of the real model at the default configuration
    (DARKFormer, a directory store with its checkpoints; a Redis store takes
    the same bound)."""
    srv = Server(tmp_path_factory.mktemp("bound"), MODEL, attn=None, name="bound")
    try:
        return state_import_limit(srv)
    finally:
        srv.kill()


def test_nginx_body_size_fits_state_imports(import_limit):
    """The largest import the server accepts must pass nginx."""
    (size,) = proxy_directives()["client_max_body_size"]
    assert nginx_size(size) >= import_limit, \
        f"client_max_body_size {size} < the server's state import limit {import_limit}"


# ---- flags and environment against the binary ---------------------------------

def serve_options():
    """-> (flags, env names) that `darkserve serve` accepts, from its --help."""
    r = run([BIN, "serve", "--help"])
    assert r.returncode == 0, r.stderr
    flags, envs = set(), set()
    for line in r.stdout.splitlines():
        if line.startswith("  --"):
            flags.update(re.findall(r"(--[a-z0-9-]+)", line.split("[env")[0]))
            envs.update(re.findall(r"\[env (DARKSERVE_[A-Z0-9_]+)\]", line))
    assert len(flags) > 30 and len(envs) > 30, r.stdout
    return flags, envs


# The Redis session store's option, which deploy/ uses
# and which is being added to the binary at the same time as these files:
# while the binary has neither name, the checks below leave them out and
# end in xfail, so the rest is still checked; once the binary has them this
# has no effect (and can go).
PENDING = {"--session-store", "DARKSERVE_SESSION_STORE"}


def pending_missing(flags, envs):
    return PENDING - flags - envs if not PENDING & (flags | envs) else set()


def xfail_if(seen):
    if seen:
        pytest.xfail(f"the binary does not have {sorted(seen)} yet (the Redis session store)")


ENV_RE = re.compile(r"\bDARKSERVE_[A-Z0-9][A-Z0-9_]*\b")


def deploy_text_files():
    out = [os.path.join(ROOT, "Dockerfile")]
    for d, _, fs in os.walk(DEPLOY):
        out += [os.path.join(d, f) for f in fs]
    return sorted(out)


def test_every_env_name_in_deploy_is_the_binarys():
    """Every DARKSERVE_* name written in deploy/ or the Dockerfile, comments
    included (they tell people what to set), is one the server reads."""
    flags, envs = serve_options()
    missing = pending_missing(flags, envs)
    bad, seen = [], set()
    for path in deploy_text_files():
        text = open(path, encoding="utf-8").read()
        for n, line in enumerate(text.splitlines(), 1):
            for e in ENV_RE.findall(line):
                if e in missing:
                    seen.add(e)
                elif e not in envs:
                    bad.append(f"{os.path.relpath(path, ROOT)}:{n}: {e}")
    assert not bad, "names darkserve serve does not know:\n" + "\n".join(bad)
    xfail_if(seen)


def dockerfile_cmd():
    """The image's CMD (exec form) -> argv, ENV -> dict."""
    text = open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8").read()
    text = text.replace("\\\n", " ")
    cmd = None
    env = {}
    for line in text.splitlines():
        if line.startswith("CMD "):
            cmd = json.loads(line[4:])
        elif line.startswith("ENV "):
            env.update(dict(re.findall(r"(DARKSERVE_\w+)=(\S+)", line)))
    assert cmd and cmd[0] == "serve", cmd
    return cmd, env


def process_definitions():
    """-> [(where, argv after the binary, env)] for every way deploy/ runs
    the server."""
    out = []
    image_cmd, image_env = dockerfile_cmd()
    # the image's ENV defaults are build arguments; their values come later
    image_env = {k: v for k, v in image_env.items() if "$" not in v}
    out.append(("Dockerfile CMD", image_cmd, image_env))
    for name in ("compose.yaml", "compose.scaleout.yaml"):
        c = load(os.path.join(DEPLOY, name))
        for sname, s in c["services"].items():
            if s.get("image", "").startswith("darkserve") or "build" in s:
                cmd = s.get("command", image_cmd)
                if isinstance(cmd, str):
                    cmd = shlex.split(cmd)
                out.append((f"{name}: {sname}", cmd, dict(image_env, **s.get("environment", {}))))
    objs = k8s_objects()
    pod, c = container(objs, "Deployment", "darkserve")
    env = dict(image_env)
    for ref in c.get("envFrom", []):
        env.update(objs[("ConfigMap", ref["configMapRef"]["name"])]["data"])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            field = e["valueFrom"]["resourceFieldRef"]["resource"]  # e.g. limits.cpu
            kind, res = field.split(".")
            env[e["name"]] = str(c["resources"][kind][res])
    assert "command" not in c, "the image's ENTRYPOINT (darkserve) stays"
    out.append(("k8s Deployment", c.get("args", image_cmd), env))
    unit = open(os.path.join(DEPLOY, "darkserve.service"), encoding="utf-8").read()
    env = dict(re.findall(r"^Environment=(DARKSERVE_\w+)=(.*)$", unit, re.M))
    env = {k: v.replace("%S", "/var/lib") for k, v in env.items()}
    (start,) = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    out.append(("darkserve.service", shlex.split(start)[1:], env))
    return out


def test_flags_are_the_binarys():
    flags, envs = serve_options()
    missing = pending_missing(flags, envs)
    bad, seen = [], set()
    for where, argv, _ in process_definitions():
        assert argv[0] == "serve", where
        for a in argv[1:]:
            a = a.split("=")[0]
            if a in missing:
                seen.add(a)
            elif a.startswith("--") and a not in flags:
                bad.append(f"{where}: {a}")
    assert not bad, "flags darkserve serve does not know:\n" + "\n".join(bad)
    xfail_if(seen)


def print_config(argv, env, tmp_path):
    """`darkserve <argv> --print-config` with env and nothing else of
    DARKSERVE_*; a mounted API key file is replaced by one in tmp_path."""
    env = dict(env)
    if "DARKSERVE_API_KEY_FILE" in env:  # a mounted secret there: read at startup
        keys = tmp_path / "api_keys"
        keys.write_text("sk-test-key\n")
        env["DARKSERVE_API_KEY_FILE"] = str(keys)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DARKSERVE_")}
    return run([BIN] + list(argv) + ["--print-config"], env=dict(clean, **env))


def config_values(argv, env, tmp_path):
    """-> {option: value as --print-config shows it (quotes removed)}."""
    r = print_config(argv, env, tmp_path)
    assert r.returncode == 0, r.stderr
    vals = {}
    for m in re.finditer(r"^(\S+)\s+(.*?)\s+\(\w+\)$", r.stdout, re.M):
        vals[m.group(1)] = m.group(2).strip('"')
    return vals


@pytest.mark.parametrize("where,argv,env", process_definitions(),
                         ids=[p[0] for p in process_definitions()])
def test_settings_parse(where, argv, env, tmp_path):
    """The binary takes each definition's flags and environment as they are
    (values in range, sizes and durations well formed)."""
    env, argv = dict(env), list(argv)
    missing = pending_missing(*serve_options())
    seen = missing & (set(env) | set(argv))
    for name in seen:
        if name in argv:
            del argv[argv.index(name):argv.index(name) + 2]
        env.pop(name, None)
    r = print_config(argv, env, tmp_path)
    assert r.returncode == 0, f"{where}: {r.stderr}"
    shown = dict(re.findall(r"^(\S+)\s+.*\((\w+)\)$", r.stdout, re.M))
    for name in env:
        if name.startswith("DARKSERVE_"):
            opt = name[len("DARKSERVE_"):].lower().replace("_", "-")
            assert shown.get(opt) in ("env", "flag"), f"{where}: {name} not taken: {r.stdout}"
    xfail_if(seen)


# ---- room for spooled uploads ----------------------------------------------

DOCKER_TMPFS_DEFAULT = 64 << 20  # a tmpfs without size= (docker, podman): 65536k


def k8s_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    assert m, f"quantity {q!r}"
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}[m.group(2)]
    return int(m.group(1)) * mult


def tmpfs_size(opts):
    """A compose tmpfs entry's options ("size=480m,mode=1777") -> bytes."""
    for o in opts.split(","):
        if o.startswith("size="):
            m = re.fullmatch(r"(\d+)([kmg]?)", o[5:].lower())
            assert m, f"tmpfs {opts!r}"
            return int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)]
    return DOCKER_TMPFS_DEFAULT


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def compose_upload_room(s, path):
    """-> (bytes of room where a compose service writes path, None for a
    volume without a bound; 0 for none), what backs it."""
    mounts = []
    for v in s.get("volumes", []):
        parts = v.split(":")
        mounts.append((parts[1], None, f"volume {parts[0]}"))
    for t in s.get("tmpfs", []):
        target, _, opts = t.partition(":")
        mounts.append((target, tmpfs_size(opts), f"tmpfs {t}"))
    mounts = [m for m in mounts if under(path, m[0])]
    if not mounts:
        return (0, "a read-only root file system") if s.get("read_only") \
            else (None, "the container's writable layer")
    target, room, what = max(mounts, key=lambda m: len(m[0]))
    return room, what


def k8s_upload_room(pod, c, path):
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = [m for m in c.get("volumeMounts", []) if under(path, m["mountPath"])]
    if not mounts:
        ro = c.get("securityContext", {}).get("readOnlyRootFilesystem")
        return (0, "a read-only root file system") if ro \
            else (None, "the container's writable layer")
    m = max(mounts, key=lambda m: len(m["mountPath"]))
    assert not m.get("readOnly"), f"{path} is on a read-only mount"
    v = vols[m["name"]]
    if "emptyDir" in v:
        ed = v["emptyDir"] or {}
        if "sizeLimit" in ed:
            return k8s_bytes(ed["sizeLimit"]), f"emptyDir {m['name']} ({ed['sizeLimit']})"
        assert ed.get("medium") != "Memory", f"emptyDir {m['name']}: memory without a bound"
        return None, f"emptyDir {m['name']} (the node's disk)"
    return None, f"volume {m['name']}"


def container_definitions():
    """-> [(where, argv, env, room(path) -> (bytes or None, what))] for every
    container deploy/ defines (compose services, the Deployment)."""
    out = []
    defs = {w: (a, e) for w, a, e in process_definitions()}
    for name in ("compose.yaml", "compose.scaleout.yaml"):
        c = load(os.path.join(DEPLOY, name))
        for sname, s in c["services"].items():
            where = f"{name}: {sname}"
            if where in defs:
                out.append((where, *defs[where], lambda p, s=s: compose_upload_room(s, p)))
    pod, c = container(k8s_objects(), "Deployment", "darkserve")
    out.append(("k8s Deployment", *defs["k8s Deployment"],
                lambda p: k8s_upload_room(pod, c, p)))
    return out


@pytest.mark.parametrize("where,argv,env,room", container_definitions(),
                         ids=[d[0] for d in container_definitions()])
def test_upload_dir_has_room(where, argv, env, room, import_limit, tmp_path):
    """--max-uploads bodies of the largest import are spooled at once: the
    upload directory of every container must hold them (a tmpfs or emptyDir
    too small fails the import with 507, or gets the pod evicted)."""
    missing = pending_missing(*serve_options())
    argv = [a for a in argv if a not in missing]
    env = {k: v for k, v in env.items() if k not in missing}
    if "--session-store" in missing:
        i = [j for j, a in enumerate(argv) if a.startswith("redis://")]
        argv = [a for j, a in enumerate(argv) if j not in i]
    cfg = config_values(argv, env, tmp_path)
    # the import limit was measured at the default attention and checkpoints
    assert (cfg["features"], cfg["window"], cfg["checkpoints"]) == ("0", "-1", "8"), \
        f"{where}: measure the import limit with its --features/--window/--checkpoints"
    path = cfg["upload-dir"] or env.get("TMPDIR") or "/tmp"
    need = import_limit * int(cfg["max-uploads"])
    have, what = room(path)
    assert have is None or have >= need, \
        f"{where}: --upload-dir {path} is on {what}: {have} bytes, " \
        f"--max-uploads {cfg['max-uploads']} x the import limit {import_limit} = {need}"
