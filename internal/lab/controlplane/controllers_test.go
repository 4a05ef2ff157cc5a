package controlplane

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/axonhq/axon/internal/proc"
	"github.com/axonhq/axon/internal/testutil"
)

// TestControllers runs the control plane with Config.Controllers: the real kube-scheduler and
// kube-controller-manager next to etcd and kube-apiserver. It checks that the controllers act
// (a new Namespace gets its default ServiceAccount, a Deployment its ReplicaSet and Pods, which
// the scheduler marks unschedulable since there are no nodes, a Service its EndpointSlice), that
// a kubelet identity is held to its own Node, and that Stop leaves no process.
func TestControllers(t *testing.T) {
	testutil.RequireRoot(t, "runs the control plane")
	etcdBin, apiBin := labBinaries(t)
	k8sDir := filepath.Dir(apiBin)
	dir := t.TempDir()
	etcdPort, ports := freeTCPPorts(t, 3)
	cfg := Config{
		Dir:                     dir,
		APIPort:                 ports[0],
		EtcdPort:                etcdPort,
		SchedulerPort:           ports[1],
		ControllerManagerPort:   ports[2],
		EtcdBinary:              etcdBin,
		APIServerBinary:         apiBin,
		Controllers:             true,
		SchedulerBinary:         filepath.Join(k8sDir, "kube-scheduler"),
		ControllerManagerBinary: filepath.Join(k8sDir, "kube-controller-manager"),
		Logger:                  testLogger(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t0 := time.Now()
	cp, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if err := Stop(dir); err != nil {
				t.Errorf("cleanup Stop: %v", err)
			}
		}
	})
	t.Logf("control plane with controllers ready in %v, pids %v", time.Since(t0).Round(time.Millisecond), cp.PIDs())
	if n := len(cp.PIDs()); n != 4 {
		t.Fatalf("PIDs() = %v, want etcd, kube-apiserver, kube-scheduler, kube-controller-manager", cp.PIDs())
	}
	admin, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}

	// A fresh namespace: the ServiceAccount controller creates "default" in it, and only then
	// does the ServiceAccount admission (on with Controllers) let Pods in.
	const ns = "ctrl-test"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "ServiceAccount default in "+ns, func() (bool, string, error) {
		_, err := admin.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not found", nil
		}
		return err == nil, "", err
	})

	labels := map[string]string{"app": "web"}
	replicas := int32(2)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10.1"}}},
			},
		},
	}
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	waitFor(ctx, t, "ReplicaSet of Deployment web", func() (bool, string, error) {
		rss, err := admin.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		for _, rs := range rss.Items {
			if metav1.IsControlledBy(&rs, mustGetDeployment(ctx, t, admin, ns, "web")) {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d ReplicaSets, none owned by the Deployment", len(rss.Items)), nil
	})
	// The Pods exist and the scheduler has looked at them: no node, so PodScheduled=False,
	// reason Unschedulable (a condition only the scheduler sets).
	waitFor(ctx, t, "2 Pods marked Unschedulable by the scheduler", func() (bool, string, error) {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, "", err
		}
		unsched := 0
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					unsched++
				}
			}
		}
		return len(pods.Items) == 2 && unsched == 2, fmt.Sprintf("%d pods, %d unschedulable", len(pods.Items), unsched), nil
	})
	waitFor(ctx, t, "EndpointSlice of Service web from the EndpointSlice controller", func() (bool, string, error) {
		sl, err := admin.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			return false, "", err
		}
		for _, s := range sl.Items {
			if s.Labels[discoveryv1.LabelManagedBy] == "endpointslice-controller.k8s.io" {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d slices, none managed by the controller", len(sl.Items)), nil
	})

	t.Run("kubelet identity is held to its own node", func(t *testing.T) {
		kc, err := cp.KubeletKubeconfig("node-a")
		if err != nil {
			t.Fatal(err)
		}
		rc, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			t.Fatal(err)
		}
		kubelet := kubernetes.NewForConfigOrDie(rc)
		own := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
		if _, err := kubelet.CoreV1().Nodes().Create(ctx, own, metav1.CreateOptions{}); err != nil {
			t.Fatalf("kubelet of node-a registers node-a: %v (want allowed)", err)
		}
		other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}
		_, err = kubelet.CoreV1().Nodes().Create(ctx, other, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("kubelet of node-a registers node-b: err = %v, want Forbidden (NodeRestriction)", err)
		}
		t.Logf("node-b refused as expected: %v", err)
		if _, err := admin.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("node-b exists after the refused create (get: %v)", err)
		}
	})

	pids := cp.PIDs()
	stopped = true
	if err := Stop(dir); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for i, r := range readPIDsOrEmpty(t, dir) {
		t.Errorf("pids.json still lists %s after Stop (%d)", r.Name, i)
	}
	for _, pid := range pids {
		if !proc.Exited(pid) {
			t.Errorf("pid %d still runs after Stop", pid)
		}
	}
}

func mustGetDeployment(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) *appsv1.Deployment {
	t.Helper()
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitFor polls cond every 200ms until it holds, failing the test with the last state when
// ctx (or 45 s) runs out.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string, error)) {
	t.Helper()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	var state string
	var err error
	for {
		var ok bool
		ok, state, err = cond()
		if ok && err == nil {
			t.Logf("%s after %v", what, time.Since(t0).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %v (last: %s, err %v)", what, time.Since(t0).Round(time.Millisecond), state, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func readPIDsOrEmpty(t *testing.T, dir string) []proc.Named {
	t.Helper()
	st, err := readPIDs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return st.Processes
}

// freeTCPPorts returns a port etcd with etcd+1 also free (etcd's peer port) and n more distinct
// free ports, all held until it returns so that no two picks collide.
func freeTCPPorts(t *testing.T, n int) (etcd int, others []int) {
	t.Helper()
	etcd, release := holdPortPair(t)
	defer release()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0") // cannot be etcd or etcd+1: both are held
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		others = append(others, l.Addr().(*net.TCPAddr).Port)
	}
	return etcd, others
}
