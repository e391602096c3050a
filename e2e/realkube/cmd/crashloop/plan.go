package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// planStep is one entry of --calm-plan: a shape and its target size (0 for a rollout).
type planStep struct {
	shape string
	to    int
}

// stepDone is one step carried out: its shape, the stamp its slices carry (wall-clock ms of the
// slice write) and the service's pods after it.
type stepDone struct {
	Shape string `json:"shape"`
	Stamp int64  `json:"stamp"`
	Pods  int    `json:"pods"`
}

// parsePlan reads "grow:10,burst:200,shrink:5,rollout" ("" is no plan).
func parsePlan(s string) ([]planStep, error) {
	if s == "" {
		return nil, nil
	}
	var plan []planStep
	for _, entry := range strings.Split(s, ",") {
		shape, arg, hasArg := strings.Cut(strings.TrimSpace(entry), ":")
		step := planStep{shape: shape}
		switch {
		case shape == "rollout" && !hasArg:
		case (shape == "grow" || shape == "burst" || shape == "shrink") && hasArg:
			n, err := strconv.Atoi(arg)
			if err != nil || n < 1 || n > 250*250 {
				return nil, fmt.Errorf("%q: the size must be in 1..62500", entry)
			}
			step.to = n
		default:
			return nil, fmt.Errorf("%q: not one of grow:N, burst:N, shrink:N, rollout", entry)
		}
		plan = append(plan, step)
	}
	return plan, nil
}

// planner walks a plan: a grow and a rollout take a tick a pod, a burst and a shrink one tick.
type planner struct {
	plan []planStep
	// The rollout under way: its new ReplicaSet and how many pods it has replaced.
	rolloutRS *appsv1.ReplicaSet
	replaced  int
}

func newPlanner(plan []planStep) *planner {
	if len(plan) == 0 {
		return nil
	}
	return &planner{plan: plan}
}

// next returns the next step for s, or false once the plan is done.
func (p *planner) next(d *driver, s *service) (string, func(context.Context, *service) (int64, error), bool) {
	for len(p.plan) > 0 {
		step := p.plan[0]
		size := s.size()
		switch {
		case step.shape == "grow" && size < step.to:
			return "grow", d.grow, true
		case step.shape == "burst" && size < step.to:
			p.plan = p.plan[1:]
			return "burst", func(ctx context.Context, s *service) (int64, error) { return d.burst(ctx, s, step.to) }, true
		case step.shape == "shrink" && size > step.to:
			p.plan = p.plan[1:]
			return "shrink", func(ctx context.Context, s *service) (int64, error) { return d.shrink(ctx, s, step.to) }, true
		case step.shape == "rollout" && p.replaced < size:
			return "rollout", p.rollout(d), true
		}
		p.plan = p.plan[1:]
		p.rolloutRS, p.replaced = nil, 0
	}
	return "", nil, false
}

// rollout replaces s's oldest pod of the old ReplicaSet by one of a new ReplicaSet (created at the
// rollout's first step), as a Deployment's rolling update does: the new pod written Ready, the
// slice naming it in place of the old one, the old pod deleted.
func (p *planner) rollout(d *driver) func(context.Context, *service) (int64, error) {
	return func(ctx context.Context, s *service) (int64, error) {
		if p.rolloutRS == nil {
			rs, err := d.createReplicaSet(ctx, s, fmt.Sprintf("%s-rs-%d", s.name, time.Now().UnixMilli()))
			if err != nil {
				return 0, err
			}
			p.rolloutRS = rs
		}
		stamp, err := d.replace(ctx, s, p.rolloutRS)
		if err == nil {
			p.replaced++
		}
		return stamp, err
	}
}

// burst scales s up to n at once: every new pod written Ready, then the slices naming them.
func (d *driver) burst(ctx context.Context, s *service, n int) (int64, error) {
	s.mu.Lock()
	var fresh []*pod
	for len(s.pods)+len(fresh) < n {
		fresh = append(fresh, s.newPod())
	}
	s.mu.Unlock()
	if err := d.parallel(ctx, len(fresh), func(i int) error { return d.createPod(ctx, s, fresh[i]) }); err != nil {
		return 0, err
	}
	stamp := time.Now().UnixMilli()
	s.mu.Lock()
	s.pods = append(s.pods, fresh...)
	s.stampMs = stamp
	s.mu.Unlock()
	return stamp, d.writeAllSlices(ctx, s)
}

// shrink scales s down to n as the controllers do: the slices drop the endpoints first, then the
// pods are deleted. A slice left with no endpoint stays, empty, as the EndpointSlice controller
// keeps one.
func (d *driver) shrink(ctx context.Context, s *service, n int) (int64, error) {
	stamp := time.Now().UnixMilli()
	s.mu.Lock()
	before := (len(s.pods) + sliceSize - 1) / sliceSize
	gone := append([]*pod{}, s.pods[n:]...)
	s.pods = s.pods[:n]
	s.stampMs = stamp
	s.mu.Unlock()
	if err := d.parallel(ctx, before, func(i int) error { return d.writeSlice(ctx, s, i) }); err != nil {
		return 0, err
	}
	err := d.parallel(ctx, len(gone), func(i int) error { return d.deletePod(ctx, s, gone[i]) })
	return stamp, err
}

// replace puts a new pod of rs in place of s's oldest: written Ready, named by the slice in the old
// one's place, then the old one deleted. The slice's stamp is returned.
func (d *driver) replace(ctx context.Context, s *service, rs *appsv1.ReplicaSet) (int64, error) {
	s.mu.Lock()
	fresh := s.newPod()
	fresh.rs = rs
	s.mu.Unlock()
	if err := d.createPod(ctx, s, fresh); err != nil {
		return 0, err
	}
	stamp := time.Now().UnixMilli()
	s.mu.Lock()
	old := s.pods[0]
	s.pods = append(s.pods[1:], fresh)
	s.stampMs = stamp
	s.mu.Unlock()
	if err := d.writeAllSlices(ctx, s); err != nil {
		return 0, err
	}
	return stamp, d.deletePod(ctx, s, old)
}

// deletePod deletes p (gone already is no error).
func (d *driver) deletePod(ctx context.Context, s *service, p *pod) error {
	err := d.client.CoreV1().Pods(s.ns).Delete(ctx, p.name, metav1.DeleteOptions{})
	d.writes.Add(1)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("pod %s/%s: %w", s.ns, p.name, err)
	}
	return nil
}

func (d *driver) calmSteps() []stepDone {
	d.stampsMu.Lock()
	defer d.stampsMu.Unlock()
	return append([]stepDone{}, d.steps...)
}
