package kubeproxy

import (
	"strings"
	"testing"
	"time"
)

// Lines as kube-proxy v1.36.3 -v=2 writes them (iptables and nftables modes).
const kubeProxyLogSample = `--- 2026-11-22T06:36:01Z nsenter --net=/run/netns/axonlab-node2 -- kube-proxy --proxy-mode=iptables
I1122 06:36:01.851012   31256 server_linux.go:53] "Using iptables proxy"
I1122 06:36:02.205880   31256 proxier.go:662] "SyncProxyRules complete" ipFamily="IPv4" elapsed="116.250665ms"
I1122 06:36:02.348748   31256 proxier.go:662] "SyncProxyRules complete" ipFamily="IPv6" elapsed="141.52022ms"
W1122 06:36:02.400000   31256 proxier.go:700] "something else" elapsed="1s"
I1122 06:36:03.359696   31256 proxier.go:1828] "SyncProxyRules complete" ipFamily="IPv4" elapsed="2.5s"
I1122 06:36:03.359697   31256 proxier.go:1828] "SyncProxyRules complete" ipFamily="IPv4" elapsed="garbage"
`

func TestParseSyncTimes(t *testing.T) {
	got, err := ParseSyncTimes(strings.NewReader(kubeProxyLogSample), 2026)
	if err != nil {
		t.Fatal(err)
	}
	want := []SyncTime{
		{At: time.Date(2026, 11, 22, 6, 36, 2, 205880000, time.UTC), Family: "IPv4", Elapsed: 116250665 * time.Nanosecond},
		{At: time.Date(2026, 11, 22, 6, 36, 2, 348748000, time.UTC), Family: "IPv6", Elapsed: 141520220 * time.Nanosecond},
		{At: time.Date(2026, 11, 22, 6, 36, 3, 359696000, time.UTC), Family: "IPv4", Elapsed: 2500 * time.Millisecond},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d sync times, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !got[i].At.Equal(want[i].At) || got[i].Family != want[i].Family || got[i].Elapsed != want[i].Elapsed {
			t.Errorf("sync %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
