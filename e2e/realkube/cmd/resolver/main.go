// Command resolver is a client-go consumer that resolves endpoints as Linkerd's destination
// controller does: shared informers, typed for Services, Endpoints, EndpointSlices and Pods and
// metadata-only for ReplicaSets, protobuf (as client-go's typed clients ask) or JSON, streaming
// lists on or off. Every --interval it prints one JSON line: whether its caches synced and how long
// that took, events by kind, watch errors, and the ready endpoints whose pod its pod cache lacks
// (an endpoint Linkerd's destination would drop), in total and per service; and, for every
// EndpointSlice change stamped with the writer's wall-clock time (annotation
// e2e.floodgate.dev/changed-at-ms), the stamp and the moment its handler first saw it.
//
// It also resolves at the event, as Linkerd's destination does: on each EndpointSlice add or
// update, each ready endpoint's pod is looked up in the pod cache at that moment, and a miss is an
// address lost until that slice's next event ("Unable to create new address"). Per service it
// reports the addresses lost at an event, the addresses held (resolved at each slice's last
// event), and the first moment each new address was held.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// report is the line printed every interval.
type report struct {
	// Seconds since start.
	T float64 `json:"t"`
	// Whether every informer has synced.
	Synced bool `json:"synced"`
	// Milliseconds from start to sync (0 until synced).
	SyncMs int64 `json:"syncMs"`
	// Handler calls (add, update, delete) by kind since start.
	Events map[string]uint64 `json:"events"`
	// Errors the reflectors' watches reported.
	WatchErrors uint64 `json:"watchErrors"`
	// Objects in each cache.
	Cached map[string]int `json:"cached"`
	// Ready endpoints (conditions.ready true or unset) in the EndpointSlice cache.
	ReadyEndpoints int `json:"readyEndpoints"`
	// Ready endpoints whose targetRef pod the pod cache lacks.
	ReadyWithoutPod int `json:"readyWithoutPod"`
	// That figure per service (namespace/name), services with none left out.
	ReadyWithoutPodByService map[string]int `json:"readyWithoutPodByService"`
	// Ready endpoints per service (namespace/name).
	ReadyByService map[string]int `json:"readyByService"`
	// Each stamped slice change seen: [stamp, seen], wall-clock ms, in the order seen.
	Stamped [][2]int64 `json:"stamped"`
	// Addresses lost at a slice event (a ready endpoint whose pod the pod cache lacked when its
	// slice's handler ran), per service (namespace/name); services with none left out.
	LostAtEventByService map[string]int `json:"lostAtEventByService"`
	// Addresses held, per service: the ready endpoints resolved at each slice's last event.
	HeldByService map[string]int `json:"heldByService"`
	// When each address (pod namespace/name) was first held, wall-clock ms, per service.
	HeldAt map[string]map[string]int64 `json:"heldAt"`
}

