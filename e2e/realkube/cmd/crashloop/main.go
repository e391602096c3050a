// Command crashloop plays a remote cluster's controllers against a real API server that runs no
// controller-manager and no kubelet: what the ReplicaSet controller, the kubelet and the
// EndpointSlice controller would write. It creates an exported Service backed by --pods pods (their
// owner ReplicaSet created first), makes them Ready through pods/status, writes EndpointSlices of at
// most 100 endpoints (targetRef, conditions, the service's labels and kubernetes.io/service-name),
// then flips pods between Ready and CrashLoopBackOff at --rate writes a second, about --ready-share
// of them Ready at any moment, each slice following its pods. Beside it, --calm-services exported
// services of 3 pods roll one pod now and then, each roll's slice stamped with the time it was
// written (annotation e2e.floodgate.dev/changed-at-ms); with --calm-plan, the one calm service goes
// through the shapes a real cluster makes instead (plan.go). It prints one JSON line when the
// objects exist ("phase":"ready"), one a second while it churns, and one when it is done (with
// every roll's stamp, "calmStamps", and with a plan each step's, "calmSteps").
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type options struct {
	floodNS, floodService string
	pods                  int
	rate                  float64
	readyShare            float64
	duration              time.Duration
	calmNS                string
	calmServices          int
	calmRollEvery         time.Duration
	calmPlan              []planStep
	workers               int
}

