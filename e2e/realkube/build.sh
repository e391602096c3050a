#!/usr/bin/env bash
# Builds the real-server lane's Go binaries into ${CARGO_TARGET_DIR:-target}/realkube/bin/:
# kube-apiserver of the pinned release (go.mod; and kubectl with REALKUBE_ONLY=kubectl), etcd (cmd/etcd, on etcd's embed
# package), the client-go resolver consumer and the crash-loop driver. Nothing is downloaded but Go
# modules (GOPROXY as the machine has it); Go's build cache makes every build after the first take
# seconds.
#
# First build on a 2-core machine with an empty module and build cache (2026-12-04):
# about 3 min of module downloads (`go mod download`), then 9 min of compilation, nearly all of it
# kube-apiserver (522 s under `nice`, beside other builds); later builds take about 25 s.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
bin="$target/realkube/bin"
mkdir -p "$bin"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
# The module is its own toolchain's business: never fetch another Go.
export GOTOOLCHAIN=local
# kube-apiserver's version as its release build would stamp it (kubectl and clients read it).
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=32 \
 -X k8s.io/client-go/pkg/version.gitVersion=$version"
build() {
    local out=$1 pkg=$2
    echo "building $out ($pkg)" >&2
    nice go build -trimpath -ldflags "$ldflags" -o "$bin/$out" "$pkg"
}
# Only kubectl, for a machine that lacks one (.ci/prereqs).
if [[ ${REALKUBE_ONLY:-} == kubectl ]]; then
    build kubectl k8s.io/kubernetes/cmd/kubectl
    exit 0
fi
build etcd ./cmd/etcd
build kube-apiserver ./cmd/kube-apiserver
build resolver ./cmd/resolver
build crashloop ./cmd/crashloop
build linkerdcheck ./cmd/linkerdcheck
