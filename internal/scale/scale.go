// Package scale writes many Services with their EndpointSlices to a real
// kube-apiserver, fast, for the Service benchmarks: N ClusterIP
// Services × M endpoints each. The endpoints are addresses in 100.64.0.0/10
// (shared address space, never routed in the lab) written straight into
// EndpointSlices: there are no pods, no kubelets and no kwok behind them, and
// none are needed, because kube-proxy and the axon agent only read Services
// and EndpointSlices.
//
// Every object carries the label ManagedByLabel=ManagedBy so Delete finds
// exactly what Apply created, also after a crash.
package scale

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

const (
	// ManagedByLabel marks every object this package creates (value ManagedBy).
	ManagedByLabel = "axon.io/bench"
	ManagedBy      = "svc-scale"
	// ServicePort is the port of every generated Service; TargetPort the
	// endpoints' port.
	ServicePort = 80
	TargetPort  = 8080
	// MaxEndpoints bounds M: one EndpointSlice holds at most 1000 endpoints
	// (the apiserver's validation limit).
	MaxEndpoints = 1000
)

// endpointBase is the first fake endpoint address: 100.64.0.0/10 holds
// 4 194 304 addresses, enough for 10 000 Services × 400 endpoints.
var endpointBase = netip.MustParseAddr("100.64.0.0")

const endpointSpace = 1 << 22

// Spec says what to generate.
type Spec struct {
	Namespace string // default "svcbench"
	Prefix    string // Service name prefix; default "svc"
	Services  int    // N
	Endpoints int    // M per Service (1..MaxEndpoints)
	// First is the index of the first Service (so that growing from 1 000 to
	// 10 000 only creates the new 9 000).
	First int
}

func (s Spec) withDefaults() (Spec, error) {
	if s.Namespace == "" {
		s.Namespace = "svcbench"
	}
	if s.Prefix == "" {
		s.Prefix = "svc"
	}
	switch {
	case s.Services < 0 || s.First < 0:
		return s, fmt.Errorf("scale: services %d and first %d must not be negative", s.Services, s.First)
	case s.Endpoints < 1 || s.Endpoints > MaxEndpoints:
		return s, fmt.Errorf("scale: %d endpoints per Service: want 1..%d (one EndpointSlice each)", s.Endpoints, MaxEndpoints)
	case (s.First+s.Services)*(s.Endpoints+1) > endpointSpace:
		return s, fmt.Errorf("scale: %d Services × %d endpoints do not fit the %d fake addresses of 100.64.0.0/10", s.First+s.Services, s.Endpoints, endpointSpace)
	}
	return s, nil
}

// Name is the name of Service i (also its EndpointSlice's name).
func (s Spec) Name(i int) string { return s.Prefix + "-" + strconv.Itoa(i) }

// EndpointAddr is the fake address of endpoint j of Service i.
func EndpointAddr(i, j, perService int) netip.Addr {
	n := uint32(i*perService + j)
	b := endpointBase.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func labels() map[string]string { return map[string]string{ManagedByLabel: ManagedBy} }

// Service returns Service i: ClusterIP (allocated by the apiserver), one TCP port.
func (s Spec) Service(i int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name(i), Namespace: s.Namespace, Labels: labels()},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: ServicePort,
				TargetPort: intstr.FromInt32(TargetPort)}},
		},
	}
}

// EndpointSlice returns the slice of Service i with endpoints [0, n) (n may
// differ from s.Endpoints: Change uses it to add or remove one), all ready.
func (s Spec) EndpointSlice(i, n int) *discoveryv1.EndpointSlice {
	l := labels()
	l[discoveryv1.LabelServiceName] = s.Name(i)
	l[discoveryv1.LabelManagedBy] = "axon-svcbench"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: s.Name(i), Namespace: s.Namespace, Labels: l},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP),
			Port: ptr(int32(TargetPort))}},
	}
	for j := range n {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{EndpointAddr(i, j, s.Endpoints+1).String()}, // +1: room for Change's extra endpoint
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
		})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// Result reports what Apply did.
type Result struct {
	Created  int           // objects created (Services + EndpointSlices)
	Existing int           // objects that already existed (left as they were)
	Elapsed  time.Duration // wall time
	// ClusterIPs maps Service index → its ClusterIP (only Services created
	// or found by this call).
	ClusterIPs map[int]netip.Addr
}

