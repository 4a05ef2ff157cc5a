package agent

// Services and EndpointSlices → the lb model → an lb.Writer.
//
// serviceSync watches Services, EndpointSlices and this agent's own Node (for
// its zone label), recomputes one Service at a time on any change to it or to
// one of its slices, and writes only the frontends whose content changed. With
// no lb.Writer set it only keeps the table (watch only: status and rendering).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lb"
)

// Queue keys that are not Service keys (a Service key always has a "/").
const (
	queueNode   = "@node"   // own Node changed: recompute everything if the zone changed
	queueResync = "@resync" // compare the whole table with the Writer's read-back
)

const sliceByService = "service" // EndpointSlice indexer: namespace/service-name

// ServicesStatus is the state of the Service watch (for `axon status`).
type ServicesStatus struct {
	Synced      bool          `json:"synced"`
	Writer      bool          `json:"writer"` // a datapath writer is attached (else watch only)
	Services    int           `json:"services"`
	Frontends   int           `json:"frontends"`
	Backends    int           `json:"backends"`
	FullSync    time.Duration `json:"fullSync"`           // first table build + write after the caches synced
	LastWrite   time.Time     `json:"lastWrite,omitzero"` // end of the last write of a change to the Writer
	Writes      uint64        `json:"writes"`             // writes of changes to the Writer so far
	Problems    []string      `json:"problems,omitempty"`
	WriteErrors []string      `json:"writeErrors,omitempty"`
	Conflicts   []string      `json:"conflicts,omitempty"`
	WatchError  string        `json:"watchError,omitempty"`
	NorthSouth  bool          `json:"northSouth,omitempty"` // the writer includes the north-south LB
}

type serviceSync struct {
	node string
	log  *slog.Logger

	factory     informers.SharedInformerFactory // Services, EndpointSlices: this proxy's (proxiedSelector)
	nsFactory   informers.SharedInformerFactory // Namespaces (socket-LB opt-outs)
	nodeFactory informers.SharedInformerFactory // own Node only
	svcs        listersv1.ServiceLister
	nodes       listersv1.NodeLister
	namespaces  listersv1.NamespaceLister // for the opt-out annotation (optout.go)
	nsSynced    cache.InformerSynced
	slices      cache.Indexer
	ev          *events // Kubernetes Events for ignored input (events.go)
	hasSynced   []cache.InformerSynced
	queue       workqueue.TypedRateLimitingInterface[string]

	mu             sync.Mutex
	w              lb.Writer // nil = watch only
	table          *lb.Table
	nodeInfo       lb.NodeInfo
	problems       map[string][]lb.Problem        // service → what Translate skipped
	versions       map[string]api.ServiceVersions // service → the resourceVersions its table entry was translated from
	dirty          map[lb.FrontendKey]string      // written to the table, not yet to the Writer → service that changed it ("" = resync)
	writeErrs      map[lb.FrontendKey]writeErr    // last failed write per key
	notFit         map[string]string              // service → why the Writer cannot take it whole (lb.ErrFull)
	onNS           func()                         // called on Namespace changes (opt-out annotation)
	onSynced       func()                         // called once the initial sync is done
	hp             *hostPorts                     // Pod hostPorts (hostport.go); nil = none
	synced         bool
	writerGen      uint64    // SetWriter calls so far
	comparedW      uint64    // writerGen of the last whole-table compare that succeeded
	comparedWriter lb.Writer // the writer of that compare
	fullSync       time.Duration
	lastWrite      time.Time // end of the last flush that wrote anything (services_metrics.go)
	writes         uint64    // such flushes
	watchErr       string
	watchLog       time.Time
	health         syncHealth // for the kube-proxy-compatible healthz (kubeproxy.go); its own lock
}

// writeErr is a failed datapath write, retried until it succeeds.
type writeErr struct {
	err   error
	since time.Time // first failure
}

// The labels by which a Service (and its EndpointSlices, which carry the
// Service's labels) is not this proxy's, as kube-proxy reads them:
// service.kubernetes.io/service-proxy-name names another proxy (an
// alternative implementation serves it); service.kubernetes.io/headless is
// on the EndpointSlices of a headless Service (no ClusterIP to serve).
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
	proxiedSelector       = "!" + LabelServiceProxyName + ",!" + LabelHeadless
)

