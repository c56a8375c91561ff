#!/usr/bin/env bash
# Assembles the image of deploy/container/Containerfile with buildah from the binary built here
# (target/release/tollgate), without pulling a base image, then checks the image's configuration:
# user, entrypoint, command, exposed ports and labels, read from the Containerfile's last stage,
# and independently the values the Kubernetes manifests rely on. Fails loudly on any mismatch.
#
#   cargo build --release -p tollgate-server --locked
#   bash deploy/container/build-local.sh            # IMAGE=localhost/tollgate:dev by default
#
# The image is `FROM scratch` plus: the binary, the shared libraries `ldd` lists for it (glibc,
# libgcc_s...), /etc/passwd and /etc/group with the user 65532 (distroless's `nonroot`), the CA
# certificates, /tmp, and examples/limits.yaml as /etc/tollgate/limits.yaml: what the
# Containerfile's distroless image provides. Then the binary is run inside the image's root
# filesystem (`buildah run`, chroot isolation: not a container, no namespaces) as user 65532:
# `--version` and `check-config` of the shipped limits, which proves the libraries suffice.
#
# Needs: buildah (Debian: apt-get install -y buildah), python3. Tried as root with the vfs storage
# driver and chroot isolation (the defaults below); a rootless user would run it under
# `buildah unshare`. Environment: IMAGE, TOLLGATE_BIN, STORAGE_DRIVER, BUILDAH_ISOLATION,
# CONTAINERFILE, KEEP_IMAGE=1 (keep the image; by default it is removed after the checks).
set -euo pipefail

cd "$(dirname "$0")/../.."
CONTAINERFILE=${CONTAINERFILE:-deploy/container/Containerfile}
BIN=${TOLLGATE_BIN:-target/release/tollgate}
IMAGE=${IMAGE:-localhost/tollgate:dev}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}

fail() { echo "build-local: FAIL: $*" >&2; exit 1; }
command -v buildah >/dev/null || fail "buildah not found (Debian: apt-get install -y buildah)"
command -v python3 >/dev/null || fail "python3 not found"
[ -x "$BIN" ] || fail "$BIN not found: cargo build --release -p tollgate-server --locked"
file_type=$(od -An -c -N4 "$BIN" | tr -d ' ')
[ "$file_type" = '177ELF' ] || fail "$BIN is not an ELF binary"

