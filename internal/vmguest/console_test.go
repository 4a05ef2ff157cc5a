package vmguest

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestScanMarkers(t *testing.T) {
	for _, tc := range []struct {
		name, console string
		addr          string
		ready         bool
		bad           string
	}{
		{"booting", "AXON-GUEST-BOOTED 6.12 uptime=0.9\n", "", false, ""},
		{"leased, not ready yet", "AXON-GUEST-BOOTED 6.12\r\nAXON-GUEST-NET 10.244.1.5/32\r\n", "10.244.1.5/32", false, ""},
		{"ready", "AXON-GUEST-NET 10.244.1.5/32\nAXON-GUEST-READY uptime=9.1\n", "10.244.1.5/32", true, ""},
		{"no lease", "AXON-GUEST-ERROR no DHCP lease on eth0: x\nAXON-GUEST-READY\n", "", true, "AXON-GUEST-ERROR no DHCP lease on eth0: x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, ready, bad := scanMarkers(tc.console)
			if addr != tc.addr || ready != tc.ready || bad != tc.bad {
				t.Errorf("scanMarkers = %q, %v, %q; want %q, %v, %q", addr, ready, bad, tc.addr, tc.ready, tc.bad)
			}
		})
	}
}

// The guest's echo listens where the constant says (the lab probes EchoPort).
func TestInitServesEchoPort(t *testing.T) {
	if want := fmt.Sprintf("nc -ll -p %d -e /bin/cat", EchoPort); !strings.Contains(string(initScript), want) {
		t.Errorf("init.sh does not start %q", want)
	}
}

func TestDHCPConfigRoutes(t *testing.T) {
	mac, _ := net.ParseMAC("02:a0:00:00:01:05")
	l := Lease{MAC: mac, Addr: netip.MustParsePrefix("10.244.1.5/32"), Router: netip.MustParseAddr("169.254.1.1")}
	if c := dhcpConfig("k6t-eth0", "/d", l); strings.Contains(c, "staticroutes") || !strings.Contains(c, "option subnet 255.255.255.255\n") {
		t.Errorf("without RouterOnLink:\n%s", c)
	}
	l.RouterOnLink = true
	if c := dhcpConfig("k6t-eth0", "/d", l); !strings.Contains(c, "option staticroutes 169.254.1.1/32 0.0.0.0, 0.0.0.0/0 169.254.1.1\n") {
		t.Errorf("with RouterOnLink, no on-link route to the router first:\n%s", c)
	}
}
