// Command kube-apiserver is the upstream API server of the pinned release, built from its Go
// module: the tests run the real thing, not a model of it.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
