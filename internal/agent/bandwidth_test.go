package agent

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bwm"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/testutil"
)

const netlinkHandleRoot = 0xFFFFFFFF // netlink.HANDLE_ROOT

// Ports of this file's control plane (each test file has its own).
const (
	bwTestAPIPort  = 16613
	bwTestEtcdPort = 12549
)

func TestBandwidthConfigValidate(t *testing.T) {
	for _, c := range []struct {
		desc    string
		mod     func(*Config)
		wantErr string
	}{
		{"off by default", func(*Config) {}, ""},
		{"on", func(c *Config) { c.BandwidthManager = true }, ""},
		{"bbr needs the manager", func(c *Config) { c.BandwidthBBR = true }, "needs --bandwidth-manager"},
		{"bbr with the manager", func(c *Config) { c.BandwidthManager, c.BandwidthBBR = true, true }, ""},
		{"zero horizon", func(c *Config) { c.BandwidthManager, c.BandwidthHorizon = true, 0 }, "--bandwidth-horizon"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := Defaults()
			c.mod(&cfg)
			err := cfg.validateBandwidth()
			if (err == nil) != (c.wantErr == "") || (err != nil && !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("validateBandwidth() = %v, want %q", err, c.wantErr)
			}
		})
	}
}

// TestBandwidthAgainstAPIServer: Pod annotations on a real kube-apiserver
// become limits in the BPF maps; bad values raise a Warning Event on the Pod
// and leave that direction unlimited; added/changed/removed annotations apply
// to the running pod; status and the bandwidth route say what happened.
func TestBandwidthAgainstAPIServer(t *testing.T) {
	cp := startControlPlaneOn(t, bwTestAPIPort, bwTestEtcdPort)
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))

	n := newScratchNode(t)
	pin := "/sys/fs/bpf/axt-agent-bw-" + testutil.RandSuffix(t)
	t.Cleanup(func() { testutil.InNetns(t, n.name, func() error { _ = podpath.Uninstall(pin); return nil }) })
	log := testLogger(t)
	cfg, reg := node1Config(t, pin, log)
	cfg.BandwidthManager = true
	k := runKube(t, cp, log)
	b := newBandwidth(cfg, log, reg, func() *kube { return k })
	t.Cleanup(func() {
		if b.bpf != nil {
			b.bpf.Close()
			b.nl.Close()
		}
		if b.broadcast != nil {
			b.broadcast.Shutdown()
		}
	})

	// three pods, each registered like axon-cni does
	pods := []struct {
		name string
		ip   string
		ann  map[string]string
	}{
		{"web", "10.244.1.5", map[string]string{bwm.EgressAnnotation: "10M", bwm.IngressAnnotation: "20M"}},
		{"bad", "10.244.1.6", map[string]string{bwm.EgressAnnotation: "abc", bwm.IngressAnnotation: "-5M"}},
		{"huge", "10.244.1.7", map[string]string{bwm.EgressAnnotation: "100P", bwm.IngressAnnotation: "5M"}},
		{"plain", "10.244.1.8", nil},
	}
	for i, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default", Annotations: p.ann},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		_, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		must(t, err)
		must(t, reg.Put(api.Endpoint{ContainerID: "c" + p.name, IfName: "eth0", Netns: "/run/netns/none", PodName: p.name,
			PodNamespace: "default", IPs: []netip.Addr{netip.MustParseAddr(p.ip)}, HostIfName: "lxcbw" + p.name,
			HostIfIndex: 100 + i, HostMAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}, PodMAC: net.HardwareAddr{2, 0, 0, 0, 2, byte(i)}}))
	}
	waitUntil(t, 30*time.Second, "pod cache synced", func() bool {
		if !k.isSynced() {
			return false
		}
		l, _ := k.pods.List(labels.Everything())
		return len(l) == len(pods)
	})

	reconcile := func() { testutil.InNetns(t, n.name, func() error { b.reconcile("eth0"); return nil }) }
	rows := func() map[string]string {
		rep, err := b.maps()
		must(t, err)
		out := map[string]string{}
		for _, r := range rep.Rows {
			out[r.Pod+"/"+r.Direction] = r.Rate
		}
		return out
	}
	reconcile()
	got := rows()
	want := map[string]string{"default/web/egress": "10M", "default/web/ingress": "20M", "default/huge/ingress": "5M"}
	if !mapsEqual(got, want) {
		t.Fatalf("limits %v, want %v", got, want)
	}
	st := b.status()
	t.Logf("status: %+v", st)
	if !st.Enabled || st.LimitedPods != 2 || len(st.Problems) != 2 {
		t.Fatalf("status %+v: want enabled, 2 limited pods, 2 pods with problems", st)
	}
	for _, p := range st.Problems {
		if !strings.Contains(p, "stays unlimited") {
			t.Errorf("problem %q does not say what happens", p)
		}
	}

	t.Run("invalid values raise one Warning Event per value", func(t *testing.T) {
		waitEvents(t, cs, "bad", 2, "not a Kubernetes quantity", "must be positive")
		waitEvents(t, cs, "huge", 1, "unreasonably large")
		reconcile() // same bad values again: no new Event
		time.Sleep(500 * time.Millisecond)
		if evs := podEvents(t, cs, "bad"); countEvents(evs) != 2 {
			t.Fatalf("after a second reconcile: %d events (count summed), want still 2", countEvents(evs))
		}
	})

	t.Run("added, changed and removed annotations apply live", func(t *testing.T) {
		setAnn := func(name string, ann map[string]string) {
			t.Helper()
			p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			must(t, err)
			p.Annotations = ann
			_, err = cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{})
			must(t, err)
		}
		waitRows := func(want map[string]string) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				reconcile()
				got := rows()
				if mapsEqual(got, want) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("limits %v, want %v", got, want)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		setAnn("plain", map[string]string{bwm.EgressAnnotation: "50M"}) // added
		setAnn("web", map[string]string{bwm.EgressAnnotation: "100M"})  // changed, ingress removed
		setAnn("huge", nil)                                             // removed
		setAnn("bad", map[string]string{bwm.EgressAnnotation: "1G"})    // fixed
		waitRows(map[string]string{"default/plain/egress": "50M", "default/web/egress": "100M", "default/bad/egress": "1G"})
		if st := b.status(); len(st.Problems) != 0 || st.LimitedPods != 3 {
			t.Fatalf("status after the fixes: %+v", st)
		}
	})

	t.Run("fq missing on the uplink: status says so, the agent re-applies it", func(t *testing.T) {
		fq := false
		for _, f := range datapath.Probe().List() {
			if f.Name == "sch_fq" {
				fq = f.Available
			}
		}
		d := b.decision()
		if !fq {
			// this kernel cannot have fq at all: egress is reported as not enforced
			if d.Value != "degraded" || !strings.Contains(d.Reason, "egress NOT enforced") {
				t.Fatalf("decision without sch_fq: %+v", d)
			}
			return
		}
		if d.Value != "enabled" || b.status().Qdisc == "" {
			t.Fatalf("decision with sch_fq: %+v", d)
		}
		eth0, err := n.nl.LinkByName("eth0")
		must(t, err)
		qs, err := n.nl.QdiscList(eth0)
		must(t, err)
		for _, q := range qs {
			if q.Attrs().Parent == netlinkHandleRoot {
				must(t, n.nl.QdiscDel(q))
			}
		}
		testutil.InNetns(t, n.name, func() error { // one pass of bandwidthLoop
			b.mu.Lock()
			b.ensureQdiscLocked()
			b.mu.Unlock()
			return nil
		})
		st := b.status()
		if st.QdiscRepairs != 1 || st.LastRepair == "" || st.Qdisc == "" {
			t.Fatalf("after deleting the root qdisc: %+v", st)
		}
		if d := b.decision(); !strings.Contains(d.Reason, "fq re-applied 1 time") {
			t.Fatalf("decision does not report the repair: %+v", d)
		}
		t.Logf("repair: %s", st.LastRepair)
	})

	t.Run("a deleted pod loses its limit", func(t *testing.T) {
		must(t, cs.CoreV1().Pods("default").Delete(ctx, "plain", metav1.DeleteOptions{}))
		must(t, reg.Delete(api.Attachment{ContainerID: "cplain", IfName: "eth0"}))
		reconcile()
		if _, ok := rows()["default/plain/egress"]; ok {
			t.Fatalf("limit of the deleted pod still programmed: %v", rows())
		}
	})
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func podEvents(t *testing.T, cs kubernetes.Interface, pod string) []corev1.Event {
	t.Helper()
	l, err := cs.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": pod, "involvedObject.kind": "Pod"}.String()})
	must(t, err)
	return l.Items
}

func countEvents(evs []corev1.Event) int {
	n := 0
	for _, e := range evs {
		n += int(max(e.Count, 1))
	}
	return n
}

// waitEvents waits for n InvalidBandwidth Warning events on pod whose
// messages contain each of msgs.
func waitEvents(t *testing.T, cs kubernetes.Interface, pod string, n int, msgs ...string) {
	t.Helper()
	var evs []corev1.Event
	waitUntil(t, 15*time.Second, "events on pod "+pod, func() bool {
		evs = podEvents(t, cs, pod)
		return len(evs) >= n
	})
	var all []string
	for _, e := range evs {
		if e.Type != corev1.EventTypeWarning || e.Reason != "InvalidBandwidth" || e.Source.Component != "axon-agent" {
			t.Errorf("event %s/%s from %q: %s", e.Type, e.Reason, e.Source.Component, e.Message)
		}
		all = append(all, e.Message)
	}
	for _, m := range msgs {
		if !strings.Contains(strings.Join(all, "\n"), m) {
			t.Errorf("no event on %s says %q: %q", pod, m, all)
		}
	}
}