// stampAnnotation is the annotation the crash-loop driver stamps a calm roll's slices with.
const stampAnnotation = "e2e.floodgate.dev/changed-at-ms"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API to watch (required)")
	contentType := flag.String("content-type", "protobuf", "what the typed clients ask for: protobuf or json")
	streaming := flag.Bool("streaming", true, "streaming lists (client-go's WatchListClient feature)")
	interval := flag.Duration("interval", time.Second, "how often a report line is printed")
	duration := flag.Duration("duration", 0, "exit after this long (0: run until SIGTERM)")
	heldAt := flag.Bool("held-at", false, "report when each address was first held (heldAt; keep it off for floods)")
	flag.Parse()
	if *kubeconfig == "" || flag.NArg() != 0 || *interval <= 0 || *duration < 0 {
		fail("usage: resolver --kubeconfig FILE [--content-type protobuf|json] [--streaming=true|false] [--interval 1s] [--duration 0] [--held-at]")
	}
	// client-go 0.32 reads its feature gates from the environment on first use: set it before
	// any client exists.
	os.Setenv("KUBE_FEATURE_WatchListClient", fmt.Sprint(*streaming))

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	typed := *cfg
	switch *contentType {
	case "protobuf":
		typed.ContentType = "application/vnd.kubernetes.protobuf"
		typed.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	case "json":
		typed.ContentType = "application/json"
		typed.AcceptContentTypes = "application/json"
	default:
		fail("--content-type: %q is neither protobuf nor json", *contentType)
	}
	client, err := kubernetes.NewForConfig(&typed)
	if err != nil {
		fail("client: %v", err)
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		fail("metadata client: %v", err)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if *duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	r := newResolver()
	r.reportHeldAt = *heldAt
	factory := informers.NewSharedInformerFactory(client, 0)
	metaFactory := metadatainformer.NewSharedInformerFactory(meta, 0)
	svc := factory.Core().V1().Services().Informer()
	eps := factory.Core().V1().Endpoints().Informer()
	slices := factory.Discovery().V1().EndpointSlices().Informer()
	pods := factory.Core().V1().Pods().Informer()
	rs := metaFactory.ForResource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}).Informer()
	all := map[string]cache.SharedIndexInformer{
		"services": svc, "endpoints": eps, "endpointslices": slices, "pods": pods, "replicasets": rs,
	}
	for kind, inf := range all {
		if err := r.watch(kind, inf); err != nil {
			fail("informer %s: %v", kind, err)
		}
	}
	if err := r.watchStamps(slices); err != nil {
		fail("informer endpointslices: %v", err)
	}
	if err := r.resolveAtEvents(slices, pods.GetIndexer(), func() bool { return slices.HasSynced() && pods.HasSynced() }); err != nil {
		fail("informer endpointslices: %v", err)
	}

	start := time.Now()
	factory.Start(ctx.Done())
	metaFactory.Start(ctx.Done())
	go func() {
		synced := make([]cache.InformerSynced, 0, len(all))
		for _, inf := range all {
			synced = append(synced, inf.HasSynced)
		}
		if cache.WaitForCacheSync(ctx.Done(), synced...) {
			r.syncMs.Store(time.Since(start).Milliseconds())
		}
	}()

	out := json.NewEncoder(os.Stdout)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			out.Encode(r.report(start, all, slices.GetStore(), pods.GetIndexer()))
			if r.syncMs.Load() == 0 {
				os.Exit(1)
			}
			return
		case <-tick.C:
			if err := out.Encode(r.report(start, all, slices.GetStore(), pods.GetIndexer())); err != nil {
				fail("stdout: %v", err)
			}
		}
	}
}

// resolver holds the counters the informers' handlers feed.
type resolver struct {
	mu          sync.Mutex
	events      map[string]uint64
	watchErrors atomic.Uint64
	syncMs      atomic.Int64
	// The last stamp seen on each slice (namespace/name), and every new one with its arrival.
	stamps  map[string]string
	stamped [][2]int64
	// At the event: addresses lost by service; each slice's service and resolved pods; when each
	// (service, pod) was first held.
	lost         map[string]int
	held         map[string]sliceHeld
	heldAt       map[string]map[string]int64
	reportHeldAt bool
}

// sliceHeld is what a slice resolved at its last event.
type sliceHeld struct {
	service string
	pods    []string
}

func newResolver() *resolver {
	return &resolver{
		events: map[string]uint64{}, stamps: map[string]string{},
		lost: map[string]int{}, held: map[string]sliceHeld{}, heldAt: map[string]map[string]int64{},
	}
}