func newServiceSync(cfg *rest.Config, node string, log *slog.Logger) (*serviceSync, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "axon-agent/" + node + "/services"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube client for %s: %w", cfg.Host, err)
	}
	s := &serviceSync{
		node: node, log: log,
		// Services and EndpointSlices of this proxy only, as kube-proxy selects them
		factory: informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = proxiedSelector })),
		nsFactory: informers.NewSharedInformerFactory(client, 0),
		nodeFactory: informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + node })),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "services"}),
		table:     lb.NewTable(),
		nodeInfo:  lb.NodeInfo{Name: node},
		problems:  map[string][]lb.Problem{},
		versions:  map[string]api.ServiceVersions{},
		dirty:     map[lb.FrontendKey]string{},
		writeErrs: map[lb.FrontendKey]writeErr{},
		notFit:    map[string]string{},
		ev:        newEvents(context.Background(), client, node, log),
	}
	svcInf := s.factory.Core().V1().Services()
	sliceInf := s.factory.Discovery().V1().EndpointSlices()
	nodeInf := s.nodeFactory.Core().V1().Nodes()
	nsInf := s.nsFactory.Core().V1().Namespaces()
	if err := sliceInf.Informer().AddIndexers(cache.Indexers{sliceByService: sliceServiceIndex}); err != nil {
		return nil, fmt.Errorf("add endpointslice indexer: %w", err)
	}
	handlers := map[cache.SharedIndexInformer]cache.ResourceEventHandler{
		svcInf.Informer(): cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { s.enqueueObj(o) },
			UpdateFunc: func(_, o any) { s.enqueueObj(o) },
			DeleteFunc: func(o any) { s.enqueueObj(o) },
		},
		sliceInf.Informer(): cache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { s.enqueueSlice(o) },
			UpdateFunc: func(old, o any) {
				s.enqueueSlice(old) // the service-name label may have changed
				s.enqueueSlice(o)
			},
			DeleteFunc: func(o any) { s.enqueueSlice(o) },
		},
		nodeInf.Informer(): cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.queue.Add(queueNode) },
			UpdateFunc: func(any, any) { s.queue.Add(queueNode) },
			DeleteFunc: func(any) { s.queue.Add(queueNode) },
		},
		nsInf.Informer(): cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.namespaceChanged() },
			UpdateFunc: func(any, any) { s.namespaceChanged() },
			DeleteFunc: func(any) { s.namespaceChanged() },
		},
	}
	sl := newSlimmer()
	for inf, h := range handlers {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(s.watchError); err != nil {
			return nil, fmt.Errorf("set watch error handler: %w", err)
		}
		if err := inf.SetTransform(sl.slim); err != nil {
			return nil, fmt.Errorf("set transform: %w", err)
		}
		s.hasSynced = append(s.hasSynced, inf.HasSynced)
	}
	s.svcs, s.nodes, s.slices = svcInf.Lister(), nodeInf.Lister(), sliceInf.Informer().GetIndexer()
	s.namespaces, s.nsSynced = nsInf.Lister(), nsInf.Informer().HasSynced
	return s, nil
}