// Apply creates the namespace (if missing) and Services First..First+N-1
// with their EndpointSlices, with `workers` requests in flight (default 16).
// Existing objects are kept (a re-run continues). progress, when not nil, is
// called after every 1 000 objects.
func Apply(ctx context.Context, kube kubernetes.Interface, s Spec, workers int, progress func(done, total int)) (Result, error) {
	s, err := s.withDefaults()
	if err != nil {
		return Result{}, err
	}
	if workers <= 0 {
		workers = 16
	}
	t0 := time.Now()
	if err := ensureNamespace(ctx, kube, s.Namespace); err != nil {
		return Result{}, err
	}
	res := Result{ClusterIPs: map[int]netip.Addr{}}
	var mu sync.Mutex
	var created, existing, done atomic.Int64
	// what a previous run left: one paged list instead of two failed
	// creates and a get per object
	have, err := s.existing(ctx, kube)
	if err != nil {
		return Result{}, err
	}
	total := 2 * s.Services
	jobs := make(chan int)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				if ip, ok := have[i]; ok {
					existing.Add(2)
					mu.Lock()
					res.ClusterIPs[i] = ip
					mu.Unlock()
					done.Add(2)
					continue
				}
				ip, err := s.applyOne(cctx, kube, i, &created, &existing)
				if err != nil {
					errc <- err
					cancel()
					return
				}
				mu.Lock()
				res.ClusterIPs[i] = ip
				mu.Unlock()
				if n := done.Add(2); progress != nil && n%1000 == 0 {
					progress(int(n), total)
				}
			}
		})
	}
feed:
	for i := s.First; i < s.First+s.Services; i++ {
		select {
		case jobs <- i:
		case <-cctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	close(errc)
	res.Created, res.Existing, res.Elapsed = int(created.Load()), int(existing.Load()), time.Since(t0)
	var errs []error
	for e := range errc {
		errs = append(errs, e)
	}
	if len(errs) == 0 && ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("scale: create %d Services in %s: %w", s.Services, s.Namespace, err)
	}
	return res, nil
}

func (s Spec) applyOne(ctx context.Context, kube kubernetes.Interface, i int, created, existing *atomic.Int64) (netip.Addr, error) {
	svc, err := kube.CoreV1().Services(s.Namespace).Create(ctx, s.Service(i), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		existing.Add(1)
		svc, err = kube.CoreV1().Services(s.Namespace).Get(ctx, s.Name(i), metav1.GetOptions{})
	} else if err == nil {
		created.Add(1)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("service %s/%s: %w", s.Namespace, s.Name(i), err)
	}
	_, err = kube.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s.EndpointSlice(i, s.Endpoints), metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		existing.Add(1)
	case err != nil:
		return netip.Addr{}, fmt.Errorf("endpointslice %s/%s: %w", s.Namespace, s.Name(i), err)
	default:
		created.Add(1)
	}
	ip, _ := netip.ParseAddr(svc.Spec.ClusterIP)
	return ip, nil
}

// existing lists the generated Services that already exist with their
// EndpointSlice: index → ClusterIP.
func (s Spec) existing(ctx context.Context, kube kubernetes.Interface) (map[int]netip.Addr, error) {
	sel := metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy, Limit: 5000}
	slicesHave := map[string]bool{}
	for {
		l, err := kube.DiscoveryV1().EndpointSlices(s.Namespace).List(ctx, sel)
		if err != nil {
			return nil, fmt.Errorf("scale: list endpointslices in %s: %w", s.Namespace, err)
		}
		for _, es := range l.Items {
			slicesHave[es.Name] = true
		}
		if sel.Continue = l.Continue; sel.Continue == "" {
			break
		}
	}
	out := map[int]netip.Addr{}
	sel.Continue = ""
	for {
		l, err := kube.CoreV1().Services(s.Namespace).List(ctx, sel)
		if err != nil {
			return nil, fmt.Errorf("scale: list services in %s: %w", s.Namespace, err)
		}
		for _, svc := range l.Items {
			i, err := strconv.Atoi(strings.TrimPrefix(svc.Name, s.Prefix+"-"))
			ip, perr := netip.ParseAddr(svc.Spec.ClusterIP)
			if err == nil && perr == nil && s.Name(i) == svc.Name && slicesHave[svc.Name] {
				out[i] = ip
			}
		}
		if sel.Continue = l.Continue; sel.Continue == "" {
			break
		}
	}
	return out, nil
}

func ensureNamespace(ctx context.Context, kube kubernetes.Interface, ns string) error {
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels()}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("scale: create namespace %s: %w", ns, err)
	}
	return nil
}