buildah() { command buildah --storage-driver "$STORAGE_DRIVER" "$@"; }
work=$(mktemp -d)
ctr=""
smoke=""
serving=""
cleanup() {
  [ -n "$serving" ] && kill -TERM -- "-$serving" 2>/dev/null || true
  [ -n "$smoke" ] && buildah rm "$smoke" >/dev/null 2>&1 || true
  [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1 || true
  if [ "${KEEP_IMAGE:-0}" != 1 ]; then buildah rmi "$IMAGE" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The configuration the Containerfile's last stage sets, as JSON: user, entrypoint, cmd, ports,
# labels (LABEL's quoting and line continuations as the builder reads them).
python3 - "$CONTAINERFILE" >"$work/expected.json" <<'PY'
import json, shlex, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
stages, current = [], None
for line in text.splitlines():
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    word, _, rest = line.partition(" ")
    word = word.upper()
    if word == "FROM":
        current = []
        stages.append(current)
    elif current is not None:
        current.append((word, rest.strip()))
last = stages[-1]
want = {"user": None, "entrypoint": None, "cmd": None, "ports": [], "labels": {}}
for word, rest in last:
    if word == "USER":
        want["user"] = rest
    elif word == "ENTRYPOINT":
        want["entrypoint"] = json.loads(rest)
    elif word == "CMD":
        want["cmd"] = json.loads(rest)
    elif word == "EXPOSE":
        want["ports"] += [p if "/" in p else p + "/tcp" for p in rest.split()]
    elif word == "LABEL":
        for pair in shlex.split(rest):
            key, _, value = pair.partition("=")
            want["labels"][key] = value
missing = [k for k, v in want.items() if not v]
if missing:
    sys.exit(f"build-local: FAIL: the Containerfile's last stage sets no {missing}")
json.dump(want, sys.stdout)
PY
jq_py() { python3 -c "import json,sys; w=json.load(open('$work/expected.json')); $1"; }
echo "build-local: expected from $CONTAINERFILE: $(cat "$work/expected.json")"

# The root filesystem, from nothing.
root=$work/root
mkdir -p "$root/usr/local/bin" "$root/etc/tollgate" "$root/tmp" "$work/home"
chmod 1777 "$root/tmp"
install -m 0755 "$BIN" "$root/usr/local/bin/tollgate"
install -m 0644 examples/limits.yaml "$root/etc/tollgate/limits.yaml"
# Every library the dynamic loader resolves, at the path it is asked for (the loader itself
# included), its content copied through symlinks.
libs=$(ldd "$BIN" | awk '/=> \//{print $3} /^\s*\/[^ ]+ \(/{print $1}')
[ -n "$libs" ] || fail "ldd found no libraries for $BIN (a static binary needs none: drop this check)"
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi

ctr=$(buildah from scratch)
buildah copy "$ctr" "$root" / >/dev/null
buildah copy --chown 65532:65532 "$ctr" "$work/home" /home/nonroot >/dev/null
config=(--user "$(jq_py 'print(w["user"])')"
        --entrypoint "$(jq_py 'print(json.dumps(w["entrypoint"]))')"
        --cmd "$(jq_py 'print(json.dumps(w["cmd"]))')"
        --workingdir /
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)
while read -r port; do config+=(--port "$port"); done < <(jq_py 'print("\n".join(w["ports"]))')
while IFS= read -r label; do config+=(--label "$label"); done < <(jq_py 'print("\n".join(f"{k}={v}" for k, v in w["labels"].items()))')
buildah config "${config[@]}" "$ctr"
buildah commit --quiet "$ctr" "$IMAGE" >/dev/null
echo "build-local: committed $IMAGE"

# The image's configuration, against the Containerfile and against what the manifests need.
buildah inspect --type image "$IMAGE" >"$work/inspect.json"
python3 - "$work/inspect.json" "$work/expected.json" <<'PY'
import json, sys
inspect, want = (json.load(open(p)) for p in sys.argv[1:3])
config = inspect["OCIv1"]["config"]
got = {
    "user": config.get("User"),
    "entrypoint": config.get("Entrypoint"),
    "cmd": config.get("Cmd"),
    "ports": sorted(config.get("ExposedPorts", {})),
    "labels": {k: v for k, v in config.get("Labels", {}).items() if k.startswith("org.opencontainers.")},
}
errors = []
for key in want:
    expected = sorted(want[key]) if key == "ports" else want[key]
    if got[key] != expected:
        errors.append(f"{key}: the image has {got[key]!r}, the Containerfile says {expected!r}")
# What deploy/kubernetes and docs/deploy.md rely on, checked on their own (not read from the
# Containerfile, so that a Containerfile that drifted cannot pass with its image).
fixed = {
    "user": "65532:65532",
    "entrypoint": ["/usr/local/bin/tollgate"],
    "cmd": ["serve", "--limits", "/etc/tollgate/limits.yaml", "--grpc", "0.0.0.0:8081",
            "--http", "0.0.0.0:8080", "--admin", "0.0.0.0:9090"],
    "ports": ["8080/tcp", "8081/tcp", "9090/tcp"],
}
for key, expected in fixed.items():
    if got[key] != expected:
        errors.append(f"{key}: the image has {got[key]!r}, the manifests need {expected!r}")
labels = got["labels"]
for key in ["source", "title", "description", "licenses"]:
    if not labels.get(f"org.opencontainers.image.{key}"):
        errors.append(f"label org.opencontainers.image.{key} missing")
if labels.get("org.opencontainers.image.licenses") != "MIT OR Apache-2.0":
    errors.append(f"licenses label {labels.get('org.opencontainers.image.licenses')!r}, Cargo.toml says MIT OR Apache-2.0")
if inspect["OCIv1"].get("os") != "linux":
    errors.append(f"os {inspect['OCIv1'].get('os')!r}")
if errors:
    print("build-local: FAIL: image configuration:", *errors, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print("build-local: image config OK:", json.dumps(got, indent=None))
PY

# The binary runs from the image's own files, as 65532: its libraries are all there.
smoke=$(buildah from "$IMAGE")
uid=$(buildah run --user 65532:65532 "$smoke" -- /usr/local/bin/tollgate --version) ||
  fail "tollgate --version did not run inside the image"
echo "build-local: in the image, as 65532: $uid"
buildah run --user 65532:65532 "$smoke" -- /usr/local/bin/tollgate check-config /etc/tollgate/limits.yaml >"$work/check.txt" ||
  fail "check-config of the shipped limits failed inside the image: $(cat "$work/check.txt")"
echo "build-local: in the image, check-config /etc/tollgate/limits.yaml: OK ($(wc -l <"$work/check.txt") lines)"
# And serves: `serve` from the image's files as 65532 (chroot isolation shares the host's network,
# so on ports of the host), answering /status on its admin listener as the probes ask it.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
grpc=$(free_port) http=$(free_port) admin=$(free_port)
setsid buildah --storage-driver "$STORAGE_DRIVER" run --user 65532:65532 "$smoke" -- /usr/local/bin/tollgate serve \
  --limits /etc/tollgate/limits.yaml --grpc "127.0.0.1:$grpc" --http "127.0.0.1:$http" --admin "127.0.0.1:$admin" \
  >"$work/serve.log" 2>&1 </dev/null &
serving=$!
status=$(python3 - "$admin" <<'PY'
import sys, time, urllib.request
deadline = time.time() + 20
while True:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/status", timeout=2) as response:
            print(response.status, response.read().decode())
            break
    except OSError:
        if time.time() > deadline:
            print("no answer")
            break
        time.sleep(0.2)
PY
)
kill -TERM -- "-$serving" 2>/dev/null || true
wait "$serving" 2>/dev/null || true
serving=""
case "$status" in
  "200 "*'"status":"ok"'*) echo "build-local: in the image, as 65532: serve answers /status on the admin port: $status" ;;
  *) fail "serve inside the image did not answer /status ($status): $(tail -5 "$work/serve.log")" ;;
esac

size=$(buildah images --format '{{.Size}}' "$IMAGE" 2>/dev/null | head -1 || true)
echo "build-local: OK: $IMAGE${size:+ ($size)}"