// slim keeps the caches small (10 000 Services × their
// slices): before an object is cached it is replaced by a copy holding only
// what lb.Translate, the slice index, the opt-out and Events read. Everything
// else (managedFields, kubectl's last-applied annotation, owner references,
// endpoint target references and hostnames) is dropped.
func (sl *slimmer) slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		spec := o.Spec
		spec.Selector = nil // the control plane's business: EndpointSlices carry the result
		return &corev1.Service{ObjectMeta: slimMeta(&o.ObjectMeta), Spec: spec, Status: o.Status}, nil
	case *discoveryv1.EndpointSlice:
		es := &discoveryv1.EndpointSlice{ObjectMeta: slimMeta(&o.ObjectMeta), AddressType: o.AddressType,
			Ports: o.Ports, Endpoints: make([]discoveryv1.Endpoint, len(o.Endpoints))}
		if name, ok := o.Labels[lb.ServiceNameLabel]; ok {
			es.Labels = map[string]string{lb.ServiceNameLabel: name}
		}
		for i := range o.Endpoints {
			ep := &o.Endpoints[i]
			es.Endpoints[i] = discoveryv1.Endpoint{Addresses: ep.Addresses, Conditions: discoveryv1.EndpointConditions{
				Ready: sl.cond(ep.Conditions.Ready), Serving: sl.cond(ep.Conditions.Serving), Terminating: sl.cond(ep.Conditions.Terminating)},
				NodeName: sl.name(ep.NodeName), Zone: sl.name(ep.Zone), Hints: ep.Hints}
		}
		return es, nil
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: slimMeta(&o.ObjectMeta)}, nil
	}
	if m, err := meta.Accessor(obj); err == nil { // the own Node: small, keep it whole
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// slimmer makes the cached copies. Cached objects are never modified
// (client-go's contract), so the few distinct condition values and node and
// zone names of 100 000 endpoints point at one copy each instead of one per
// endpoint. Safe for concurrent use: informers transform on their own
// goroutines.
type slimmer struct {
	yes, no bool // what every cached condition points at
	mu      sync.Mutex
	names   map[string]*string
}

func newSlimmer() *slimmer { return &slimmer{yes: true, names: map[string]*string{}} }

func (sl *slimmer) cond(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sl.yes
	}
	return &sl.no
}

// name returns the shared copy of *p (node and zone names).
func (sl *slimmer) name(p *string) *string {
	if p == nil {
		return nil
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if q, ok := sl.names[*p]; ok {
		return q
	}
	if len(sl.names) >= maxInterned {
		return p // unbounded input (hostile slices) does not grow the table
	}
	v := strings.Clone(*p)
	sl.names[v] = &v
	return &v
}

// maxInterned bounds the shared names: far above the nodes and zones of
// any cluster.
const maxInterned = 65536

// slimMeta keeps identity (for the cache, Events) and the axon.io/
// annotations (opt-out, lb-algorithm).
func slimMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		DeletionTimestamp: m.DeletionTimestamp}
	for k, v := range m.Annotations {
		if strings.HasPrefix(k, "axon.io/") {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	return out
}

func sliceServiceIndex(obj any) ([]string, error) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := es.Labels[lb.ServiceNameLabel]
	if name == "" {
		return nil, nil
	}
	return []string{lb.ServiceKey(es.Namespace, name)}, nil
}

func (s *serviceSync) enqueueObj(o any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
		s.queue.Add(key)
	}
}

func (s *serviceSync) enqueueSlice(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	keys, _ := sliceServiceIndex(o)
	for _, k := range keys {
		s.queue.Add(k)
	}
}

func (s *serviceSync) watchError(ctx context.Context, r *cache.Reflector, err error) {
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchErr = fmt.Sprintf("watch %s: %v", r.TypeDescription(), err)
	if time.Since(s.watchLog) > time.Minute {
		s.watchLog = time.Now()
		s.log.Warn("service watch failed; retrying", "resource", r.TypeDescription(), "error", err)
	}
}

// SetWriter attaches (or, with nil, detaches) the datapath writer. The whole
// table is then compared with what the writer reads back and the difference
// written, so a restarted agent converges without flushing its maps.
func (s *serviceSync) SetWriter(w lb.Writer) {
	s.mu.Lock()
	s.w = w
	s.writerGen++
	s.mu.Unlock()
	s.queue.Add(queueResync)
}

// run watches until ctx is done. Nothing is written before every cache has
// synced: a half-filled cache must never remove backends a previous run wrote.
func (s *serviceSync) run(ctx context.Context) {
	defer s.queue.ShutDown()
	defer s.ev.shutdown()
	s.factory.Start(ctx.Done())
	s.nsFactory.Start(ctx.Done())
	s.nodeFactory.Start(ctx.Done())
	defer func() {
		stopped := make(chan struct{})
		go func() {
			s.factory.Shutdown()
			s.nsFactory.Shutdown()
			s.nodeFactory.Shutdown()
			close(stopped)
		}()
		select { // see kube.run: do not wait for a client-go retry backoff
		case <-stopped:
		case <-time.After(2 * time.Second):
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), s.hasSynced...) {
		return
	}
	s.initialSync()
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	for s.processNext() {
	}
}

