// Package clusterdns is the real-kubelet lab's cluster DNS: CoreDNS as the add-on a kubeadm
// cluster runs (Deployment and ConfigMap kube-system/coredns, Service kube-system/kube-dns at
// the tenth address of each service CIDR, which every kubelet gives its pods as nameserver),
// served over the pod network and the Service datapath under test like any workload. The e2e
// suite finds it by the label k8s-app=kube-dns; its DNS configMap specs rewrite the ConfigMap
// and delete the pods. Manifest renders coredns.yaml; the lab applies it with kubectl.
package clusterdns

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// DefaultDomain is the cluster domain (kubelet's clusterDomain, the kubernetes plugin's zone).
const DefaultDomain = "cluster.local"

// The objects' names, as kubeadm and the e2e suite know them.
const (
	Namespace  = "kube-system"
	Deployment = "coredns"  // also the ConfigMap's name; the e2e suite tells CoreDNS by "coredns" in a pod's name
	Service    = "kube-dns" // and the pods' k8s-app label
	Replicas   = 2          // one per node of the default lab (preferred anti-affinity)
)

//go:embed coredns.yaml
var manifest string

var tmpl = template.Must(template.New("coredns.yaml").Option("missingkey=error").Parse(manifest))

// Config is what the manifest needs from the lab.
type Config struct {
	Image      string       // an image with CoreDNS at /coredns (the lab's agnhost)
	ServiceIPs []netip.Addr // the kube-dns ClusterIPs: ServiceIPs of the service CIDRs
	Domain     string       // default DefaultDomain
}

// Manifest renders the add-on's objects as one multi-document YAML.
func Manifest(c Config) ([]byte, error) {
	if c.Image == "" || strings.ContainsAny(c.Image, " \n\"'") {
		return nil, fmt.Errorf("cluster DNS image %q: want an image reference", c.Image)
	}
	if len(c.ServiceIPs) == 0 || len(c.ServiceIPs) > 2 {
		return nil, fmt.Errorf("cluster DNS: %d ClusterIPs, want one or two (one per family)", len(c.ServiceIPs))
	}
	if len(c.ServiceIPs) == 2 && c.ServiceIPs[0].Is4() == c.ServiceIPs[1].Is4() {
		return nil, fmt.Errorf("cluster DNS ClusterIPs %v: want one per family", c.ServiceIPs)
	}
	if c.Domain == "" {
		c.Domain = DefaultDomain
	}
	var ips []string
	for _, ip := range c.ServiceIPs {
		ips = append(ips, ip.String())
	}
	policy := string(corev1.IPFamilyPolicySingleStack)
	if len(ips) == 2 {
		policy = string(corev1.IPFamilyPolicyRequireDualStack)
	}
	var b bytes.Buffer
	err := tmpl.Execute(&b, map[string]any{
		"Image": c.Image, "Domain": c.Domain, "Replicas": Replicas,
		"ClusterIP": ips[0], "ClusterIPs": strings.Join(ips, ", "), "IPFamilyPolicy": policy,
	})
	if err != nil {
		return nil, fmt.Errorf("render the cluster DNS manifest: %w", err)
	}
	return b.Bytes(), nil
}

// ServiceIPs are the kube-dns ClusterIPs for the apiserver's service CIDRs ("10.96.0.0/16,
// fd00:10:96::/112"): the tenth address of each, as kubeadm picks (10.96.0.10).
func ServiceIPs(serviceCIDRs string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range strings.Split(serviceCIDRs, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("service CIDR %q: %w", s, err)
		}
		a := p.Masked().Addr()
		for range 10 {
			a = a.Next()
		}
		if !p.Contains(a) {
			return nil, fmt.Errorf("service CIDR %s is too small for the cluster DNS address", p)
		}
		out = append(out, a)
	}
	return out, nil
}

// WaitReady waits until every replica of the Deployment is ready and the Service exists; on
// timeout the error names what its pods are waiting for.
func WaitReady(ctx context.Context, c kubernetes.Interface, timeout time.Duration) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = notReady(ctx, c)
		return last == nil, nil
	})
	if err != nil {
		return errors.Join(fmt.Errorf("cluster DNS (CoreDNS) not ready after %s", timeout), last)
	}
	return nil
}

func notReady(ctx context.Context, c kubernetes.Interface) error {
	d, err := c.AppsV1().Deployments(Namespace).Get(ctx, Deployment, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if _, err := c.CoreV1().Services(Namespace).Get(ctx, Service, metav1.GetOptions{}); err != nil {
		return err
	}
	if d.Status.ReadyReplicas == Replicas && d.Status.UpdatedReplicas == Replicas {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Deployment %s/%s: %d of %d replicas ready", Namespace, Deployment, d.Status.ReadyReplicas, Replicas)
	pods, err := c.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=" + Service})
	if err == nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "; pod %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil {
					fmt.Fprintf(&b, " (%s: %s)", w.Reason, w.Message)
				} else if !cs.Ready {
					fmt.Fprintf(&b, " (not ready, %d restarts)", cs.RestartCount)
				}
			}
		}
	}
	return errors.New(b.String())
}
