package nodeport

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
)

// TestNodePortPodTraffic: with the node's podCIDRs set (axon_np_pods), TCP
// and UDP to them leave the uplink LB untouched without being looked up;
// everything else is translated as before. The only way to tell "not looked
// up" from "looked up, no match" from outside is a frontend that would
// match, so the fixture has one inside the podCIDR (a misconfiguration the
// agent warns about).
func TestNodePortPodTraffic(t *testing.T) {
	logs := &logBuf{}
	f := newNPFix(t, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	// frontends inside node1's podCIDRs, one inside node2's, a normal one
	f.upsert(t, npVIP("10.244.1.50:80", lb.TCP, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npVIP("10.244.1.50:53", lb.UDP, npBE("10.244.2.5:5353", "node2")), FrontendOptions{})
	f.upsert(t, npVIP("[fd00:10:244:1::50]:80", lb.TCP, npBE("[fd00:10:244:2::5]:8080", "node2")), FrontendOptions{})
	f.upsert(t, npVIP("10.244.2.50:80", lb.TCP, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	if logs.String() != "" {
		t.Fatalf("warned before the podCIDRs were known: %s", logs)
	}

	flows := []struct {
		desc  string
		flow  Tuple
		inPod bool // inside node1's podCIDR: skipped once it is set
	}{
		{"TCP into node1's IPv4 podCIDR", npTCP("198.18.0.250:40000", "10.244.1.50:80"), true},
		{"UDP into node1's IPv4 podCIDR", npUDP("198.18.0.250:40001", "10.244.1.50:53"), true},
		{"TCP into node1's IPv6 podCIDR", npTCP("[fd00:198:18::250]:40002", "[fd00:10:244:1::50]:80"), true},
		{"TCP into node2's podCIDR", npTCP("198.18.0.250:40003", "10.244.2.50:80"), false},
		{"TCP to a LoadBalancer IP", npTCP("198.18.0.250:40004", "192.0.2.10:80"), false},
	}
	// check sends every flow's first packet through hook and wants it
	// translated (a CT entry, ct_new) unless skipped (untouched, not_service).
	check := func(t *testing.T, hook string, skipped func(inPod bool) bool) {
		for _, c := range flows {
			f.resetFlows(t)
			flags := uint8(npSYN)
			if c.flow.Proto == lb.UDP {
				flags = 0
			}
			in := f.wirePkt(c.flow, flags)
			before := f.counters(t)
			v, out := f.run(t, hook, in)
			moved := npMoved(before, f.counters(t), hook)
			_, hasCT := f.ctFor(t, c.flow)
			if skipped(c.inPod) {
				if v != npNext || !bytes.Equal(out, in) || hasCT || moved["not_service"] != 1 || len(moved) != 1 {
					t.Errorf("%s: verdict %s, changed %v, CT entry %v, counters %v; want next, untouched, no CT, not_service only",
						c.desc, v, !bytes.Equal(out, in), hasCT, moved)
				}
				continue
			}
			if !hasCT || moved["ct_new"] != 1 {
				t.Errorf("%s: verdict %s, CT entry %v, counters %v; want translated (ct_new)", c.desc, v, hasCT, moved)
			}
		}
	}
	never := func(bool) bool { return false }
	inPod := func(p bool) bool { return p }
	for _, hook := range npHooks {
		t.Run(hook+"/podCIDRs unknown: everything is looked up", func(t *testing.T) { check(t, hook, never) })
	}

	pods := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	if err := f.n.SetPodCIDRs(pods); err != nil {
		t.Fatal(err)
	}
	if got, err := f.n.PodCIDRs(); err != nil || !slices.Equal(got, pods) {
		t.Fatalf("PodCIDRs() = %v, %v; want %v", got, err, pods)
	}
	for _, want := range []string{`frontend="10.244.1.50:80/tcp (cluster)"`, `frontend="[fd00:10:244:1::50]:80/tcp (cluster)"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no warning naming %s; logs:\n%s", want, logs)
		}
	}
	if strings.Contains(logs.String(), "10.244.2.50") || strings.Contains(logs.String(), "192.0.2.10") {
		t.Errorf("warned about a frontend outside the podCIDRs:\n%s", logs)
	}
	for _, hook := range npHooks {
		t.Run(hook+"/podCIDRs set: pod traffic skips the lookups", func(t *testing.T) { check(t, hook, inPod) })
	}

	bad := []struct {
		desc string
		in   []netip.Prefix
		want string
	}{
		{"two IPv4 podCIDRs", []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.7.0/24")}, "two podCIDRs of one family"},
		{"invalid prefix", []netip.Prefix{{}}, "is not a prefix"},
	}
	for _, c := range bad {
		t.Run("bad input: "+c.desc, func(t *testing.T) {
			err := f.n.SetPodCIDRs(c.in)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			// the podCIDRs set before stay
			if got, err := f.n.PodCIDRs(); err != nil || !slices.Equal(got, pods) {
				t.Fatalf("after the error PodCIDRs() = %v, %v; want %v", got, err, pods)
			}
			check(t, "tc", inPod)
		})
	}

	if err := f.n.SetPodCIDRs(nil); err != nil {
		t.Fatal(err)
	}
	for _, hook := range npHooks {
		t.Run(hook+"/podCIDRs cleared: looked up again", func(t *testing.T) { check(t, hook, never) })
	}
}

// logBuf collects log output across goroutines.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestLBPodDeliveryMaps: DeliverPods needs the pod datapath's maps pinned in
// the same dir and says so; without it the LB leaves no pod map behind.
func TestLBPodDeliveryMaps(t *testing.T) {
	dptest.RequireRoot(t)
	pin := newPinDir(t)
	_, err := Load(Options{PinDir: pin, DeliverPods: true, Logger: dptest.Logger(t)})
	if err == nil || !strings.Contains(err.Error(), "load the pod datapath first") {
		t.Fatalf("DeliverPods without a pod datapath: err = %v, want one that says to load the pod datapath first", err)
	}
	np, err := Load(Options{PinDir: pin, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	for _, name := range podDeliveryMaps {
		if _, err := os.Stat(filepath.Join(pin, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("LB without DeliverPods: %s pinned under %s (stat: %v), want no pod map", name, pin, err)
		}
	}
	if _, err := os.Stat(filepath.Join(pin, MapService)); err != nil {
		t.Errorf("LB maps not pinned (the check above would pass for nothing): %v", err)
	}
}