// initialSync builds the whole table from the caches, then writes the
// difference with the Writer's content in one pass.
func (s *serviceSync) initialSync() {
	start := time.Now()
	s.refreshNode()
	list, err := s.svcs.List(labels.Everything())
	if err != nil {
		s.log.Warn("list services from cache", "error", err)
	}
	s.mu.Lock()
	for _, svc := range list {
		key := lb.ServiceKey(svc.Namespace, svc.Name)
		fs, probs := s.translate(key, svc)
		s.setProblems(key, probs)
		s.table.Apply(key, fs)
	}
	s.applyHostPortsLocked() // hostport.go
	s.synced = true
	err = s.resyncLocked()
	s.fullSync = time.Since(start)
	st := s.statusLocked()
	s.mu.Unlock()
	s.noteHealth()
	s.log.Info("services synced", "services", st.Services, "frontends", st.Frontends, "backends", st.Backends,
		"writer", st.Writer, "took", st.FullSync.Round(time.Microsecond))
	if s.onSynced != nil {
		s.onSynced()
	}
	if err != nil {
		s.queue.AddRateLimited(queueResync)
	}
}

func (s *serviceSync) processNext() bool {
	key, quit := s.queue.Get()
	if quit {
		return false
	}
	s.health.took()
	defer s.noteHealth()
	defer s.queue.Done(key)
	var err error
	switch key {
	case queueResync:
		s.mu.Lock()
		if s.comparedW != s.writerGen { // else the initial sync already compared with this writer
			err = s.resyncLocked()
		}
		s.mu.Unlock()
	case queueHostPort: // hostport.go
		err = s.syncHostPorts()
	case queueNode:
		if s.refreshNode() {
			for _, svc := range s.listKeys() {
				s.queue.Add(svc)
			}
		}
	default:
		err = s.syncService(key)
	}
	if err != nil {
		s.queue.AddRateLimited(key)
		return true
	}
	s.queue.Forget(key)
	return true
}

func (s *serviceSync) listKeys() []string {
	list, _ := s.svcs.List(labels.Everything())
	keys := make([]string, 0, len(list))
	for _, svc := range list {
		keys = append(keys, lb.ServiceKey(svc.Namespace, svc.Name))
	}
	return keys
}

// refreshNode reads the own Node's zone; true when it changed.
func (s *serviceSync) refreshNode() bool {
	ni := lb.NodeInfo{Name: s.node}
	if n, err := s.nodes.Get(s.node); err == nil {
		ni.Zone = n.Labels[lb.ZoneLabel]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := ni != s.nodeInfo
	s.nodeInfo = ni
	return changed
}

// translate computes one service's frontends from the caches. Called with mu held.
// It records the resourceVersions it translated from (s.versions).
func (s *serviceSync) translate(key string, svc *corev1.Service) ([]lb.Frontend, []lb.Problem) {
	delete(s.versions, key)
	if svc == nil {
		return nil, nil
	}
	objs, err := s.slices.ByIndex(sliceByService, key)
	if err != nil {
		return nil, []lb.Problem{{Service: key, Object: "EndpointSlices", Reason: err.Error()}}
	}
	v := api.ServiceVersions{Service: svc.ResourceVersion, Slices: make(map[string]string, len(objs))}
	eps := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			eps = append(eps, es)
			v.Slices[es.Name] = es.ResourceVersion
		}
	}
	s.versions[key] = v
	return lb.Translate(svc, eps, s.nodeInfo)
}

// programmedLocked is the write acknowledgement (api.ServicesReply.Programmed):
// the versions of every Service whose table entry the current writer holds
// whole. Nothing while watch only, before the initial sync, or while a new
// writer has not been compared with the table yet (SetWriter); then every
// Service but those with a frontend still to write (a failed write stays
// dirty) or refused for not fitting.
func (s *serviceSync) programmed() map[string]api.ServiceVersions {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.programmedLocked()
}

func (s *serviceSync) programmedLocked() map[string]api.ServiceVersions {
	if s.w == nil || !s.synced || s.comparedW != s.writerGen || s.comparedWriter != s.w {
		return nil
	}
	pending := map[string]bool{}
	for k, svc := range s.dirty {
		if f, ok := s.table.Get(k); ok {
			svc = f.Service
		}
		pending[svc] = true
	}
	out := make(map[string]api.ServiceVersions, len(s.versions))
	for key, v := range s.versions {
		if !pending[key] && s.notFit[key] == "" {
			out[key] = v
		}
	}
	return out
}

