package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// sliceSize is the EndpointSlice controller's default maximum of endpoints a slice.
const sliceSize = 100

// exported is the label Linkerd's service mirror selects services by.
var exported = map[string]string{"mirror.linkerd.io/exported": "true"}

// stampAnnotation holds, on a calm service's slices, the wall-clock time in ms of the roll that
// last rewrote them, so an observer can tell how long the change took to reach it (kube-sim's
// scenarios stamp their calm changes with the same annotation).
const stampAnnotation = "e2e.floodgate.dev/changed-at-ms"

// service is one service with its pods, as the remote's controllers would keep it.
type service struct {
	ns, name string
	// The second octet of its pods' addresses (10.<net>.x.y).
	net      int
	mu       sync.Mutex
	uid      types.UID
	rs       *appsv1.ReplicaSet
	pods     []*pod
	nextName int
	// The stamp its slices carry (0: none yet).
	stampMs int64
}

type pod struct {
	name     string
	uid      types.UID
	ip       string
	ready    bool
	restarts int32
	// Its owner when not its service's first ReplicaSet (a rollout's new one).
	rs *appsv1.ReplicaSet
}

func newService(ns, name string, net, pods int) *service {
	s := &service{ns: ns, name: name, net: net}
	for range pods {
		s.pods = append(s.pods, s.newPod())
	}
	return s
}

func (s *service) newPod() *pod {
	i := s.nextName
	s.nextName++
	return &pod{name: fmt.Sprintf("%s-%05d", s.name, i), ip: fmt.Sprintf("10.%d.%d.%d", s.net, i/250%250, i%250+1), ready: true}
}

func (s *service) readyCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.pods {
		if p.ready {
			n++
		}
	}
	return n
}

// pick chooses a pod whose flip moves the ready share toward share: a Ready one while more
// than share are Ready, else a crashing one. Every flip is then a change, never a no-op write
// (which a real API server drops: no new resourceVersion, no event).
func (s *service) pick(share float64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ready := 0
	for _, p := range s.pods {
		if p.ready {
			ready++
		}
	}
	crash := float64(ready) > share*float64(len(s.pods))
	if (crash && ready == 0) || (!crash && ready == len(s.pods)) {
		return rand.IntN(len(s.pods))
	}
	for {
		i := rand.IntN(len(s.pods))
		if s.pods[i].ready == crash {
			return i
		}
	}
}

func (s *service) selector() map[string]string {
	return map[string]string{"app": s.name}
}

// createService creates the namespace (when missing), the exported Service and the ReplicaSet its
// pods name as their owner (inert: no controller-manager acts on it).
func (d *driver) createService(ctx context.Context, s *service) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}
	if _, err := d.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", s.ns, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.ns, Labels: exported},
		Spec: corev1.ServiceSpec{
			Selector: s.selector(),
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	created, err := d.client.CoreV1().Services(s.ns).Create(ctx, svc, metav1.CreateOptions{})
	d.writes.Add(1)
	if err != nil {
		return fmt.Errorf("service %s/%s: %w", s.ns, s.name, err)
	}
	s.uid = created.UID
	s.rs, err = d.createReplicaSet(ctx, s, s.name+"-rs")
	return err
}

// createReplicaSet creates ReplicaSet name of s's pods (inert: no controller-manager acts on it).
func (d *driver) createReplicaSet(ctx context.Context, s *service, name string) (*appsv1.ReplicaSet, error) {
	replicas := int32(s.size())
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns, Labels: s.selector()},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: s.selector()},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: s.selector()},
				Spec:       podSpec(),
			},
		},
	}
	created, err := d.client.AppsV1().ReplicaSets(s.ns).Create(ctx, rs, metav1.CreateOptions{})
	d.writes.Add(1)
	if err != nil {
		return nil, fmt.Errorf("replicaset %s/%s: %w", s.ns, name, err)
	}
	return created, nil
}

func podSpec() corev1.PodSpec {
	return corev1.PodSpec{Containers: []corev1.Container{{
		Name:  "app",
		Image: "registry.invalid/app:1",
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
	}}}
}

// createPods creates s's pods and writes each one's status, d.o.workers at a time.
func (d *driver) createPods(ctx context.Context, s *service) error {
	return d.parallel(ctx, len(s.pods), func(i int) error {
		return d.createPod(ctx, s, s.pods[i])
	})
}

func (d *driver) createPod(ctx context.Context, s *service, p *pod) error {
	controller := true
	rs := s.rs
	if p.rs != nil {
		rs = p.rs
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.name, Namespace: s.ns, Labels: s.selector(),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: &controller,
			}},
		},
		Spec: podSpec(),
	}
	obj.Spec.NodeName = "node-1"
	created, err := d.client.CoreV1().Pods(s.ns).Create(ctx, obj, metav1.CreateOptions{})
	d.writes.Add(1)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", s.ns, p.name, err)
	}
	s.mu.Lock()
	p.uid = created.UID
	s.mu.Unlock()
	return d.writePodStatus(ctx, s, p)
}