// resolveAtEvents resolves each slice's ready endpoints against the pod cache when its handler
// runs, as Linkerd's destination does (see the package's docs). Until both informers have
// synced a miss is not counted: both list at once at the start, direct as through a gateway,
// and Linkerd's destination resolves for a proxy only once its caches synced.
func (r *resolver) resolveAtEvents(slices cache.SharedIndexInformer, pods cache.Indexer, synced func() bool) error {
	resolve := func(obj any) {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		service := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		now := time.Now().UnixMilli()
		var held, lost []string
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
				continue
			}
			ns := ep.TargetRef.Namespace
			if ns == "" {
				ns = s.Namespace
			}
			pod := ns + "/" + ep.TargetRef.Name
			if _, found, _ := pods.GetByKey(pod); found {
				held = append(held, pod)
			} else {
				lost = append(lost, pod)
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.held[s.Namespace+"/"+s.Name] = sliceHeld{service: service, pods: held}
		if len(lost) > 0 && synced() {
			r.lost[service] += len(lost)
			fmt.Fprintf(os.Stderr, "%d lost at the event of %s/%s: %v\n", now, s.Namespace, s.Name, lost)
		}
		at := r.heldAt[service]
		if at == nil {
			at = map[string]int64{}
			r.heldAt[service] = at
		}
		for _, p := range held {
			if _, ok := at[p]; !ok {
				at[p] = now
			}
		}
	}
	_, err := slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    resolve,
		UpdateFunc: func(_, obj any) { resolve(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
				r.mu.Lock()
				delete(r.held, s.Namespace+"/"+s.Name)
				r.mu.Unlock()
			}
		},
	})
	return err
}

// watchStamps records the arrival of each new stamp on a slice.
func (r *resolver) watchStamps(slices cache.SharedIndexInformer) error {
	seen := func(obj any) {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		stamp, ok := s.Annotations[stampAnnotation]
		if !ok {
			return
		}
		at := time.Now().UnixMilli()
		key := s.Namespace + "/" + s.Name
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.stamps[key] == stamp {
			return
		}
		r.stamps[key] = stamp
		if ms, err := strconv.ParseInt(stamp, 10, 64); err == nil {
			r.stamped = append(r.stamped, [2]int64{ms, at})
		}
	}
	_, err := slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	})
	return err
}

// watch counts kind's events and its reflector's watch errors.
func (r *resolver) watch(kind string, inf cache.SharedIndexInformer) error {
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		r.watchErrors.Add(1)
		fmt.Fprintf(os.Stderr, "watch %s: %v\n", kind, err)
	}); err != nil {
		return err
	}
	count := func() {
		r.mu.Lock()
		r.events[kind]++
		r.mu.Unlock()
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { count() },
		UpdateFunc: func(_, _ any) { count() },
		DeleteFunc: func(any) { count() },
	})
	return err
}

// report resolves every cached slice's ready endpoints against the pod cache.
func (r *resolver) report(start time.Time, all map[string]cache.SharedIndexInformer, slices cache.Store, pods cache.Indexer) report {
	rep := report{
		T:                        time.Since(start).Seconds(),
		SyncMs:                   r.syncMs.Load(),
		WatchErrors:              r.watchErrors.Load(),
		Events:                   map[string]uint64{},
		Cached:                   map[string]int{},
		ReadyWithoutPodByService: map[string]int{},
		ReadyByService:           map[string]int{},
	}
	rep.Synced = rep.SyncMs > 0
	r.mu.Lock()
	for k, v := range r.events {
		rep.Events[k] = v
	}
	rep.Stamped = append([][2]int64{}, r.stamped...)
	rep.LostAtEventByService = map[string]int{}
	for k, v := range r.lost {
		rep.LostAtEventByService[k] = v
	}
	rep.HeldByService = map[string]int{}
	for _, h := range r.held {
		rep.HeldByService[h.service] += len(h.pods)
	}
	rep.HeldAt = map[string]map[string]int64{}
	for svc, at := range r.heldAt {
		if !r.reportHeldAt {
			break
		}
		rep.HeldAt[svc] = map[string]int64{}
		for p, t := range at {
			rep.HeldAt[svc][p] = t
		}
	}
	r.mu.Unlock()
	kinds := make([]string, 0, len(all))
	for k := range all {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		rep.Cached[k] = len(all[k].GetStore().ListKeys())
	}
	for _, obj := range slices.List() {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		service := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			rep.ReadyEndpoints++
			rep.ReadyByService[service]++
			if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
				continue
			}
			ns := ep.TargetRef.Namespace
			if ns == "" {
				ns = s.Namespace
			}
			if _, found, _ := pods.GetByKey(ns + "/" + ep.TargetRef.Name); !found {
				rep.ReadyWithoutPod++
				rep.ReadyWithoutPodByService[service]++
			}
		}
	}
	return rep
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "resolver: "+format+"\n", args...)
	os.Exit(2)
}