func (s *serviceSync) setProblems(key string, probs []lb.Problem) {
	if slices.Equal(probs, s.problems[key]) {
		return
	}
	if len(probs) > 0 {
		msgs := make([]string, 0, len(probs))
		for _, p := range probs {
			msgs = append(msgs, fmt.Sprintf("%s skipped: %s", p.Object, p.Reason))
		}
		msg := fmt.Sprintf("%d part(s) not programmed, the rest of the Service is: %s", len(probs), strings.Join(msgs, "; "))
		s.ev.emit(s.serviceObj(key), "service "+key, corev1.EventTypeWarning, ReasonServiceEntryIgnored, msg)
	}
	if len(probs) == 0 {
		delete(s.problems, key)
	} else {
		s.problems[key] = probs
	}
}

// syncService recomputes one service and writes what changed.
func (s *serviceSync) syncService(key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not a key we can ever resolve
	}
	svc, err := s.svcs.Services(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get service %s from cache: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs, probs := s.translate(key, svc)
	s.setProblems(key, probs)
	up, del := s.table.Apply(key, fs)
	for _, f := range up {
		s.dirty[f.Key] = key
	}
	for _, k := range del {
		s.dirty[k] = key
	}
	if len(fs) == 0 && s.notFit[key] != "" {
		delete(s.notFit, key) // deleted (or emptied) while refused: nothing left to program
		s.ev.forget("service "+key, ReasonServiceNotFit)
	}
	err = s.flushLocked(key)
	if len(del)+len(up) > 0 && err == nil {
		// room may have been freed (a delete, fewer backends): refused
		// Services try again now, not after their backoff
		for svc := range s.notFit {
			if svc != key {
				s.queue.Add(svc)
			}
		}
	}
	return err
}

// kindAwareReader is a Writer whose read-back depends on the kind the
// table wants for a key (teeWriter); resyncLocked reads it back with them.
type kindAwareReader interface {
	FrontendsFor(wanted func(lb.FrontendKey) (lb.Kind, bool)) ([]lb.Frontend, error)
}

// primaryReader is a Writer over another one (teeWriter over the socket
// LB) that can merge its read-back with that writer's content given
// instead of read back.
type primaryReader interface {
	Primary() lb.Writer
	FrontendsGivenPrimary(prim []lb.Frontend, wanted func(lb.FrontendKey) (lb.Kind, bool)) ([]lb.Frontend, error)
}

// inLineLocked reports whether w is the writer of the last whole-table
// compare, the writer changed only once since (to the one being resynced),
// and every change since then reached it: then w holds exactly the table,
// and reading 10 000 Services back from its maps would only cost memory
// (the restarted agent's peak was that read-back when the north-south LB
// attached).
func (s *serviceSync) inLineLocked(w lb.Writer) bool {
	return w != nil && w == s.comparedWriter && s.comparedW+1 == s.writerGen &&
		len(s.dirty) == 0 && len(s.writeErrs) == 0 && len(s.notFit) == 0
}

// resyncLocked marks every difference between the table and the Writer's
// read-back dirty and writes it.
func (s *serviceSync) resyncLocked() error {
	if s.w == nil || !s.synced {
		return nil
	}
	var cur []lb.Frontend
	var err error
	wanted := func(k lb.FrontendKey) (lb.Kind, bool) {
		f, ok := s.table.Get(k)
		return f.Kind, ok
	}
	if r, ok := s.w.(primaryReader); ok && s.inLineLocked(r.Primary()) {
		cur, err = r.FrontendsGivenPrimary(s.table.Frontends(), wanted)
	} else if r, ok := s.w.(kindAwareReader); ok {
		cur, err = r.FrontendsFor(wanted)
	} else {
		cur, err = s.w.Frontends()
	}
	if err != nil {
		return fmt.Errorf("read frontends back from the datapath: %w", err)
	}
	have := make(map[lb.FrontendKey]lb.Frontend, len(cur))
	for _, f := range cur {
		have[f.Key] = f
	}
	for _, f := range s.table.Frontends() {
		if h, ok := have[f.Key]; !ok || !lb.SameDatapath(h, f) {
			if _, already := s.dirty[f.Key]; !already {
				s.dirty[f.Key] = f.Service
			}
		}
		delete(have, f.Key)
	}
	for k := range have {
		if _, already := s.dirty[k]; !already {
			s.dirty[k] = "" // written by a previous run for a service that is gone
		}
	}
	if err := s.flushLocked(""); err != nil {
		return err
	}
	s.comparedW, s.comparedWriter = s.writerGen, s.w
	return nil
}

