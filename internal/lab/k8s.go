package lab

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeClient builds an admin client from the kubeconfig recorded in lab.json.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load admin kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	cfg.Timeout = 15 * time.Second
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}

// ensureNodeObject creates (or updates) the Node with its podCIDRs and its
// InternalIP addresses, marked Ready.
func ensureNodeObject(ctx context.Context, c kubernetes.Interface, n Node) error {
	var cidrs []string
	for _, p := range n.PodCIDRs {
		cidrs = append(cidrs, p.String())
	}
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.Name,
			Labels: map[string]string{"kubernetes.io/hostname": n.Name, "axon.dev/lab": "true"},
		},
		Spec: corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
	}
	obj, err := c.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		obj, err = c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil && len(obj.Spec.PodCIDRs) > 0 && fmt.Sprint(obj.Spec.PodCIDRs) != fmt.Sprint(cidrs) {
			return fmt.Errorf("node %s already exists with podCIDRs %v (want %v): run `axon lab down` first", n.Name, obj.Spec.PodCIDRs, cidrs)
		}
	}
	if err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	obj.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: n.Name}}
	for _, ip := range n.IPs {
		obj.Status.Addresses = append(obj.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	obj.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AxonLab",
		Message: "lab node", LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update node %s status: %w", n.Name, err)
	}
	return nil
}

// createPodObject creates the scheduled Pod (spec.nodeName set), as the
// scheduler would before the kubelet runs CNI ADD.
func createPodObject(ctx context.Context, c kubernetes.Interface, p Pod, annotations map[string]string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, Annotations: annotations,
			Labels: map[string]string{"app": "axon-lab", "axon.dev/node": p.Node, "axon.dev/datapath": p.Datapath},
		},
		Spec: corev1.PodSpec{
			NodeName:   p.Node,
			Containers: []corev1.Container{{Name: "app", Image: "axon.dev/lab-netns:latest", Ports: demoHostPorts(p)}}, // demo hostPorts (check_external_hostport.go)
		},
	}
	_, err := c.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Left over from a crashed run: replace it.
		if err := deletePodObject(ctx, c, p); err != nil {
			return err
		}
		_, err = c.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// setPodRunning writes status.podIP(s), hostIP and phase Running, as the kubelet would.
func setPodRunning(ctx context.Context, c kubernetes.Interface, p Pod, hostIPs []netip.Addr) error {
	obj, err := c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	now := metav1.Now()
	st := &obj.Status
	st.Phase = corev1.PodRunning
	st.StartTime = &now
	st.PodIP, st.PodIPs = "", nil
	for _, ip := range p.IPs {
		if st.PodIP == "" {
			st.PodIP = ip.String()
		}
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	st.HostIP, st.HostIPs = "", nil
	for _, ip := range hostIPs {
		if st.HostIP == "" {
			st.HostIP = ip.String()
		}
		st.HostIPs = append(st.HostIPs, corev1.HostIP{IP: ip.String()})
	}
	st.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	st.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "app", Ready: true, Image: obj.Spec.Containers[0].Image,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
	}}
	if _, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update pod %s/%s status: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// deletePodObject deletes the Pod at once (no kubelet will confirm a graceful deletion).
func deletePodObject(ctx context.Context, c kubernetes.Interface, p Pod) error {
	zero := int64(0)
	err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}
