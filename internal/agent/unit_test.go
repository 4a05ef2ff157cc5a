package agent

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/podpath"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

func TestDiffRoutes(t *testing.T) {
	r := func(dst, gw string, idx int) Route { return Route{Dst: pfx(dst), Gw: ip(gw), LinkIndex: idx} }
	tests := []struct {
		name             string
		desired, current []Route
		want             RoutePlan
	}{
		{name: "empty"},
		{
			name:    "add missing",
			desired: []Route{r("10.244.2.0/24", "198.18.0.12", 2), r("fd00:10:244:2::/64", "fd00:198:18::12", 2)},
			want:    RoutePlan{Add: []Route{r("10.244.2.0/24", "198.18.0.12", 2), r("fd00:10:244:2::/64", "fd00:198:18::12", 2)}},
		},
		{
			name:    "in sync changes nothing",
			desired: []Route{r("10.244.2.0/24", "198.18.0.12", 2)},
			current: []Route{r("10.244.2.0/24", "198.18.0.12", 2)},
		},
		{
			name:    "gateway changed",
			desired: []Route{r("10.244.2.0/24", "198.18.0.22", 2)},
			current: []Route{r("10.244.2.0/24", "198.18.0.12", 2)},
			want:    RoutePlan{Replace: []Route{r("10.244.2.0/24", "198.18.0.22", 2)}},
		},
		{
			name:    "device changed",
			desired: []Route{r("10.244.2.0/24", "198.18.0.12", 3)},
			current: []Route{r("10.244.2.0/24", "198.18.0.12", 2)},
			want:    RoutePlan{Replace: []Route{r("10.244.2.0/24", "198.18.0.12", 3)}},
		},
		{
			name:    "vanished node deleted",
			desired: []Route{r("10.244.2.0/24", "198.18.0.12", 2)},
			current: []Route{r("10.244.2.0/24", "198.18.0.12", 2), r("10.244.3.0/24", "198.18.0.13", 2)},
			want:    RoutePlan{Delete: []Route{r("10.244.3.0/24", "198.18.0.13", 2)}},
		},
		{
			name:    "podCIDR changed: add new, delete old",
			desired: []Route{r("10.244.9.0/24", "198.18.0.12", 2)},
			current: []Route{r("10.244.2.0/24", "198.18.0.12", 2)},
			want:    RoutePlan{Add: []Route{r("10.244.9.0/24", "198.18.0.12", 2)}, Delete: []Route{r("10.244.2.0/24", "198.18.0.12", 2)}},
		},
		{
			name:    "duplicate current route to the same dst is dropped",
			desired: []Route{r("10.244.2.0/24", "198.18.0.12", 2)},
			current: []Route{r("10.244.2.0/24", "198.18.0.12", 2), r("10.244.2.0/24", "198.18.0.99", 2)},
			want:    RoutePlan{Delete: []Route{r("10.244.2.0/24", "198.18.0.99", 2)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DiffRoutes(tt.desired, tt.current)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DiffRoutes =\n %+v\nwant\n %+v", got, tt.want)
			}
			if got.Empty() != (len(tt.want.Add)+len(tt.want.Replace)+len(tt.want.Delete) == 0) {
				t.Errorf("Empty() = %v", got.Empty())
			}
		})
	}
}

