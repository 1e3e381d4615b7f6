#!/usr/bin/env bash
# Build the images' base locally from Debian's packages (debootstrap, minbase bookworm) and import it
# into podman as localhost/worldrtc-base:bookworm, for machines that reach package mirrors but no
# image registry. Needs root, debootstrap and podman. Elsewhere any Debian bookworm (or Ubuntu) image
# serves: pass it as the images' BASE build argument.
#   usage: docker/make-base.sh [IMAGE_NAME]
set -euo pipefail
name="${1:-localhost/worldrtc-base:bookworm}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "$0")" && pwd)/containers.conf}"
# The mirror this machine's apt already uses.
mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
if [ -z "$mirror" ]; then
  mirror="$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)"
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm from $mirror into $root …" >&2
debootstrap --variant=minbase bookworm "$root" "$mirror" >&2
# Later apt-get calls in image builds fetch from the same mirror.
printf 'deb %s bookworm main\n' "$mirror" > "$root/etc/apt/sources.list"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | podman import - "$name" >&2
echo "$name"
