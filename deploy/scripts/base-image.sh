#!/usr/bin/env bash
# A local stand-in for the official node:20 image, for machines that reach no
# container registry: Debian bookworm from Debian's packages (mmdebstrap) with
# this machine's Node.js 20 and pnpm binaries copied in, imported into podman as
# $TRELLIS_BASE_IMAGE (default localhost/trellis-base:bookworm-node20).
# Built once and cached: the tarball under $TRELLIS_CACHE_DIR (default
# /var/tmp/trellis-deploy), the image in podman's storage. Elsewhere, build the
# Dockerfile with its default base (node:20-bookworm-slim) instead.
set -euo pipefail
image=${TRELLIS_BASE_IMAGE:-localhost/trellis-base:bookworm-node20}
cache=${TRELLIS_CACHE_DIR:-/var/tmp/trellis-deploy}
tar="$cache/base-bookworm-node20.tar"
if podman image exists "$image"; then echo "base image $image: cached"; exit 0; fi
mkdir -p "$cache"
if [ ! -s "$tar" ]; then
  node=$(readlink -f "$(command -v node)"); pnpm=$(readlink -f "$(command -v pnpm)")
  node -e 'const [a,b]=process.versions.node.split(".").map(Number);if(a!==20||b<19)process.exit(1)' ||
    { echo "need Node.js 20.19+ on this machine, have $(node --version)" >&2; exit 1; }
  echo "mmdebstrap bookworm -> $tar (node $(node --version), pnpm $(pnpm --version))"
  start=$(date +%s)
  mmdebstrap --quiet --variant=apt --format=tar --include=ca-certificates \
    --customize-hook="copy-in $node /usr/local/bin" \
    --customize-hook="copy-in $pnpm /usr/local/bin" \
    --customize-hook='chroot "$1" sh -c "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin"' \
    bookworm "$tar.part"
  mv "$tar.part" "$tar"
  echo "mmdebstrap: $(( $(date +%s) - start )) s"
fi
podman import --change 'CMD ["node"]' --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$tar" "$image" >/dev/null
echo "base image $image: imported from $tar"
