#!/usr/bin/env bash
# A local base image for `bentoml containerize` where no image registry is reachable.
#
#   deploy/engine/base-image.sh [IMAGE]      (default bento-bundle/base:bookworm; reused if present)
#
# Debian bookworm from its own packages (debootstrap, through the package proxy like apt), the
# host's extra CA certificates trusted inside (uv and pip in the build fail "UnknownIssuer" without
# them), and what BentoML's generated Dockerfile expects of its base (see Dockerfile beside this).
set -euo pipefail

IMAGE=${1:-bento-bundle/base:bookworm}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOTFS=${ROOTFS:-build/engine/rootfs}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export PATH=/usr/bin:/usr/sbin:$PATH

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE present: reusing it"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "error: debootstrap missing: make engine" >&2; exit 1; }

raw="${IMAGE%%:*}-rootfs:${IMAGE#*:}"
if ! docker image inspect "$raw" >/dev/null 2>&1; then
  echo "[1/3] debootstrap bookworm into $ROOTFS (about 2 minutes) …"
  rm -rf "$ROOTFS" && mkdir -p "$ROOTFS"
  debootstrap --variant=minbase --include=python3,ca-certificates bookworm "$ROOTFS" "$MIRROR" \
    >build/engine/debootstrap.log 2>&1 || { tail -20 build/engine/debootstrap.log >&2; exit 1; }
  # The host's extra CAs (a TLS-inspecting proxy's, for instance), trusted inside the image too.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
  fi
  chroot "$ROOTFS" update-ca-certificates >/dev/null
  # apt inside the image goes where the host's apt goes (its proxy settings, if any).
  cp /etc/apt/apt.conf.d/*proxy* /etc/apt/apt.conf.d/99artifact-registry "$ROOTFS/etc/apt/apt.conf.d/" \
    2>/dev/null || true
  echo "[2/3] importing the root filesystem as $raw …"
  tar -C "$ROOTFS" -c . | docker import - "$raw" >/dev/null
  rm -rf "$ROOTFS"
fi
echo "[3/3] building $IMAGE …"
docker build -q --build-arg "ROOTFS_IMAGE=$raw" -t "$IMAGE" "$HERE" >/dev/null
echo "base image $IMAGE ready"
