package l4lb

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lb"
)

const goodConfig = `
interface: eth0
xdpMode: native
maglev:
  tableSize: 4093
conntrack:
  max: 65536
  udpTimeout: 30s
vips:
  - name: web
    address: 198.18.0.100
    port: 80
    backends:
      - address: 10.0.1.2
      - address: 10.0.1.1
        weight: 3
      - address: 10.0.1.3
        weight: 0
  - name: dns
    address: 2001:db8::53
    port: 53
    protocol: udp
    algorithm: random
    forwarding: snat
    backends:
      - address: 2001:db8:1::1
        port: 5353
`

func TestParseGood(t *testing.T) {
	c, err := Parse([]byte(goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	if c.Interface != "eth0" || c.XDPMode != "native" || c.MaglevSize != 4093 || c.CTMax != 65536 ||
		c.UDPTimeout != 30*time.Second || c.TCPTimeout != DefaultTCPTimeout || c.BPFRoot != DefaultBPFRoot || c.Socket != DefaultSocket {
		t.Errorf("settings wrong: %+v", c)
	}
	if len(c.VIPs) != 2 {
		t.Fatalf("got %d VIPs", len(c.VIPs))
	}
	web, dns := c.VIPs[0], c.VIPs[1] // IPv4 sorts first
	wantWeb := VIP{Name: "web", Key: lb.FrontendKey{Addr: netip.MustParseAddr("198.18.0.100"), Port: 80, Proto: lb.TCP},
		Algorithm: lb.AlgorithmMaglev, DSR: true, Backends: []Backend{
			{netip.MustParseAddr("10.0.1.1"), 80, 3}, {netip.MustParseAddr("10.0.1.2"), 80, 1}, {netip.MustParseAddr("10.0.1.3"), 80, 0}}}
	if !sameVIP(web, wantWeb) {
		t.Errorf("web = %+v\nwant %+v", web, wantWeb)
	}
	if dns.Key.Proto != lb.UDP || dns.Algorithm != lb.AlgorithmRandom || dns.DSR || dns.Backends[0].Port != 5353 {
		t.Errorf("dns = %+v", dns)
	}
	f := web.Frontend()
	if f.Backends[2].State != lb.Terminating || f.Kind != KindVIP {
		t.Errorf("frontend %+v: a weight-0 backend must be Terminating", f)
	}
	tab, err := MaglevTable(web, c.MaglevSize, c.MaglevSeed)
	if err != nil {
		t.Fatal(err)
	}
	n := make([]int, 3)
	for _, i := range tab {
		n[i]++
	}
	if n[2] != 0 || n[0] < 2*n[1] {
		t.Errorf("maglev slots per backend %v: weight 3:1:0 not respected", n)
	}
}

// TestParseBad: every error names the field and says what to do; all
// problems are reported at once.
func TestParseBad(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string
	}{
		{"empty", "", []string{"the config is empty"}},
		{"not yaml", "interface: [eth0", []string{"not a valid config"}},
		{"unknown field", "interface: eth0\nvip: []\n", []string{"field vip not found"}},
		{"typo in vip", "interface: eth0\nvips:\n- address: 1.2.3.4\n  prot: 80\n", []string{"field prot not found"}},
		{"no interface, no vips", "xdpMode: native\n", []string{"interface: missing", "vips: missing"}},
		{"bad values", `
interface: "eth 0"
xdpMode: turbo
maglev: {tableSize: 1000}
conntrack: {max: 10, tcpTimeout: forever}
vips:
- address: 10.0.0.300
  port: 0
  protocol: sctp
  algorithm: rr
  forwarding: nat
  backends: []
`, []string{
			`interface: "eth 0" is not a network device name`,
			`xdpMode: "turbo" is not one of native, best-effort, disabled`,
			"maglev.tableSize: maglev table size 1000 is not a prime",
			"conntrack.max: 10 is outside",
			`conntrack.tcpTimeout: "forever" is not a duration`,
			`vips[0].address: "10.0.0.300" is not an IP address`,
			"vips[0].port: 0 is outside 1..65535",
			`vips[0].protocol: "sctp" is not tcp or udp`,
			`vips[0].algorithm: "rr" is not a load-balancing algorithm`,
			`vips[0].forwarding: "nat" is not dsr or snat`,
			"vips[0].backends: empty: list at least one backend",
		}},
		{"backends", `
interface: eth0
vips:
- address: 198.18.0.100
  port: 80
  backends:
  - address: 2001:db8::1
  - address: 10.0.0.1
    port: 8080
  - address: 10.0.0.2
  - address: 10.0.0.2
  - address: 10.0.0.3
    weight: 70000
  - address: 127.0.0.1
  - {}
`, []string{
			"vips[0].backends[0].address: 2001:db8::1 is not of the VIP's family",
			"vips[0].backends[1].port: 8080 differs from the VIP port 80",
			"vips[0].backends[3]: 10.0.0.2:80 is listed twice (also backends[2])",
			"vips[0].backends[4].weight: 70000 is outside 0..65535",
			"vips[0].backends[5].address: 127.0.0.1 is not a routable unicast address",
			"vips[0].backends[6].address: missing",
		}},
		{"duplicate VIP and name", `
interface: eth0
vips:
- {name: a, address: 198.18.0.100, port: 80, backends: [{address: 10.0.0.1}]}
- {name: a, address: 198.18.0.101, port: 80, backends: [{address: 10.0.0.1}]}
- {name: b, address: 198.18.0.100, port: 80, backends: [{address: 10.0.0.2}]}
- {address: 198.18.0.102, port: 80, backends: [{address: 10.0.0.2, weight: 0}]}
`, []string{
			`vips[1].name: "a" is also the name of vips[0]`,
			"vips[2]: 198.18.0.100:80/TCP is the same VIP as vips[0]: merge",
			"vips[3].backends: every backend has weight 0",
		}},
		{"two documents", "interface: eth0\n---\ninterface: eth1\n", []string{"more than one YAML document"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if ve, ok := err.(*ValidationError); ok && len(ve.Problems) != len(tc.want) {
				t.Errorf("%d problems reported, want %d:\n%v", len(ve.Problems), len(tc.want), err)
			}
		})
	}
}

func TestDiff(t *testing.T) {
	base, err := Parse([]byte(goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	mod := func(f func(s string) string) *Config {
		t.Helper()
		c, err := Parse([]byte(f(goodConfig)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	same := func(s string) string { return s }
	for _, tc := range []struct {
		name              string
		old, new          *Config
		upsert, del, keep int
		err               string
	}{
		{"first load", nil, base, 2, 0, 0, ""},
		{"no change", base, mod(same), 0, 0, 2, ""},
		{"backend added", base, mod(func(s string) string {
			return strings.Replace(s, "      - address: 10.0.1.2\n", "      - address: 10.0.1.2\n      - address: 10.0.1.9\n", 1)
		}), 1, 0, 1, ""},
		{"weight changed", base, mod(func(s string) string { return strings.Replace(s, "weight: 3", "weight: 2", 1) }), 1, 0, 1, ""},
		{"VIP removed", base, mod(func(s string) string { return s[:strings.Index(s, "  - name: dns")] }), 0, 1, 1, ""},
		{"seed changed remaps maglev VIPs only", base, mod(func(s string) string {
			return strings.Replace(s, "  tableSize: 4093\n", "  tableSize: 4093\n  seed: x\n", 1)
		}), 1, 0, 1, ""},
		{"interface is start-only", base, mod(func(s string) string { return strings.Replace(s, "eth0", "eth1", 1) }), 0, 0, 0,
			"interface: eth0 → eth1"},
		{"table size is start-only", base, mod(func(s string) string { return strings.Replace(s, "4093", "8191", 1) }), 0, 0, 0,
			"maglev.tableSize: 4093 → 8191"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Diff(tc.old, tc.new)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "restart") {
					t.Fatalf("Diff error = %v, want one containing %q and saying to restart", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Upsert) != tc.upsert || len(p.Delete) != tc.del || p.Unchanged != tc.keep {
				t.Errorf("plan %s, want %d/%d/%d", p, tc.upsert, tc.del, tc.keep)
			}
		})
	}
}
