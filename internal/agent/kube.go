package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// kube watches Nodes (all) and Pods of this node and tracks the API server
// connection for Status.
type kube struct {
	node   string
	host   string
	client kubernetes.Interface
	log    *slog.Logger
	// probeEvery is Config.APIServerProbeInterval (0: DefaultAPIServerProbeInterval)
	probeEvery time.Duration

	nodeFactory informers.SharedInformerFactory
	podFactory  informers.SharedInformerFactory
	nodes       listersv1.NodeLister
	pods        listersv1.PodLister
	nodeSynced  cache.InformerSynced
	podSynced   cache.InformerSynced

	mu        sync.Mutex
	connected bool
	probed    bool // at least one probe finished
	synced    bool
	lastErr   string // last connection problem, "" when fine
	watchErr  string // last non-connection watch error (e.g. RBAC)
	watchLog  time.Time
}

func newKube(cfg *rest.Config, node string, log *slog.Logger, onChange func()) (*kube, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "axon-agent/" + node
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube client for %s: %w", cfg.Host, err)
	}
	k := &kube{node: node, host: cfg.Host, client: client, log: log}
	k.nodeFactory = informers.NewSharedInformerFactory(client, 0)
	k.podFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + node }))

	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { onChange() },
		UpdateFunc: func(any, any) { onChange() },
		DeleteFunc: func(any) { onChange() },
	}
	nodeInf := k.nodeFactory.Core().V1().Nodes()
	podInf := k.podFactory.Core().V1().Pods()
	for _, inf := range []cache.SharedIndexInformer{nodeInf.Informer(), podInf.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(k.watchError); err != nil {
			return nil, fmt.Errorf("set watch error handler: %w", err)
		}
	}
	// Pods are only looked up by name: keep just that in memory.
	if err := podInf.Informer().SetTransform(slimPod); err != nil {
		return nil, fmt.Errorf("set pod transform: %w", err)
	}
	k.nodes, k.pods = nodeInf.Lister(), podInf.Lister()
	k.nodeSynced, k.podSynced = nodeInf.Informer().HasSynced, podInf.Informer().HasSynced
	return k, nil
}

func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		Annotations: p.Annotations, // axon.io/socket-lb opt-out (optout.go)
	}, Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork}}
	// the same-node TCP bypass without axon-cni learns pods' addresses here (sockmap_discover.go)
	slim.Status.Phase, slim.Status.PodIPs = p.Status.Phase, p.Status.PodIPs
	slimHostPorts(p, slim) // hostPorts, phase and pod IPs (hostport.go)
	return slim, nil
}

// run starts the informers and the connection probe, calls onSynced once both
// caches are filled, and returns when ctx is done.
func (k *kube) run(ctx context.Context, onSynced func()) {
	var wg sync.WaitGroup
	wg.Go(func() { k.probeLoop(ctx) })
	k.nodeFactory.Start(ctx.Done())
	k.podFactory.Start(ctx.Done())
	if cache.WaitForCacheSync(ctx.Done(), k.nodeSynced, k.podSynced) {
		k.mu.Lock()
		k.synced = true
		k.mu.Unlock()
		k.log.Info("kube-apiserver caches synced", "server", k.host)
		onSynced()
	}
	<-ctx.Done()
	// client-go's watch-list backoff sleeps without watching the context (up
	// to 30 s while the apiserver is unreachable): do not hold SIGTERM up.
	stopped := make(chan struct{})
	go func() {
		k.nodeFactory.Shutdown()
		k.podFactory.Shutdown()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		k.log.Debug("informers still in a retry backoff; exiting without waiting for them")
	}
	wg.Wait()
}

// watchError replaces client-go's default handler (one klog line per retry,
// per informer) by a status update; the probe loop does the logging.
func (k *kube) watchError(ctx context.Context, r *cache.Reflector, err error) {
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if isConnError(err) {
		k.connected = false
		k.lastErr = err.Error()
		return
	}
	k.watchErr = fmt.Sprintf("watch %s: %v", r.TypeDescription(), err)
	if time.Since(k.watchLog) > time.Minute {
		k.watchLog = time.Now()
		k.log.Warn("kube-apiserver watch failed; retrying", "server", k.host, "resource", r.TypeDescription(), "error", err)
	}
}

func isConnError(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &oe) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
}

// probeLoop checks GET /version: every probeEvery (10 s) while connected, with
// backoff while not (1 s doubling up to three probe intervals, at most 30 s: with
// the default interval 1 s … 30 s). It logs one line per failed attempt and one
// when the connection comes back.
func (k *kube) probeLoop(ctx context.Context) {
	healthyEvery := cmp.Or(k.probeEvery, DefaultAPIServerProbeInterval)
	firstBackoff, maxBackoff := min(time.Second, healthyEvery), min(30*time.Second, 3*healthyEvery)
	backoff := firstBackoff
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := k.client.Discovery().RESTClient().Get().AbsPath("/version").Do(pctx).Raw()
		cancel()
		if ctx.Err() != nil {
			return
		}
		wait := healthyEvery
		k.mu.Lock()
		was := k.connected || !k.probed
		k.probed = true
		if err != nil {
			k.connected = false
			k.lastErr = err.Error()
			k.log.Warn(fmt.Sprintf("kube-apiserver %s unreachable; retrying in %s", k.host, backoff), "error", err)
			wait = backoff
			backoff = min(backoff*2, maxBackoff)
		} else {
			if !was {
				k.log.Info("kube-apiserver reachable again", "server", k.host)
			}
			k.connected = true
			k.lastErr = ""
			backoff = firstBackoff
		}
		k.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// synced reports whether both informer caches are filled.
func (k *kube) isSynced() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.synced
}

// unreachable says why the kube-apiserver cannot be reached right now ("" when
// the last probe or watch got through), for readiness.
func (k *kube) unreachable() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lastErr == "" {
		return ""
	}
	return fmt.Sprintf("kube-apiserver %s unreachable: %s; retrying", k.host, k.lastErr)
}

// status is the APIServerStatus shown by `axon status`.
func (k *kube) status() (st struct {
	Connected, Synced bool
	Message           string
}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	st.Connected, st.Synced = k.connected, k.synced
	switch {
	case k.lastErr != "":
		st.Message = fmt.Sprintf("kube-apiserver %s unreachable: %s; retrying", k.host, k.lastErr)
	case !k.probed:
		st.Message = fmt.Sprintf("connecting to kube-apiserver %s", k.host)
	case !k.synced && k.watchErr != "":
		st.Message = fmt.Sprintf("kube-apiserver %s: %s; retrying", k.host, k.watchErr)
	case !k.synced:
		st.Message = fmt.Sprintf("waiting for Node and Pod caches from %s", k.host)
	default:
		st.Message = "connected to " + k.host
	}
	return st
}