func TestDesiredRoutes(t *testing.T) {
	own := []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00:10:244:1::/64")}
	tests := []struct {
		name         string
		nodes        []NodeInfo
		want         []Route
		wantProblems []string
	}{
		{
			name:  "self is skipped",
			nodes: []NodeInfo{{Name: "node1", InternalIPs: []netip.Addr{ip("198.18.0.11")}, PodCIDRs: own}},
		},
		{
			name: "dual stack via the matching family",
			nodes: []NodeInfo{{Name: "node2", InternalIPs: []netip.Addr{ip("fd00:198:18::12"), ip("198.18.0.12")},
				PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24"), pfx("fd00:10:244:2::/64")}}},
			want: []Route{
				{Dst: pfx("10.244.2.0/24"), Gw: ip("198.18.0.12"), LinkIndex: 7, Node: "node2"},
				{Dst: pfx("fd00:10:244:2::/64"), Gw: ip("fd00:198:18::12"), LinkIndex: 7, Node: "node2"},
			},
		},
		{
			name: "v6 CIDR without v6 InternalIP is skipped",
			nodes: []NodeInfo{{Name: "node2", InternalIPs: []netip.Addr{ip("198.18.0.12")},
				PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24"), pfx("fd00:10:244:2::/64")}}},
			want:         []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("198.18.0.12"), LinkIndex: 7, Node: "node2"}},
			wantProblems: []string{"node node2: no IPv6 InternalIP for podCIDR fd00:10:244:2::/64: route skipped"},
		},
		{
			name:         "no InternalIP at all",
			nodes:        []NodeInfo{{Name: "node2", PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24")}}},
			wantProblems: []string{"node node2: no IPv4 InternalIP for podCIDR 10.244.2.0/24: route skipped"},
		},
		{
			name:         "overlap with own podCIDR",
			nodes:        []NodeInfo{{Name: "node2", InternalIPs: []netip.Addr{ip("198.18.0.12")}, PodCIDRs: []netip.Prefix{pfx("10.244.0.0/16")}}},
			wantProblems: []string{"node node2: podCIDR 10.244.0.0/16 overlaps this node's podCIDRs: route skipped"},
		},
		{
			name: "same CIDR on two nodes: first by name wins",
			nodes: []NodeInfo{
				{Name: "node3", InternalIPs: []netip.Addr{ip("198.18.0.13")}, PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24")}},
				{Name: "node2", InternalIPs: []netip.Addr{ip("198.18.0.12")}, PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24")}},
			},
			want:         []Route{{Dst: pfx("10.244.2.0/24"), Gw: ip("198.18.0.12"), LinkIndex: 7, Node: "node2"}},
			wantProblems: []string{"node node3: podCIDR 10.244.2.0/24 is also claimed by node node2: route skipped"},
		},
		{
			name:  "node without podCIDR gives no route",
			nodes: []NodeInfo{{Name: "node2", InternalIPs: []netip.Addr{ip("198.18.0.12")}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, problems := DesiredRoutes("node1", own, tt.nodes, 7)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("routes = %+v, want %+v", got, tt.want)
			}
			if !reflect.DeepEqual(problems, tt.wantProblems) {
				t.Errorf("problems = %q, want %q", problems, tt.wantProblems)
			}
		})
	}
}

func TestParsePodCIDRs(t *testing.T) {
	tests := []struct {
		name    string
		spec    corev1.NodeSpec
		want    []netip.Prefix
		wantErr string
	}{
		{name: "none", spec: corev1.NodeSpec{}},
		{name: "podCIDRs dual stack", spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
			want: []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00:10:244:1::/64")}},
		{name: "v6 listed first is sorted after v4", spec: corev1.NodeSpec{PodCIDRs: []string{"fd00:10:244:1::/64", "10.244.1.0/24"}},
			want: []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00:10:244:1::/64")}},
		{name: "fallback to podCIDR", spec: corev1.NodeSpec{PodCIDR: "10.244.3.0/24"}, want: []netip.Prefix{pfx("10.244.3.0/24")}},
		{name: "podCIDRs win over podCIDR", spec: corev1.NodeSpec{PodCIDR: "10.9.0.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
			want: []netip.Prefix{pfx("10.244.1.0/24")}},
		{name: "host bits masked", spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.7/24"}}, want: []netip.Prefix{pfx("10.244.1.0/24")}},
		{name: "duplicates dropped", spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "10.244.1.0/24"}}, want: []netip.Prefix{pfx("10.244.1.0/24")}},
		{name: "garbage", spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0"}}, wantErr: `podCIDR "10.244.1.0"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePodCIDRs(tt.spec)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestInternalIPs(t *testing.T) {
	st := corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node1"},
		{Type: corev1.NodeInternalIP, Address: "198.18.0.11"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.1"},
		{Type: corev1.NodeInternalIP, Address: "fd00:198:18::11"},
		{Type: corev1.NodeInternalIP, Address: "bogus"},
	}}
	want := []netip.Addr{ip("198.18.0.11"), ip("fd00:198:18::11")}
	if got := InternalIPs(st); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	if Cgroup2Mount() == "" {
		t.Skip("no cgroup2 filesystem mounted: the default --cgroup-root cannot be valid")
	}
	ok := Defaults()
	ok.NodeName = "node1"
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string
	}{
		{name: "defaults are valid", mod: func(*Config) {}},
		{name: "health addr", mod: func(c *Config) { c.HealthAddr = "127.0.0.1:9876" }},
		{name: "no node name", mod: func(c *Config) { c.NodeName = "" }, wantErr: "--node-name is empty"},
		{name: "bad attach mode", mod: func(c *Config) { c.AttachMode = "xdp" }, wantErr: `--attach-mode "xdp" is invalid: use one of auto|tcx|legacy`},
		{name: "bad host routing", mod: func(c *Config) { c.HostRouting = "fast" }, wantErr: `--host-routing "fast" is invalid`},
		{name: "bad health addr", mod: func(c *Config) { c.HealthAddr = "9876" }, wantErr: `--health-addr "9876" is invalid`},
		{name: "kube-proxy ports", mod: func(c *Config) { c.KubeProxyHealthzAddr, c.KubeProxyMetricsAddr = "0.0.0.0:10256", "127.0.0.1:10249" }},
		{name: "kube-proxy healthz with only the north-south LB", mod: func(c *Config) { c.SocketLB, c.KubeProxyHealthzAddr = false, "0.0.0.0:10256" }},
		{name: "bad kube-proxy healthz addr", mod: func(c *Config) { c.KubeProxyHealthzAddr = "10256" }, wantErr: `--kube-proxy-healthz-addr "10256" is invalid: use host:port such as 0.0.0.0:10256`},
		{name: "bad kube-proxy metrics addr", mod: func(c *Config) { c.KubeProxyMetricsAddr = "localhost" }, wantErr: `--kube-proxy-metrics-addr "localhost" is invalid: use host:port such as 127.0.0.1:10249`},
		{name: "empty state dir", mod: func(c *Config) { c.StateDir = "" }, wantErr: "--state-dir is empty"},
		{name: "empty socket", mod: func(c *Config) { c.Socket = "" }, wantErr: "--socket is empty"},
		{name: "empty bpf root", mod: func(c *Config) { c.BPFRoot = "" }, wantErr: "--bpf-root is empty"},
		{name: "zero interval", mod: func(c *Config) { c.ReconcileInterval = 0 }, wantErr: "must be positive"},
		{name: "negative probe interval", mod: func(c *Config) { c.APIServerProbeInterval = -time.Second }, wantErr: "--apiserver-probe-interval -1s must not be negative"},
		{name: "cgroup root missing", mod: func(c *Config) { c.CgroupRoot = "/nonexistent/axon-cg" }, wantErr: "--cgroup-root /nonexistent/axon-cg: no such file or directory: pass an existing cgroup v2 directory, or --socket-lb=false"},
		{name: "cgroup root not cgroup2", mod: func(c *Config) { c.CgroupRoot = "/proc" }, wantErr: "--cgroup-root /proc is not on a cgroup v2 filesystem"},
		{name: "cgroup root empty", mod: func(c *Config) { c.CgroupRoot = "" }, wantErr: "--cgroup-root is empty"},
		{name: "socket lb off ignores the cgroup root", mod: func(c *Config) { c.SocketLB, c.CgroupRoot = false, "/nonexistent" }},
		{name: "two errors at once", mod: func(c *Config) { c.AttachMode, c.HostRouting = "a", "b" }, wantErr: "--attach-mode \"a\" is invalid: use one of auto|tcx|legacy\n--host-routing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mod(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseLogLevel(t *testing.T) {
	for _, tt := range []struct {
		in      string
		wantErr bool
	}{{"debug", false}, {"info", false}, {"WARN", false}, {"error", false}, {"loud", true}} {
		_, err := ParseLogLevel(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseLogLevel(%q) err = %v", tt.in, err)
		}
	}
	if _, err := NewLogger("yaml", 0, os.Stderr); err == nil || !strings.Contains(err.Error(), "use text or json") {
		t.Errorf("NewLogger(yaml) err = %v", err)
	}
}

func TestDiffEndpoints(t *testing.T) {
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	e := func(addr string, idx int, pod string) MapEntry {
		return MapEntry{IP: ip(addr), IfIndex: idx, PodMAC: mac(pod), HostMAC: mac("02:00:00:00:00:01")}
	}
	tests := []struct {
		name             string
		desired, current []MapEntry
		wantUp           []MapEntry
		wantDel          []netip.Addr
	}{
		{name: "empty"},
		{name: "missing written", desired: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")}, wantUp: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")}},
		{name: "in sync untouched (no flush)", desired: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")}, current: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")}},
		{name: "ifindex changed", desired: []MapEntry{e("10.244.1.2", 9, "02:aa:00:00:00:02")}, current: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")},
			wantUp: []MapEntry{e("10.244.1.2", 9, "02:aa:00:00:00:02")}},
		{name: "pod MAC changed", desired: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:09")}, current: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")},
			wantUp: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:09")}},
		{name: "extra deleted", desired: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")},
			current: []MapEntry{e("fd00:10:244:1::3", 6, "02:aa:00:00:00:03"), e("10.244.1.2", 5, "02:aa:00:00:00:02"), e("10.244.1.3", 6, "02:aa:00:00:00:03")},
			wantDel: []netip.Addr{ip("10.244.1.3"), ip("fd00:10:244:1::3")}},
		{name: "duplicate desired: first wins", desired: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02"), e("10.244.1.2", 6, "02:aa:00:00:00:03")},
			wantUp: []MapEntry{e("10.244.1.2", 5, "02:aa:00:00:00:02")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up, del := DiffEndpoints(tt.desired, tt.current)
			if !reflect.DeepEqual(up, tt.wantUp) {
				t.Errorf("upsert = %+v, want %+v", up, tt.wantUp)
			}
			if !reflect.DeepEqual(del, tt.wantDel) {
				t.Errorf("delete = %v, want %v", del, tt.wantDel)
			}
		})
	}
}

func TestDesiredEntries(t *testing.T) {
	hostMAC, _ := net.ParseMAC("02:00:00:00:00:01")
	liveMAC, _ := net.ParseMAC("02:00:00:00:00:99")
	podMAC, _ := net.ParseMAC("02:aa:00:00:00:02")
	eps := []api.Endpoint{
		{ContainerID: "c1", IfName: "eth0", HostIfName: "lxc1", HostIfIndex: 4, HostMAC: hostMAC, PodMAC: podMAC, IPs: []netip.Addr{ip("10.244.1.2"), ip("fd00:10:244:1::2")}},
		{ContainerID: "c2", IfName: "eth0", HostIfName: "gone", HostIfIndex: 5, HostMAC: hostMAC, PodMAC: podMAC, IPs: []netip.Addr{ip("10.244.1.3")}},
	}
	links := map[string]linkInfo{"lxc1": {Index: 12, MAC: liveMAC}} // re-created: new index and MAC
	got := DesiredEntries(eps, func(n string) (linkInfo, bool) { l, ok := links[n]; return l, ok })
	want := []MapEntry{
		{IP: ip("10.244.1.2"), IfIndex: 12, PodMAC: podMAC, HostMAC: liveMAC},
		{IP: ip("fd00:10:244:1::2"), IfIndex: 12, PodMAC: podMAC, HostMAC: liveMAC},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestRegistry(t *testing.T) {
	dir := t.TempDir()
	r, err := openRegistry(dir, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	podMAC, _ := net.ParseMAC("02:aa:00:00:00:02")
	ep := api.Endpoint{ContainerID: "c1", IfName: "eth0", HostIfName: "lxc1", PodMAC: podMAC, IPs: []netip.Addr{ip("10.244.1.2")}, Created: time.Unix(1700000000, 0).UTC()}
	if err := r.Put(ep); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "endpoints", "c1_eth0.json")); err != nil {
		t.Fatalf("record file: %v", err)
	}
	// a corrupt record, and one that parses but is not valid, are kept on disk and ignored
	for name, content := range map[string]string{"bad_eth0.json": "{", "invalid_eth0.json": "{}"} {
		if err := os.WriteFile(filepath.Join(dir, "endpoints", name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r2, err := openRegistry(dir, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	got := r2.List()
	if len(got) != 1 || got[0].ContainerID != "c1" || !got[0].Created.Equal(ep.Created) {
		t.Fatalf("reloaded %+v", got)
	}
	for range 2 { // idempotent
		if err := r2.Delete(key("c1", "eth0")); err != nil {
			t.Fatal(err)
		}
	}
	if len(r2.List()) != 0 {
		t.Fatalf("not deleted: %+v", r2.List())
	}
	for _, name := range []string{"bad_eth0.json", "invalid_eth0.json"} {
		if _, err := os.Stat(filepath.Join(dir, "endpoints", name)); err != nil {
			t.Errorf("corrupt record removed: %v", err)
		}
	}
}

func TestValidateEndpoint(t *testing.T) {
	podMAC, _ := net.ParseMAC("02:aa:00:00:00:02")
	good := api.Endpoint{ContainerID: "c1", IfName: "eth0", HostIfName: "lxc1", PodMAC: podMAC, IPs: []netip.Addr{ip("10.244.1.2")}}
	tests := []struct {
		name    string
		mod     func(*api.Endpoint)
		wantErr string
	}{
		{name: "good", mod: func(*api.Endpoint) {}},
		{name: "slash in id", mod: func(e *api.Endpoint) { e.ContainerID = "../x" }, wantErr: "cannot name a file"},
		{name: "no ips", mod: func(e *api.Endpoint) { e.IPs = nil }, wantErr: "ips is empty"},
		{name: "no host dev", mod: func(e *api.Endpoint) { e.HostIfName = "" }, wantErr: "hostIfName is empty"},
		{name: "no pod MAC", mod: func(e *api.Endpoint) { e.PodMAC = nil }, wantErr: "podMAC"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := good
			tt.mod(&e)
			err := validateEndpoint(e)
			if (tt.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseAPIServer(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "10.0.0.10:6443", want: "https://10.0.0.10:6443"},
		{in: "https://10.0.0.10:6443", want: "https://10.0.0.10:6443"},
		{in: "https://api.example.com", want: "https://api.example.com"},
		{in: "https://api.example.com:443/", want: "https://api.example.com:443"},
		{in: "[fd00::10]:6443", want: "https://[fd00::10]:6443"},
		{in: "https://[fd00::10]:6443", want: "https://[fd00::10]:6443"},
		{in: "10.0.0.10", err: "missing port"},
		{in: "http://10.0.0.10:6443", err: "only https"},
		{in: "https://10.0.0.10:6443/api", err: "a path"},
		{in: "https://u:p@10.0.0.10:6443", err: "credentials"},
		{in: "10.0.0.10:0", err: "not 1..65535"},
		{in: "10.0.0.10:http", err: "not 1..65535"},
		{in: ":6443", err: "no host"},
		{in: " 10.0.0.10:6443", err: "spaces"},
		{in: "https://:6443", err: "no host"},
	} {
		got, err := ParseAPIServer(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "pass the kube-apiserver as https://host:port") {
				t.Errorf("ParseAPIServer(%q) = %q, %v; want an error with %q and what to pass", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseAPIServer(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// A bad --k8s-api-server, --cni-conf-dir or --cni-mtu is a configuration
// error naming the flag.
func TestInstallConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		err  string
	}{
		{"api server without port", func(c *Config) { c.APIServer = "10.0.0.10" }, "--k8s-api-server"},
		{"relative cni dir", func(c *Config) { c.CNIConfDir = "net.d" }, "--cni-conf-dir"},
		{"cni dir in bypass-only", func(c *Config) { c.CNIConfDir = "/etc/cni/net.d"; c.Mode = ModeBypassOnly }, "--cni-conf-dir with --mode=bypass-only"},
		{"mtu", func(c *Config) { c.CNIMTU = 9 }, "--cni-mtu 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.NodeName, c.SocketLB = "n", false
			tc.mod(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Validate = %v, want %q", err, tc.err)
			}
		})
	}
	c := Defaults()
	c.NodeName, c.SocketLB = "n", false
	c.APIServer, c.CNIConfDir = "https://10.0.0.10:6443", "/etc/cni/net.d"
	if err := c.Validate(); err != nil {
		t.Fatalf("valid configuration refused: %v", err)
	}
}

// TestWithBigTCPNote: the vm_bypass line warns that BIG TCP halves TCP into
// the guests only while the node has VM pods and BIG TCP is on.
func TestWithBigTCPNote(t *testing.T) {
	vm := api.Decision{Name: DecisionVMBypass, Value: "1 pod(s)", Reason: "bypassed: default/vm1"}
	on := []api.Decision{{Name: "attach", Value: "tcx"}, {Name: podpath.DecisionBigTCP, Value: "ipv4+ipv6 196608"}}
	off := []api.Decision{{Name: podpath.DecisionBigTCP, Value: "off", Reason: "off: --enable-ipv4-big-tcp=false"}}
	tests := []struct {
		name      string
		pods      int
		decisions []api.Decision
		warn      bool
	}{
		{"VM pods, BIG TCP on", 1, on, true},
		{"VM pods, BIG TCP off", 1, off, false},
		{"no VM pods, BIG TCP on", 0, on, false},
		{"no big_tcp decision (bypass-only)", 1, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := withBigTCPNote(vm, tt.pods, tt.decisions)
			warned := strings.Contains(got.Reason, "BIG TCP is on (ipv4+ipv6 196608): TCP into the guests is segmented to MTU")
			if warned != tt.warn || !strings.HasPrefix(got.Reason, vm.Reason) || got.Value != vm.Value {
				t.Errorf("got %+v, want the warning: %v", got, tt.warn)
			}
		})
	}
}