// flushLocked writes the dirty keys of service only ("" = every dirty key):
// deletes first (they free room), then each service's upserts, a service
// only when the Writer can take all of its frontends (lb.CapacityChecker):
// a Service is programmed whole or keeps what it had. A failed key stays
// dirty and is retried with the next flush.
func (s *serviceSync) flushLocked(service string) error {
	if s.w == nil {
		clear(s.dirty) // watch only; SetWriter resyncs everything
		return nil
	}
	var dels []lb.FrontendKey
	ups := map[string][]lb.Frontend{}
	for k, svc := range s.dirty {
		if service != "" && svc != service {
			continue
		}
		if f, ok := s.table.Get(k); ok {
			ups[f.Service] = append(ups[f.Service], f)
		} else {
			dels = append(dels, k)
		}
	}
	if len(dels)+len(ups) > 0 {
		defer s.noteWrite() // after the last write below, failed ones included
	}
	slices.SortFunc(dels, lb.CompareKeys)
	var errs []error
	for _, k := range dels {
		s.writeKey(k, s.w.DeleteFrontend(k), &errs)
	}
	svcs := make([]string, 0, len(ups))
	for svc := range ups {
		svcs = append(svcs, svc)
	}
	slices.Sort(svcs)
	cc, _ := s.w.(lb.CapacityChecker)
	if s.flushBatchLocked(svcs, ups, cc, &errs) {
		return errors.Join(errs...)
	}
	for _, svc := range svcs {
		fs := ups[svc]
		slices.SortFunc(fs, func(a, b lb.Frontend) int { return lb.CompareKeys(a.Key, b.Key) })
		if cc != nil {
			if err := cc.Fits(s.table.Service(svc)); errors.Is(err, lb.ErrFull) {
				s.refuseLocked(svc, err)
				errs = append(errs, err)
				continue
			}
		}
		s.fitsAgainLocked(svc)
		for _, f := range fs {
			s.writeKey(f.Key, s.w.UpsertFrontend(f), &errs)
		}
	}
	return errors.Join(errs...)
}

// flushBatchLocked writes the upserts of many Services at once through an
// lb.BatchWriter (the full sync: 10 000 Services in a few system calls
// instead of 210 000). It does so only when all of them fit together, so
// every Service is still programmed whole; false = nothing written, take
// the one-by-one path (it refuses the Services that do not fit).
func (s *serviceSync) flushBatchLocked(svcs []string, ups map[string][]lb.Frontend, cc lb.CapacityChecker, errs *[]error) bool {
	bw, ok := s.w.(lb.BatchWriter)
	if !ok || len(svcs) < 2 {
		return false
	}
	var all []lb.Frontend
	n := 0
	for _, svc := range svcs {
		n += len(ups[svc])
	}
	all = make([]lb.Frontend, 0, n)
	if cc != nil {
		whole := make([]lb.Frontend, 0, n)
		for _, svc := range svcs {
			whole = append(whole, s.table.Service(svc)...)
		}
		if err := cc.Fits(whole); err != nil {
			return false
		}
	}
	for _, svc := range svcs {
		fs := ups[svc]
		slices.SortFunc(fs, func(a, b lb.Frontend) int { return lb.CompareKeys(a.Key, b.Key) })
		all = append(all, fs...)
		s.fitsAgainLocked(svc)
	}
	res := bw.UpsertFrontends(all)
	for i, f := range all {
		var err error
		if res != nil {
			err = res[i]
		}
		s.writeKey(f.Key, err, errs)
	}
	return true
}

