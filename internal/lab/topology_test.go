package lab

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/brnf"
	"github.com/axonhq/axon/internal/lab/probe"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func TestAddressPlan(t *testing.T) {
	tests := []struct {
		i                  int
		v4, v6, pod4, pod6 string
		base4, base6       string
	}{
		{1, "198.18.0.11", "fd00:198:18::11", "10.244.1.0/24", "fd00:10:244:1::/64", "10.245.1.0/24", "fd00:10:245:1::/64"},
		{12, "198.18.0.22", "fd00:198:18::22", "10.244.12.0/24", "fd00:10:244:12::/64", "10.245.12.0/24", "fd00:10:245:12::/64"},
	}
	for _, tc := range tests {
		n := newNode("/run/x", "/cg/axon-lab", tc.i)
		got := []string{n.IPs[0].String(), n.IPs[1].String(), n.PodCIDRs[0].String(), n.PodCIDRs[1].String(), n.BaselineCIDRs[0].String(), n.BaselineCIDRs[1].String()}
		want := []string{tc.v4, tc.v6, tc.pod4, tc.pod6, tc.base4, tc.base6}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("node %d: got %v, want %v", tc.i, got, want)
		}
		if n.IP != n.IPs[0] || n.Netns != "axonlab-node"+strconv.Itoa(tc.i) || n.PinDir != filepath.Join(PinRoot, n.Name) || n.Cgroup != "/cg/axon-lab/"+n.Name {
			t.Errorf("node %d: %+v", tc.i, n)
		}
	}
	if e := newExternal(); e.IP.String() != "198.18.0.250" || e.IPs[1].String() != "fd00:198:18::250" {
		t.Errorf("external = %+v", e)
	}
}