// SetEndpoints rewrites the EndpointSlice of Service i with n endpoints
// (s.Endpoints ± 1 is what the change-latency measurement uses).
func SetEndpoints(ctx context.Context, kube kubernetes.Interface, s Spec, i, n int) error {
	c, err := PrepareEndpoints(ctx, kube, s, i, n)
	if err != nil {
		return err
	}
	return c.Apply(ctx)
}

// EndpointsChange is a rewrite of one EndpointSlice, read and built by
// PrepareEndpoints and sent by Apply. A caller timing how long a change
// takes to reach the datapath starts its clock right before Apply: the
// read that prepares the update is not part of the change.
type EndpointsChange struct {
	kube  kubernetes.Interface
	slice *discoveryv1.EndpointSlice
}

// PrepareEndpoints reads the EndpointSlice of Service i and returns the
// update that gives it n endpoints (0..s.Endpoints+1).
func PrepareEndpoints(ctx context.Context, kube kubernetes.Interface, s Spec, i, n int) (*EndpointsChange, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > s.Endpoints+1 {
		return nil, fmt.Errorf("scale: %d endpoints for %s: want 0..%d", n, s.Name(i), s.Endpoints+1)
	}
	cur, err := kube.DiscoveryV1().EndpointSlices(s.Namespace).Get(ctx, s.Name(i), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("scale: get endpointslice %s/%s: %w", s.Namespace, s.Name(i), err)
	}
	cur.Endpoints = s.EndpointSlice(i, n).Endpoints
	return &EndpointsChange{kube: kube, slice: cur}, nil
}

// Apply writes the update (one request); it fails on a conflict when the
// slice changed since PrepareEndpoints read it.
func (c *EndpointsChange) Apply(ctx context.Context) error {
	if _, err := c.kube.DiscoveryV1().EndpointSlices(c.slice.Namespace).Update(ctx, c.slice, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("scale: update endpointslice %s/%s: %w", c.slice.Namespace, c.slice.Name, err)
	}
	return nil
}

// Delete removes every Service and EndpointSlice carrying the scale label in
// namespace ns (the namespace itself stays: the lab has no namespace
// controller to finalize it). It returns how many objects it deleted.
func Delete(ctx context.Context, kube kubernetes.Interface, ns string, workers int) (int, error) {
	if ns == "" {
		ns = "svcbench"
	}
	if workers <= 0 {
		workers = 16
	}
	sel := metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedBy}
	var errs []error
	// EndpointSlices support DeleteCollection: one request.
	slices, err := kube.DiscoveryV1().EndpointSlices(ns).List(ctx, sel)
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("scale: list endpointslices in %s: %w", ns, err)
	}
	deleted := 0
	if slices != nil && len(slices.Items) > 0 {
		if err := kube.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			errs = append(errs, fmt.Errorf("scale: delete endpointslices in %s: %w", ns, err))
		}
		// What DeleteCollection left (it may stop early), one by one.
		left, err := kube.DiscoveryV1().EndpointSlices(ns).List(ctx, sel)
		if err != nil {
			return 0, fmt.Errorf("scale: list endpointslices in %s: %w", ns, err)
		}
		var names []string
		for _, es := range left.Items {
			names = append(names, es.Name)
		}
		n, derr := deleteEach(ns, names, workers, func(name string) error {
			return kube.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name, metav1.DeleteOptions{})
		})
		errs = append(errs, derr...)
		deleted += len(slices.Items) - len(left.Items) + n
	}
	svcs, err := kube.CoreV1().Services(ns).List(ctx, sel)
	if err != nil && !apierrors.IsNotFound(err) {
		return deleted, errors.Join(append(errs, fmt.Errorf("scale: list services in %s: %w", ns, err))...)
	}
	if svcs != nil {
		var names []string
		for _, svc := range svcs.Items {
			names = append(names, svc.Name)
		}
		n, derr := deleteEach(ns, names, workers, func(name string) error {
			return kube.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
		})
		errs = append(errs, derr...)
		deleted += n
	}
	return deleted, errors.Join(errs...)
}

// deleteEach deletes names with `workers` requests in flight; NotFound counts as done.
func deleteEach(ns string, names []string, workers int, del func(string) error) (int, []error) {
	ch := make(chan string)
	var n atomic.Int64
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for name := range ch {
				err := del(name)
				switch {
				case err == nil:
					n.Add(1)
				case apierrors.IsNotFound(err):
				default:
					mu.Lock()
					errs = append(errs, fmt.Errorf("scale: delete %s/%s: %w", ns, name, err))
					mu.Unlock()
				}
			}
		})
	}
	for _, name := range names {
		ch <- name
	}
	close(ch)
	wg.Wait()
	return int(n.Load()), errs
}
