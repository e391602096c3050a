// Command linkerdcheck makes the requests `linkerd multicluster check` makes of a remote cluster
// through a link's credentials, with client-go's typed clientset as Linkerd's CLI builds it:
// "remote cluster access credentials are valid" (the server's version, then a
// SelfSubjectAccessReview each for get, list and watch on services in every namespace) and
// "clusters share trust anchors" (the GET of the linkerd-config ConfigMap of the Link's
// targetClusterLinkerdNamespace). Beside them, the answers to two GETs the check does not make:
// another ConfigMap of that namespace, and linkerd-config in another namespace. It prints one
// JSON line with every answer, so a test can compare a remote reached directly with the same
// remote through Floodgate.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// answers is the line printed: each request's outcome.
type answers struct {
	Version string `json:"version"`
	// Whether get, list and watch on services were allowed, in that order.
	Allowed []bool `json:"allowed"`
	// The linkerd-config ConfigMap's values (the trust anchors are in there) and uid.
	Values string `json:"values"`
	UID    string `json:"uid"`
	// The HTTP status of the GET of another ConfigMap of the namespace, and of linkerd-config
	// in another namespace (200 when found).
	Other     int32 `json:"other"`
	Elsewhere int32 `json:"elsewhere"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the link's credentials (required)")
	namespace := flag.String("namespace", "linkerd", "the remote's Linkerd namespace (the Link's targetClusterLinkerdNamespace)")
	other := flag.String("other", "linkerd-identity-trust-roots", "another ConfigMap of that namespace to ask for")
	protobuf := flag.Bool("protobuf", false, "ask for protobuf, as client-go's typed clients may, instead of JSON")
	flag.Parse()
	if *kubeconfig == "" || flag.NArg() != 0 {
		fail("usage: linkerdcheck --kubeconfig FILE [--namespace NS] [--protobuf]")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	if *protobuf {
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail("client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var a answers
	version, err := client.Discovery().ServerVersion()
	if err != nil {
		fail("version: %v", err)
	}
	a.Version = version.GitVersion
	for _, verb := range []string{"get", "list", "watch"} {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: "services"},
		}}
		answer, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			fail("review of %s services: %v", verb, err)
		}
		a.Allowed = append(a.Allowed, answer.Status.Allowed)
	}
	config, err := client.CoreV1().ConfigMaps(*namespace).Get(ctx, "linkerd-config", metav1.GetOptions{})
	if err != nil {
		fail("linkerd-config: %v", err)
	}
	a.Values, a.UID = config.Data["values"], string(config.UID)
	a.Other = status(client.CoreV1().ConfigMaps(*namespace).Get(ctx, *other, metav1.GetOptions{}))
	a.Elsewhere = status(client.CoreV1().ConfigMaps("default").Get(ctx, "linkerd-config", metav1.GetOptions{}))
	if err := json.NewEncoder(os.Stdout).Encode(a); err != nil {
		fail("stdout: %v", err)
	}
}

// status is the HTTP status of a GET's answer: 200, or the API error's code.
func status(_ any, err error) int32 {
	if err == nil {
		return 200
	}
	if s, ok := err.(apierrors.APIStatus); ok {
		return s.Status().Code
	}
	fail("not an API error: %v", err)
	return 0
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "linkerdcheck: "+format+"\n", args...)
	os.Exit(2)
}