func main() {
	var o options
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server to write to (required)")
	flag.StringVar(&o.floodNS, "namespace", "flood", "namespace of the flooding service")
	flag.StringVar(&o.floodService, "service", "flood", "name of the flooding service")
	flag.IntVar(&o.pods, "pods", 0, "pods behind the flooding service (0: no flooding service)")
	flag.Float64Var(&o.rate, "rate", 200, "writes a second while pods flip (a pod's status and its slice are two)")
	flag.Float64Var(&o.readyShare, "ready-share", 2.0/3.0, "share of the flooding pods Ready at any moment")
	flag.DurationVar(&o.duration, "duration", 0, "how long pods flip and calm services roll (0: create, then exit)")
	flag.StringVar(&o.calmNS, "calm-namespace", "calm", "namespace of the calm services")
	flag.IntVar(&o.calmServices, "calm-services", 3, "exported services of 3 pods that roll now and then")
	flag.DurationVar(&o.calmRollEvery, "calm-roll-every", 5*time.Second, "how often one calm service replaces a pod")
	plan := flag.String("calm-plan", "", "instead of rolls, the one calm service's steps, one a --calm-roll-every: grow:N (a pod at a time up to N), burst:N, shrink:N, rollout (each pod replaced by one of a new ReplicaSet); e.g. grow:10,burst:200,shrink:5,rollout")
	flag.IntVar(&o.workers, "workers", 16, "concurrent writers")
	waitStdin := flag.Bool("wait-stdin", false, "after the objects exist, wait for a line on stdin before churning (so observers can sync first)")
	flag.Parse()
	var planErr error
	o.calmPlan, planErr = parsePlan(*plan)
	switch {
	case planErr != nil:
		fail("--calm-plan: %v", planErr)
	case len(o.calmPlan) > 0 && o.calmServices != 1:
		fail("--calm-plan drives one calm service: --calm-services is %d", o.calmServices)
	case *kubeconfig == "" || flag.NArg() != 0:
		fail("usage: crashloop --kubeconfig FILE [--pods N] [--rate W] [--duration D] ...")
	case o.pods < 0 || o.pods > 250*250:
		fail("--pods: %d is not in 0..62500", o.pods)
	case o.rate <= 0:
		fail("--rate must be positive")
	case o.readyShare < 0 || o.readyShare > 1:
		fail("--ready-share: %v is not in 0..1", o.readyShare)
	case o.calmServices < 0 || o.calmServices > 250:
		fail("--calm-services: %d is not in 0..250", o.calmServices)
	case o.duration < 0 || o.calmRollEvery <= 0 || o.workers < 1:
		fail("--duration, --calm-roll-every and --workers must be positive")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	cfg.QPS, cfg.Burst = 5000, 5000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail("client: %v", err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	d := &driver{client: client, o: o, out: json.NewEncoder(os.Stdout)}
	start := time.Now()
	if err := d.setup(ctx); err != nil {
		fail("setup: %v", err)
	}
	d.print(map[string]any{"phase": "ready", "setupMs": time.Since(start).Milliseconds(),
		"floodPods": o.pods, "calmServices": o.calmServices, "writes": d.writes.Load()})
	if o.duration == 0 {
		return
	}
	if *waitStdin {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fail("stdin closed before the go line: %v", err)
		}
	}
	ctx, stop := context.WithTimeout(ctx, o.duration)
	defer stop()
	if err := d.churn(ctx); err != nil {
		fail("churn: %v", err)
	}
	d.print(map[string]any{"phase": "done", "writes": d.writes.Load(), "flips": d.flips.Load(),
		"rolls": d.rolls.Load(), "errors": d.errors.Load(), "calmStamps": d.calmStamps(),
		"calmSteps": d.calmSteps()})
}

// driver is the remote cluster's controllers.
type driver struct {
	client kubernetes.Interface
	o      options
	out    *json.Encoder
	outMu  sync.Mutex
	flood  *service
	calm   []*service
	writes atomic.Uint64
	flips  atomic.Uint64
	rolls  atomic.Uint64
	errors atomic.Uint64
	// The stamp of every completed calm roll (wall-clock ms), in order, and with a plan each
	// step's shape beside it.
	stampsMu sync.Mutex
	stamps   []int64
	steps    []stepDone
}

func (d *driver) calmStamps() []int64 {
	d.stampsMu.Lock()
	defer d.stampsMu.Unlock()
	return append([]int64{}, d.stamps...)
}

func (d *driver) print(v any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	if err := d.out.Encode(v); err != nil {
		fail("stdout: %v", err)
	}
}

// setup creates the namespaces, services, ReplicaSets, pods (made Ready or crashing) and slices.
func (d *driver) setup(ctx context.Context) error {
	var svcs []*service
	if d.o.pods > 0 {
		d.flood = newService(d.o.floodNS, d.o.floodService, 1, d.o.pods)
		svcs = append(svcs, d.flood)
	}
	for i := range d.o.calmServices {
		s := newService(d.o.calmNS, fmt.Sprintf("calm-%d", i), 2, 3)
		d.calm = append(d.calm, s)
		svcs = append(svcs, s)
	}
	for _, s := range svcs {
		if err := d.createService(ctx, s); err != nil {
			return err
		}
	}
	// The flooding service starts with its ready share: a crash loop's pods pass readiness, are
	// named by slices, then crash.
	if d.flood != nil {
		for _, p := range d.flood.pods {
			p.ready = rand.Float64() < d.o.readyShare
		}
	}
	for _, s := range svcs {
		if err := d.createPods(ctx, s); err != nil {
			return err
		}
		if err := d.writeAllSlices(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// churn flips the flooding pods at the rate and rolls the calm services until ctx ends.
func (d *driver) churn(ctx context.Context) error {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(d.calm) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.rollCalm(ctx)
			// A plan's end is the run's.
			if len(d.o.calmPlan) > 0 {
				cancel()
			}
		}()
	}
	if d.flood != nil {
		// One writer per slice partition, so two writes of one slice never race; each queue
		// holds a few flips: the limiter, not the queue, sets the pace.
		queues := make([]chan int, d.o.workers)
		for w := range queues {
			queues[w] = make(chan int, 4)
			wg.Add(1)
			go func(q chan int) {
				defer wg.Done()
				// A flip begun is finished, the deadline notwithstanding: its slice follows its pod.
				for i := range q {
					d.flip(context.WithoutCancel(ctx), i)
				}
			}(queues[w])
		}
		// Each flip is two writes: the pod's status, then its slice.
		lim := rate.NewLimiter(rate.Limit(d.o.rate/2), d.o.workers)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
	loop:
		for {
			if err := lim.Wait(ctx); err != nil {
				break
			}
			i := d.flood.pick(d.o.readyShare)
			select {
			case queues[(i/sliceSize)%d.o.workers] <- i:
			case <-ctx.Done():
				break loop
			}
			select {
			case <-tick.C:
				d.print(map[string]any{"phase": "churn", "writes": d.writes.Load(),
					"flips": d.flips.Load(), "ready": d.flood.readyCount(), "errors": d.errors.Load()})
			default:
			}
		}
		for _, q := range queues {
			close(q)
		}
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// flip moves flooding pod i to the other state (a Ready pod crashes, a crashing one passes
// readiness), then rewrites its slice.
func (d *driver) flip(ctx context.Context, i int) {
	s := d.flood
	p := s.pods[i]
	s.mu.Lock()
	p.ready = !p.ready
	if !p.ready {
		p.restarts++
	}
	s.mu.Unlock()
	if err := d.writePodStatus(ctx, s, p); err != nil {
		d.failed(ctx, "pod status", err)
		return
	}
	if err := d.writeSlice(ctx, s, i/sliceSize); err != nil {
		d.failed(ctx, "slice", err)
		return
	}
	d.flips.Add(1)
}

// rollCalm replaces one pod of one calm service (round robin) every --calm-roll-every: the new pod
// is created and made Ready, the slice names it instead of the old one, the old pod is deleted.
// With --calm-plan, each tick is the plan's next step instead, and the plan's end ends the run.
func (d *driver) rollCalm(ctx context.Context) {
	tick := time.NewTicker(d.o.calmRollEvery)
	defer tick.Stop()
	plan := newPlanner(d.o.calmPlan)
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s := d.calm[n%len(d.calm)]
		shape, step := "roll", d.roll
		if plan != nil {
			var ok bool
			if shape, step, ok = plan.next(d, s); !ok {
				return
			}
		}
		// A step begun is finished: the deadline never leaves a slice naming a deleted pod.
		stamp, err := step(context.WithoutCancel(ctx), s)
		if err != nil {
			d.failed(ctx, "calm "+shape, err)
			continue
		}
		d.stampsMu.Lock()
		d.stamps = append(d.stamps, stamp)
		d.steps = append(d.steps, stepDone{Shape: shape, Stamp: stamp, Pods: s.size()})
		d.stampsMu.Unlock()
		d.rolls.Add(1)
	}
}

func (d *driver) failed(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	d.errors.Add(1)
	fmt.Fprintf(os.Stderr, "crashloop: %s: %v\n", what, err)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "crashloop: "+format+"\n", args...)
	os.Exit(2)
}
