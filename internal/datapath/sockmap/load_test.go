package sockmap

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

// newPinDir returns a fresh pin dir under /sys/fs/bpf, uninstalled and
// removed at cleanup.
func newPinDir(t testing.TB) string {
	t.Helper()
	return dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, Uninstall)
}

// loadTest loads the bypass into a fresh pin dir, attached to a fresh test
// cgroup, and returns it with the cgroup's path and directory fd (for
// helper processes). Closed at cleanup (the pin dir's cleanup uninstalls).
func loadTest(t *testing.T, cfg Config) (*Bypass, string, string, int) {
	t.Helper()
	dptest.RequireRoot(t)
	pin := newPinDir(t)
	cg, fd := testutil.NewCgroup(t, "axt-sockmap-")
	b, err := Load(pin, cg, guardCfg(cfg), dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, pin, cg, fd
}

// sockOpsOn lists the programs attached to cgroup cg as sock_ops.
func sockOpsOn(t *testing.T, cg string) []string {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatalf("query sock_ops of %s: %v", cg, err)
	}
	var names []string
	for _, p := range res.Programs {
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			t.Fatal(err)
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, info.Name)
	}
	return names
}

// Load pins the maps and the link, Close keeps them, a second Load adopts
// them (the link is updated in place, entries stay), Uninstall removes all.
func TestLoadAdoptUninstall(t *testing.T) {
	b, pin, cg, _ := loadTest(t, Config{MaxEntries: 128})
	for _, name := range append(slices.Clone(pinnedMaps), filepath.Join("links", LinkPin)) {
		if _, err := os.Stat(filepath.Join(pin, name)); err != nil {
			t.Errorf("pin %s: %v", name, err)
		}
	}
	if got := sockOpsOn(t, cg); !slices.Equal(got, []string{"axon_sockops"}) {
		t.Fatalf("sock_ops programs on the test cgroup: %v, want [axon_sockops]", got)
	}
	pod := netip.MustParseAddr("10.1.2.3")
	if err := b.SetPod(pod, 77); err != nil {
		t.Fatal(err)
	}
	if err := b.SetNetns(77); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := sockOpsOn(t, cg); len(got) != 1 {
		t.Fatalf("after Close the program must stay attached: %v", got)
	}
	b2, err := Load(pin, cg, guardCfg(Config{MaxEntries: 128}), dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if got := sockOpsOn(t, cg); len(got) != 1 {
		t.Fatalf("a second Load must update the link, not add one: %v", got)
	}
	pods, err := b2.Pods()
	if err != nil || pods[pod] != 77 || len(pods) != 1 {
		t.Fatalf("pods after adoption: %v, %v; want %s -> 77", pods, err, pod)
	}
	ns, err := b2.Netns()
	if err != nil || !slices.Equal(ns, []uint64{77}) {
		t.Fatalf("netns after adoption: %v, %v", ns, err)
	}
	// another size is not adopted silently
	_, err = Load(pin, cg, guardCfg(Config{MaxEntries: 256}), dptest.Logger(t))
	if err == nil || !errors.Is(err, ebpf.ErrMapIncompatible) || !strings.Contains(err.Error(), "Uninstall") {
		t.Fatalf("Load with another MaxEntries over pinned maps: %v, want an incompatible-map error that says to uninstall", err)
	}
	if err := Uninstall(pin); err != nil {
		t.Fatal(err)
	}
	if got := sockOpsOn(t, cg); len(got) != 0 {
		t.Fatalf("after Uninstall: %v still attached", got)
	}
	for _, name := range append(slices.Clone(pinnedMaps), filepath.Join("links", LinkPin)) {
		if _, err := os.Stat(filepath.Join(pin, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin %s after Uninstall: %v", name, err)
		}
	}
	if err := Uninstall(pin); err != nil {
		t.Fatalf("a second Uninstall: %v", err)
	}
}

// Every input that enters the maps is validated, with an error that says
// what is wrong.
func TestSetPodValidates(t *testing.T) {
	b, _, _, _ := loadTest(t, Config{})
	for _, tc := range []struct {
		ip    string
		netns uint64
		want  string
	}{
		{"", 5, "no address"},
		{"127.0.0.1", 5, "cannot be a pod's"},
		{"::", 5, "cannot be a pod's"},
		{"fe80::1%eth0", 5, "zone"},
		{"224.0.0.1", 5, "cannot be a pod's"},
		{"10.0.0.1", 0, "cookie 0"},
	} {
		var ip netip.Addr
		if tc.ip != "" {
			ip = netip.MustParseAddr(tc.ip)
		}
		err := b.SetPod(ip, tc.netns)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetPod(%q, %d) = %v, want an error containing %q", tc.ip, tc.netns, err, tc.want)
		}
	}
	if err := b.SetNetns(0); err == nil {
		t.Error("SetNetns(0) accepted")
	}
	pods, err := b.Pods()
	if err != nil || len(pods) != 0 {
		t.Fatalf("rejected input reached the map: %v, %v", pods, err)
	}
	// v4-mapped input is stored as IPv4, and deleted by either spelling
	if err := b.SetPod(netip.MustParseAddr("::ffff:10.9.9.9"), 3); err != nil {
		t.Fatal(err)
	}
	if pods, _ := b.Pods(); pods[netip.MustParseAddr("10.9.9.9")] != 3 {
		t.Fatalf("v4-mapped pod address: %v", pods)
	}
	if err := b.DeletePod(netip.MustParseAddr("10.9.9.9")); err != nil {
		t.Fatal(err)
	}
	if err := b.DeletePod(netip.MustParseAddr("10.9.9.9")); err != nil {
		t.Fatalf("deleting a missing pod: %v", err)
	}
	if pods, _ := b.Pods(); len(pods) != 0 {
		t.Fatalf("after DeletePod: %v", pods)
	}
}

// A counter map pinned by an agent with fewer counters (before the sidecar
// counters) is replaced by Load, counters from 0, instead of failing the
// adoption of every other map; the pinned pod admissions stay.
func TestLoadReplacesCounterMapOfAnotherSize(t *testing.T) {
	b, pin, cg, _ := loadTest(t, Config{MaxEntries: 128})
	pod := netip.MustParseAddr("10.1.2.4")
	if err := b.SetPod(pod, 78); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(pin, MapMetrics)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: MapMetrics, Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 14})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(path); err != nil {
		t.Fatal(err)
	}
	old.Close()
	b2, err := Load(pin, cg, guardCfg(Config{MaxEntries: 128}), dptest.Logger(t))
	if err != nil {
		t.Fatalf("Load over a pinned counter map of 14 counters: %v", err)
	}
	defer b2.Close()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.MaxEntries() != uint32(len(metricNames)) {
		t.Fatalf("pinned %s holds %d counters, want %d", MapMetrics, m.MaxEntries(), len(metricNames))
	}
	got, err := b2.Metrics()
	if err != nil || len(got) != len(metricNames) {
		t.Fatalf("Metrics after the replacement: %v, %v", got, err)
	}
	if pods, err := b2.Pods(); err != nil || pods[pod] != 78 {
		t.Fatalf("pods after the replacement: %v, %v; want %s -> 78 adopted", pods, err, pod)
	}
}
