#!/usr/bin/env sh
# Build the broker's container image from Debian packages and PyPI alone (no base image from a
# registry): debootstrap makes a Debian root filesystem, pip builds the broker's wheel, and
# buildah builds deploy/Containerfile on top of them.
#
# Usage: deploy/build-image.sh [--keep-rootfs FILE] [IMAGE]   (default localhost/queen-trio:latest)
# Needs root and Debian's debootstrap and buildah (apt-get install debootstrap buildah);
# DEBIAN_MIRROR (default http://deb.debian.org/debian) and DEBIAN_SUITE (default bookworm)
# choose where the packages come from; ROOTFS_TAR names a root filesystem tarball made by an
# earlier run (--keep-rootfs) to use instead of a new debootstrap. The Python packages are
# downloaded here, with this machine's pip settings, and installed in the image from those
# files alone: the build needs no network inside the image.
set -eu
cd "$(dirname "$0")/.."
KEEP_ROOTFS=""
if [ "${1:-}" = "--keep-rootfs" ]; then
    KEEP_ROOTFS="$2"
    shift 2
fi
IMAGE="${1:-localhost/queen-trio:latest}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${DEBIAN_SUITE:-bookworm}"
PYTHON="${PYTHON:-python3}"
for tool in debootstrap buildah; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "missing $tool; as root run: apt-get install debootstrap buildah" >&2
        exit 1
    fi
done
if [ "$(id -u)" -ne 0 ]; then
    echo "debootstrap needs root: run this as root" >&2
    exit 1
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/queen-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT INT TERM
if [ -n "${ROOTFS_TAR:-}" ]; then
    echo "== Debian root filesystem: $ROOTFS_TAR"
    cp "$ROOTFS_TAR" "$work/rootfs.tar"
else
    echo "== Debian root filesystem ($SUITE from $MIRROR)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,tini \
        "$SUITE" "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
        tail -20 "$work/debootstrap.log" >&2
        exit 1
    }
    tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
    rm -rf "$work/rootfs"
    if [ -n "$KEEP_ROOTFS" ]; then
        cp "$work/rootfs.tar" "$KEEP_ROOTFS"
    fi
fi
echo "== the broker's wheel and its dependencies"
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check -w "$work/wheels" '.[embedded]'
cp deploy/Containerfile "$work/Containerfile"
echo "== image $IMAGE"
# chroot isolation: the RUN step needs no OCI runtime, so the build also works where
# containers cannot be started; docker format keeps the HEALTHCHECK.
buildah bud --quiet --isolation chroot --format docker --layers=false -t "$IMAGE" \
    -f "$work/Containerfile" "$work"
echo "built $IMAGE"
