#!/usr/bin/env bash
# Builds the real container image from docker/Dockerfile with podman, as
# ../shared/guide/CONTAINERS.md describes for these machines (no Docker engine, no registry):
# the `debian:12` base is made locally with debootstrap from Debian's mirror the first time
# (a few minutes), then `podman build` runs the Dockerfile unchanged.
#   tools/image.sh [TAG]     (default kvserve:latest; installs podman, runc and debootstrap)
# Run the image afterwards with the same runtime and limits, e.g.
#   podman --runtime /usr/sbin/runc run --rm --network host --ulimit nofile=1024:1024 \
#     --ulimit nproc=1024:1024 -v "$PWD/../shared/models:/models:ro" kvserve \
#     -m /models/stories260K.gguf --port 18080
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-kvserve:latest}
# shellcheck source=tools/lib.sh
. tools/lib.sh
kvs_apt_need image.sh podman runc debootstrap
# The machine forbids raising rlimits and mixes cgroup versions: runc, lower ulimits, and the
# host network (the build's apt-get needs Debian's mirror).
P=(podman --runtime /usr/sbin/runc)
L=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
if ! "${P[@]}" image exists docker.io/library/debian:12; then
    echo "image.sh: making the debian:12 base with debootstrap (minbase bookworm)" >&2
    ROOTFS=$(mktemp -d /tmp/kvs-debian12.XXXXXX)
    trap 'rm -rf "$ROOTFS"' EXIT
    debootstrap --variant=minbase bookworm "$ROOTFS" >"$ROOTFS.log" 2>&1 ||
        { tail -20 "$ROOTFS.log" >&2; exit 1; }
    tar -C "$ROOTFS" -c . | "${P[@]}" import - docker.io/library/debian:12 >/dev/null
    rm -rf "$ROOTFS" "$ROOTFS.log"
fi
echo "image.sh: podman build -f docker/Dockerfile -t $TAG" >&2
# --format docker: the OCI format has no HEALTHCHECK, which podman would then drop.
"${P[@]}" build --pull=never --network host --format docker "${L[@]}" -f docker/Dockerfile \
    -t "$TAG" . >&2
echo "$TAG"
