#!/usr/bin/env bash
# Build the server image with podman: docker/build.sh cpu|cuda [TAG]
#   BASE          the base image (default: localhost/worldrtc-base:bookworm, made by docker/make-base.sh
#                 when missing)
#   TORCH_SPEC    the torch requirement (default torch==2.13.0)
#   WHEELS_DIR    a directory of wheels to install from first (e.g. a CPU build of torch), mounted
#                 into the build; default for cpu: pip's find-links on this machine (PIP_FIND_LINKS or
#                 its config), if any
#   CA_BUNDLE     a CA bundle for pip inside the build (hosts behind a TLS-inspecting proxy);
#                 default: pip's cert on this machine (PIP_CERT or its config), if any
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kind="${1:?usage: docker/build.sh cpu|cuda [TAG]}"
case "$kind" in cpu|cuda) ;; *) echo "usage: docker/build.sh cpu|cuda [TAG]" >&2; exit 2 ;; esac
tag="${2:-localhost/worldrtc:$kind}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
base="${BASE:-localhost/worldrtc-base:bookworm}"
if [ "$base" = localhost/worldrtc-base:bookworm ] && ! podman image exists "$base"; then
  "$here/make-base.sh" "$base"
fi
args=(--format docker --network host -f "$here/Containerfile" --build-arg "BASE=$base"
      --build-arg "TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}" -t "$tag")
# pip's own find-links may hold a CPU build of torch: right for the CPU image only.
wheels="${WHEELS_DIR:-}"
if [ "$kind" = cpu ] && [ -z "$wheels" ]; then
  wheels="${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}"
fi
if [ -n "$wheels" ] && [ -d "$wheels" ]; then
  args+=(-v "$wheels:/wheels:ro" --build-arg "PIP_EXTRA_ARGS=--find-links /wheels")
fi
ca="${CA_BUNDLE:-${PIP_CERT:-$(pip config get global.cert 2>/dev/null || true)}}"
if [ -n "$ca" ] && [ -f "$ca" ]; then
  args+=(-v "$ca:/etc/ssl/host-ca.crt:ro" --build-arg "PIP_CERT=/etc/ssl/host-ca.crt")
fi
podman build "${args[@]}" "$here/.."
