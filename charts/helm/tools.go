//go:build tools

// Helm's command, built from its pinned module as it is (build.sh names it).
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
