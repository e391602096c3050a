//go:build tools

// The upstream commands built from the pinned release as they are (build.sh names them).
package tools

import (
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