// TestTopology builds the wire, two nodes and external (no control plane)
// and checks reachability over the wire, forwarding sysctls, the baseline
// routes, the external's lack of pod routes and the SNMP reader; then
// removes everything by name.
func TestTopology(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	if names, _ := labNetns(); len(names) > 0 {
		t.Skipf("lab namespaces exist (%v): run `axon lab down` to let the test run", names)
	}
	t.Cleanup(func() {
		if err := deleteAllLabNetns(); err != nil {
			t.Error(err)
		}
		if names, _ := labNetns(); len(names) > 0 {
			t.Errorf("namespaces left: %v", names)
		}
	})
	st := &State{External: newExternal()}
	for i := 1; i <= 2; i++ {
		st.Nodes = append(st.Nodes, newNode(t.TempDir(), "", i))
	}
	// br_netfilter's switches as the host has them (absent without it)
	hostBrnf := map[string]string{}
	for _, tb := range brnf.Tables() {
		if b, err := os.ReadFile(brnf.Path(tb)); err == nil {
			hostBrnf[tb] = string(b)
		}
	}
	if err := createWire(); err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if err := plugIntoWire(n.Netns, n.Name, wirePrefixes(n.IPs), true); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range st.Nodes {
		if err := addBaselineRoutes(n, st.Nodes); err != nil {
			t.Fatal(err)
		}
	}
	if err := plugIntoWire(st.External.Netns, ExternalName, wirePrefixes(st.External.IPs), false); err != nil {
		t.Fatal(err)
	}
	run := func(ns string, argv ...string) (string, error) {
		out, err := exec.Command("nsenter", append([]string{"--net=" + netnsutil.Path(ns), "--"}, argv...)...).CombinedOutput()
		return string(out), err
	}
	for _, tc := range []struct{ from, to string }{
		{"axonlab-node1", "198.18.0.12"}, {"axonlab-node1", "fd00:198:18::12"},
		{"axonlab-node2", "198.18.0.11"}, {"axonlab-external", "fd00:198:18::11"},
		{"axonlab-external", "198.18.0.12"},
	} {
		var sent, recv int
		err := netnsutil.Do(tc.from, func() (err error) {
			sent, recv, err = probe.Ping(t.Context(), netip.MustParseAddr(tc.to), 3, 100*time.Millisecond, 2*time.Second, false)
			return err
		})
		if err != nil || recv != sent {
			t.Errorf("ping %s from %s: %d/%d replies, %v", tc.to, tc.from, recv, sent, err)
		}
	}
	out, _ := run("axonlab-node1", "ip", "route", "show", "10.245.2.0/24")
	if !strings.Contains(out, "via 198.18.0.12 dev eth0") {
		t.Errorf("node1 baseline route to node2: %q", out)
	}
	out, _ = run("axonlab-node1", "ip", "-6", "route", "show", "fd00:10:245:2::/64")
	if !strings.Contains(out, "via fd00:198:18::12 dev eth0") {
		t.Errorf("node1 baseline IPv6 route to node2: %q", out)
	}
	if out, _ := run("axonlab-external", "ip", "route", "get", "10.244.1.5"); !strings.Contains(out, "unreachable") && out != "" {
		// `ip route get` fails with "Network is unreachable" when there is no route.
		t.Errorf("external has a route to a pod CIDR: %q", out)
	}
	for _, tc := range []struct{ ns, key, want string }{
		{"axonlab-node1", "net/ipv4/ip_forward", "1"},
		{"axonlab-node1", "net/ipv6/conf/all/forwarding", "1"},
		{"axonlab-node1", "net/ipv6/conf/eth0/accept_dad", "0"},
		{"axonlab-external", "net/ipv4/ip_forward", "0"},
	} {
		out, err := run(tc.ns, "cat", "/proc/sys/"+tc.key)
		if err != nil || strings.TrimSpace(out) != tc.want {
			t.Errorf("%s %s = %q (%v), want %s", tc.ns, tc.key, out, err, tc.want)
		}
	}
	// the wire runs no netfilter; the host's own bridges keep theirs
	for _, tb := range brnf.Tables() {
		out, err := run(WireNetns, "cat", brnf.Path(tb))
		if _, loaded := hostBrnf[tb]; !loaded {
			continue // no br_netfilter here
		}
		if err != nil || strings.TrimSpace(out) != "0" {
			t.Errorf("%s: bridge-nf-call-%s = %q (%v), want 0", WireNetns, tb, out, err)
		}
		if b, err := os.ReadFile(brnf.Path(tb)); err != nil || string(b) != hostBrnf[tb] {
			t.Errorf("host bridge-nf-call-%s changed from %q to %q (%v)", tb, hostBrnf[tb], b, err)
		}
	}
	if _, err := ReadSNMP("axonlab-node1", "Ip", "ForwDatagrams"); err != nil {
		t.Error(err)
	}
	if _, err := netnsutil.ReadNetCounter(netnsutil.Path("axonlab-node1"), "netstat", "TcpExt", "TCPDSACKRecvSegs"); err != nil {
		t.Error(err)
	}
	if _, err := netnsutil.ReadNetCounter(netnsutil.Path("axonlab-node1"), "netstat", "TcpExt", "NoSuchCounter"); err == nil {
		t.Error("ReadNetCounter of an unknown counter: want an error")
	}
	if _, err := ReadSNMP("axonlab-node1", "Ip", "NoSuchCounter"); err == nil {
		t.Error("ReadSNMP of an unknown counter: want an error")
	}
}

// TestNetnsDirShared: after createNetns, /run/netns is a shared mount point
// (as iproute2 makes it), so a later `ip netns add` does not bind the
// directory over our namespace files and deleteNetns can still remove them.
func TestNetnsDirShared(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	a, b := "axt-nsdir-a", "axt-nsdir-b"
	t.Cleanup(func() {
		_ = deleteNetns(a)
		_ = exec.Command("ip", "netns", "del", b).Run()
	})
	if err := createNetns(a); err != nil {
		t.Fatal(err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	shared := false
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 6 && f[4] == netnsutil.Dir && strings.Contains(line, " shared:") {
			shared = true
		}
	}
	if !shared {
		t.Errorf("%s is not a shared mount point after createNetns:\n%s", netnsutil.Dir, mi)
	}
	if out, err := exec.Command("ip", "netns", "add", b).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", b, err, out)
	}
	if err := deleteNetns(a); err != nil {
		t.Fatalf("deleteNetns after `ip netns add`: %v", err)
	}
	if _, err := os.Lstat(netnsutil.Path(a)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after deleteNetns: %v", netnsutil.Path(a), err)
	}
}
