#!/usr/bin/env bash
# Builds helm, of the version go.mod pins (helm.sh/helm/v4), into
# ${CARGO_TARGET_DIR:-target}/helm/bin/helm: what `make chart-check` lints and renders
# charts/floodgate with. Nothing is downloaded but Go modules (GOPROXY as the machine has it): no
# helm binary. Go's build cache makes every build after the first take seconds.
#
# First build on a 2-core machine with an empty module and build cache (2026-12-07): 17 s of
# module downloads (`go mod tidy`), then 7 min 10 s of compilation under `nice -n 15` with
# GOFLAGS=-p=1, beside a cargo build (5 min 16 s of user time).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
bin="$target/helm/bin"
mkdir -p "$bin"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
# The module is its own toolchain's business: never fetch another Go.
export GOTOOLCHAIN=local
# The version `helm version` prints, stamped as helm's own Makefile does; static, as its
# releases are.
version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
echo "building helm $version" >&2
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version"
CGO_ENABLED=0 nice -n 15 go build -trimpath -ldflags "$ldflags" -o "$bin/helm" \
    helm.sh/helm/v4/cmd/helm
