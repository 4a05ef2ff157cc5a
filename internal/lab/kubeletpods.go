package lab

// Pods that kubelet runs in a --kubelet lab, as lab targets: `axon lab exec <namespace>/<pod>`,
// `axon lab status` and the pod matrix of `axon lab check` (check.go) enter them through the
// process of one of their containers, the way the lab enters its own pods through their netns.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/lab/kubenode"
)

// ContainerProcess is where one container of a kubelet pod runs.
type ContainerProcess struct {
	PID    int    // its first process
	Netns  string // /proc/<PID>/ns/net: the pod's network namespace
	Cgroup string // the container's cgroup2 directory, below the node's (KubeletNodeCgroup)
}

// KubeletContainer finds the process of p's container named container ("": the first) on a
// --kubelet lab node: kubelet puts it in <node cgroup>/kubepods/<qos class>/pod<uid>/<id>
// (Guaranteed pods right under kubepods).
func KubeletContainer(p corev1.Pod, container string) (ContainerProcess, error) {
	var id string
	for _, cs := range p.Status.ContainerStatuses {
		if (container == "" || cs.Name == container) && cs.ContainerID != "" {
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
			break
		}
	}
	if id == "" {
		return ContainerProcess{}, fmt.Errorf("pod %s/%s: no started container %q (phase %s)", p.Namespace, p.Name, container, p.Status.Phase)
	}
	root, err := KubeletNodeCgroup(p.Spec.NodeName)
	if err != nil {
		return ContainerProcess{}, err
	}
	qos := strings.ToLower(string(p.Status.QOSClass))
	if p.Status.QOSClass == corev1.PodQOSGuaranteed {
		qos = ""
	}
	cg := filepath.Join(root, "kubepods", qos, "pod"+string(p.UID), id)
	b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil {
		return ContainerProcess{}, fmt.Errorf("pod %s/%s: container cgroup: %w", p.Namespace, p.Name, err)
	}
	pid, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil {
		return ContainerProcess{}, fmt.Errorf("pod %s/%s: no process in %s", p.Namespace, p.Name, cg)
	}
	return ContainerProcess{PID: pid, Netns: fmt.Sprintf("/proc/%d/ns/net", pid), Cgroup: cg}, nil
}

// kubeletPod finds the pod name ("<namespace>/<pod>", or "<pod>" when one namespace has it)
// among the pods kubelet runs on the lab's nodes.
func (l *Lab) kubeletPod(ctx context.Context, name string) (corev1.Pod, error) {
	kube, err := l.Kube()
	if err != nil {
		return corev1.Pod{}, err
	}
	if ns, pod, ok := strings.Cut(name, "/"); ok {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return corev1.Pod{}, err
		}
		return *p, nil
	}
	list, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return corev1.Pod{}, err
	}
	switch len(list.Items) {
	case 0:
		return corev1.Pod{}, fmt.Errorf("no pod %q in any namespace", name)
	case 1:
		return list.Items[0], nil
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	return corev1.Pod{}, fmt.Errorf("pod name %q is in several namespaces: use one of %s", name, strings.Join(names, ", "))
}

// KubeletPods lists the pods kubelet runs on the lab's nodes (all namespaces).
func (l *Lab) KubeletPods(ctx context.Context) ([]corev1.Pod, error) {
	kube, err := l.Kube()
	if err != nil {
		return nil, err
	}
	list, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	return list.Items, nil
}

// The pods of the pod matrix of `axon lab check` in a --kubelet lab: two DaemonSets of pause
// pods, so that every node runs two pods to probe from and to (same node and across).
const (
	// CheckNamespace holds them; `axon lab check` creates it and leaves it for the next run.
	CheckNamespace = "axon-lab-check"
	checkPodsReady = 2 * time.Minute
)

var checkDaemonSets = []string{"probe-a", "probe-b"}

// ensureCheckPods creates the check's DaemonSets (if missing) and returns their pods once every
// node runs one of each, Running with an address.
func ensureCheckPods(ctx context.Context, kube kubernetes.Interface, nodes int) ([]corev1.Pod, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: CheckNamespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", CheckNamespace, err)
	}
	for _, name := range checkDaemonSets {
		if _, err := kube.AppsV1().DaemonSets(CheckNamespace).Create(ctx, checkDaemonSet(name), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create DaemonSet %s/%s: %w", CheckNamespace, name, err)
		}
	}
	var pods []corev1.Pod
	err := pollUntil(ctx, checkPodsReady, func() (bool, error) {
		list, err := kube.CoreV1().Pods(CheckNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				pods = append(pods, p)
			}
		}
		if want := nodes * len(checkDaemonSets); len(pods) != want {
			return false, fmt.Errorf("%d of %d probe pods Running with an address", len(pods), want)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("probe pods in namespace %s: %w (kubectl describe pods -n %s)", CheckNamespace, err, CheckNamespace)
	}
	return pods, nil
}

// checkDaemonSet is one of the check's DaemonSets: the pause image every node imported, never
// pulled; the probes run in its netns and cgroup, not in the container's image.
func checkDaemonSet(name string) *appsv1.DaemonSet {
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "axon-lab-check"}
	var grace int64
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: CheckNamespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{
						Name: "pause", Image: kubenode.DefaultPauseImage, ImagePullPolicy: corev1.PullNever,
					}},
				},
			},
		},
	}
}