// writeKey records the outcome of one write.
func (s *serviceSync) writeKey(k lb.FrontendKey, err error, errs *[]error) {
	if err != nil {
		we, failed := s.writeErrs[k]
		if !failed {
			s.log.Warn("write service frontend failed; retrying", "frontend", k.String(), "error", err)
			we.since = time.Now()
		}
		we.err = err
		s.writeErrs[k] = we
		*errs = append(*errs, err)
		return
	}
	if _, failed := s.writeErrs[k]; failed {
		s.log.Info("service frontend written after an earlier failure", "frontend", k.String())
		delete(s.writeErrs, k)
	}
	delete(s.dirty, k)
}

// fitsAgainLocked forgets that svc did not fit the Writer, with a Normal
// Event, when it was refused before: it is being programmed now.
func (s *serviceSync) fitsAgainLocked(svc string) {
	if s.notFit[svc] == "" {
		return
	}
	delete(s.notFit, svc)
	s.ev.forget("service "+svc, ReasonServiceNotFit)
	s.ev.emit(s.serviceObj(svc), "service "+svc, corev1.EventTypeNormal, ReasonServiceProgrammed,
		"the Service fits the socket LB maps again and is programmed")
}

// refuseLocked records that svc does not fit the Writer: status, one log
// line and one Event per distinct reason. Nothing of it is written.
func (s *serviceSync) refuseLocked(svc string, err error) {
	msg := fmt.Sprintf("not programmed: %v; the Service keeps what it had programmed before (nothing if new), other Services are unaffected", err)
	first := s.notFit[svc] == ""
	s.notFit[svc] = msg
	if first { // one Event per refusal, not one per retry with new numbers
		s.ev.emit(s.serviceObj(svc), "service "+svc, corev1.EventTypeWarning, ReasonServiceNotFit, msg)
	}
}

// serviceObj is the cached Service for an Event, nil when gone.
func (s *serviceSync) serviceObj(key string) *corev1.Service {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := s.svcs.Services(ns).Get(name)
	if err != nil {
		return nil
	}
	return svc
}

// namespaceChanged tells the opt-out logic (optout.go) to look again.
func (s *serviceSync) namespaceChanged() {
	s.mu.Lock()
	f := s.onNS
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// initialSynced reports whether the first whole-table sync is done.
func (s *serviceSync) initialSynced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// northSouthWritten reports whether the writer includes the north-south LB
// (the tee) and the whole table has been compared with it since it was set:
// every frontend it should hold is written, or waits in dirty for a retry
// like any other write.
func (s *serviceSync) northSouthWritten() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, tee := s.w.(*teeWriter)
	return tee && s.synced && s.comparedW == s.writerGen && s.comparedWriter == s.w
}

func (s *serviceSync) status() ServicesStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusLocked()
}

func (s *serviceSync) statusLocked() ServicesStatus {
	st := ServicesStatus{Synced: s.synced, Writer: s.w != nil, Services: s.table.Services(), FullSync: s.fullSync,
		LastWrite: s.lastWrite, Writes: s.writes, WatchError: s.watchErr}
	_, st.NorthSouth = s.w.(*teeWriter)
	for _, f := range s.table.Frontends() {
		st.Frontends++
		st.Backends += len(f.Backends)
	}
	for _, probs := range s.problems {
		for _, p := range probs {
			st.Problems = append(st.Problems, p.String())
		}
	}
	slices.Sort(st.Problems)
	for k, we := range s.writeErrs {
		st.WriteErrors = append(st.WriteErrors, fmt.Sprintf("%s: %v", k, we.err))
	}
	for svc, msg := range s.notFit {
		st.WriteErrors = append(st.WriteErrors, fmt.Sprintf("service %s %s", svc, msg))
	}
	slices.Sort(st.WriteErrors)
	for _, c := range s.table.Conflicts() {
		st.Conflicts = append(st.Conflicts, fmt.Sprintf("%s wanted by %s is used by %s", c.Key, c.Service, c.Owner))
	}
	return st
}

// render is the table in the shared text format (lb.Render).
func (s *serviceSync) render() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lb.Render(s.table.Frontends())
}

// Services reports the Service watch state and its table rendered as text.
func (a *Agent) Services() (ServicesStatus, string) {
	if a.svc == nil {
		return ServicesStatus{}, ""
	}
	return a.svc.status(), a.svc.render()
}