// writePodStatus writes what the kubelet would report for p: Running and Ready, or its container
// waiting in CrashLoopBackOff. A merge patch replaces the lists whole, so no version is needed.
func (d *driver) writePodStatus(ctx context.Context, s *service, p *pod) error {
	s.mu.Lock()
	ready, restarts := p.ready, p.restarts
	s.mu.Unlock()
	now := metav1.Now()
	cond := corev1.ConditionFalse
	reason := "ContainersNotReady"
	cs := corev1.ContainerStatus{Name: "app", Image: "registry.invalid/app:1", RestartCount: restarts}
	if ready {
		cond, reason = corev1.ConditionTrue, ""
		started := true
		cs.Ready, cs.Started = true, &started
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
	} else {
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off restarting failed container"}
		cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: now}
	}
	status := corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  p.ip,
		PodIPs: []corev1.PodIP{{IP: p.ip}},
		HostIP: "192.0.2.1",
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: cond, Reason: reason, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: cond, Reason: reason, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{cs},
		StartTime:         &now,
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = d.client.CoreV1().Pods(s.ns).Patch(ctx, p.name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	d.writes.Add(1)
	if err != nil {
		return fmt.Errorf("pod %s/%s status: %w", s.ns, p.name, err)
	}
	return nil
}

// writeAllSlices writes every slice of s (created or replaced).
func (d *driver) writeAllSlices(ctx context.Context, s *service) error {
	n := (len(s.pods) + sliceSize - 1) / sliceSize
	return d.parallel(ctx, n, func(i int) error { return d.writeSlice(ctx, s, i) })
}

// writeSlice writes slice i of s, pods [100i, 100i+100), as the EndpointSlice controller would:
// created the first time, replaced whole by a merge patch after.
func (d *driver) writeSlice(ctx context.Context, s *service, i int) error {
	slice := d.slice(s, i)
	api := d.client.DiscoveryV1().EndpointSlices(s.ns)
	_, err := api.Create(ctx, slice, metav1.CreateOptions{})
	d.writes.Add(1)
	if apierrors.IsAlreadyExists(err) {
		meta := map[string]any{"labels": slice.Labels}
		if slice.Annotations != nil {
			meta["annotations"] = slice.Annotations
		}
		body, merr := json.Marshal(map[string]any{"endpoints": slice.Endpoints, "metadata": meta})
		if merr != nil {
			return merr
		}
		_, err = api.Patch(ctx, slice.Name, types.MergePatchType, body, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("slice %s/%s: %w", s.ns, slice.Name, err)
	}
	return nil
}

func (d *driver) slice(s *service, i int) *discoveryv1.EndpointSlice {
	labels := map[string]string{
		discoveryv1.LabelServiceName: s.name,
		discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
	}
	for k, v := range exported {
		labels[k] = v
	}
	name, proto, port := "http", corev1.ProtocolTCP, int32(8080)
	controller := true
	s.mu.Lock()
	defer s.mu.Unlock()
	var annotations map[string]string
	if s.stampMs != 0 {
		annotations = map[string]string{stampAnnotation: strconv.FormatInt(s.stampMs, 10)}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%03d", s.name, i), Namespace: s.ns, Labels: labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: s.name, UID: s.uid, Controller: &controller}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	// After a scale-down a slice may name none of the pods left: it stays, empty.
	start, end := min(i*sliceSize, len(s.pods)), min((i+1)*sliceSize, len(s.pods))
	for _, p := range s.pods[start:end] {
		ready, serving, terminating := p.ready, p.ready, false
		node := "node-1"
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: s.ns, Name: p.name, UID: p.uid},
		})
	}
	return slice
}

// roll replaces s's oldest pod by a new one of the same ReplicaSet (see replace): the slice is
// stamped with the time of its write, which roll returns.
func (d *driver) roll(ctx context.Context, s *service) (int64, error) {
	return d.replace(ctx, s, nil)
}

// grow adds a pod to s as a scale-up does: the pod is created and made Ready, then the slice names
// it too (the order the ReplicaSet controller, the kubelet and the EndpointSlice controller keep).
// The slice is stamped with the time of its write, which grow returns.
func (d *driver) grow(ctx context.Context, s *service) (int64, error) {
	s.mu.Lock()
	fresh := s.newPod()
	s.mu.Unlock()
	if err := d.createPod(ctx, s, fresh); err != nil {
		return 0, err
	}
	stamp := time.Now().UnixMilli()
	s.mu.Lock()
	s.pods = append(s.pods, fresh)
	s.stampMs = stamp
	s.mu.Unlock()
	return stamp, d.writeAllSlices(ctx, s)
}

func (s *service) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pods)
}

// parallel runs f(0..n) on d.o.workers goroutines; the first error wins.
func (d *driver) parallel(ctx context.Context, n int, f func(int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range d.o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
