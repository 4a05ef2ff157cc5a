package agent

// The same-node TCP bypass on a node whose pods another CNI plugin networks
// (--mode=bypass-only): the local pods come from the kube-apiserver (this
// node's Pods and their status.podIPs) and each pod's network namespace is
// found on the node: the one namespace that holds the pod's addresses,
// among those of the node's processes (/proc/<pid>/ns/net) and the bind
// mounts under /run/netns. Pods are untrusted: an address held by two
// namespaces (a pod that configured another pod's address in its own) or
// claimed by two Pods is admitted in neither, with an Event on the Pod.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/axonhq/axon/internal/netnsutil"
)

// ReasonPodAddressConflict is the Warning Event on a Pod whose address is
// held by more than one network namespace of the node, or claimed by
// another Pod: the bypass admits neither.
const ReasonPodAddressConflict = "PodAddressConflict"

// netnsScanDirs are where bypass-only looks for bind-mounted network
// namespaces (besides /proc): ip netns, CNI runtimes (containerd, CRI-O
// pin theirs under /run/netns or /var/run/netns, often the same directory).
var netnsScanDirs = []string{netnsutil.Dir, "/var/run/netns"}

// scanNetns finds the node's network namespaces and their addresses.
func scanNetns() ([]netnsutil.Namespace, error) { return netnsutil.Scan("/proc", netnsScanDirs) }

// discoverPodsLocked lists this node's pods with the namespace that holds
// their addresses (s.mu held). Pods it cannot use go to notAdmitted with
// the reason.
func (s *sockBypass) discoverPodsLocked(k *kube, svc *serviceSync, notAdmitted map[string]string) []localPod {
	pods, err := k.pods.List(labels.Everything())
	if err != nil {
		s.log.Warn("list this node's pods", "error", err)
		return nil
	}
	spaces, err := s.scan()
	if err != nil {
		// the namespaces that could be read are used; a pod whose
		// namespace was not read is not admitted and says so
		if msg := err.Error(); msg != s.scanErr {
			s.scanErr = msg
			s.log.Warn("some network namespaces of the node could not be read", "error", err)
		}
	} else {
		s.scanErr = ""
	}
	holders := map[netip.Addr][]netnsutil.Namespace{}
	for _, n := range spaces {
		for _, a := range n.Addrs {
			holders[a] = append(holders[a], n)
		}
	}
	type candidate struct {
		name string
		pod  *corev1.Pod
		ips  []netip.Addr
	}
	var cands []candidate
	claims := map[netip.Addr][]string{}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // the node's netns, or gone: its address may be another pod's now
		}
		name := p.Namespace + "/" + p.Name
		var ips []netip.Addr
		bad := ""
		for _, pip := range p.Status.PodIPs {
			ip, err := netip.ParseAddr(pip.IP)
			if err != nil || ip.Zone() != "" {
				bad = fmt.Sprintf("status.podIPs has an invalid address %q", pip.IP)
				break
			}
			ips = append(ips, ip.Unmap())
		}
		switch {
		case bad != "":
			notAdmitted[name] = bad
			continue
		case len(ips) == 0:
			notAdmitted[name] = "no status.podIPs yet"
			continue
		}
		for _, ip := range ips {
			claims[ip] = append(claims[ip], name)
		}
		cands = append(cands, candidate{name, p, ips})
	}
	var out []localPod
	conflicts := map[string]string{}
	for _, c := range cands {
		var cookie uint64
		why := ""
		for _, ip := range c.ips {
			if others := claims[ip]; len(others) > 1 {
				why = fmt.Sprintf("address %s is claimed by %d Pods of this node (%s)", ip, len(others), strings.Join(others, ", "))
				break
			}
			h := holders[ip]
			if len(h) == 0 {
				why = fmt.Sprintf("no network namespace of this node holds %s (yet)", ip)
				break
			}
			if len(h) > 1 {
				var paths []string
				for _, n := range h {
					paths = append(paths, n.Path)
				}
				why = fmt.Sprintf("address %s is held by %d network namespaces of this node (%s): one of them impersonates the pod, which is not bypassed until only one holds it",
					ip, len(h), strings.Join(paths, ", "))
				break
			}
			if cookie != 0 && h[0].Cookie != cookie {
				why = fmt.Sprintf("the pod's addresses %v are held by different network namespaces", c.ips)
				break
			}
			cookie = h[0].Cookie
		}
		if why != "" {
			notAdmitted[c.name] = why
			if strings.Contains(why, "held by") || strings.Contains(why, "claimed by") {
				conflicts[c.name] = why
				if s.conflicts[c.name] != why { // once per conflict, not per reconcile
					s.log.Warn("same-node TCP bypass: pod not admitted", "pod", c.name, "reason", why)
				}
				svc.ev.emit(c.pod, "pod "+c.name, corev1.EventTypeWarning, ReasonPodAddressConflict,
					why+"; its connections take the TCP/IP stack")
			}
			continue
		}
		out = append(out, localPod{name: c.name, pod: c.pod, ips: slices.Clone(c.ips), cookie: cookie})
	}
	s.conflicts = conflicts
	return out
}
