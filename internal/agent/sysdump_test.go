package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/sysdump"
	"github.com/axonhq/axon/internal/testutil"
)

// checkSysdump builds an `axon sysdump` archive against the running agent
// of n (its socket, its /metrics inside the node netns, its pins) and checks
// its members, their bounds, and that no secret of the agent's kubeconfig
// is in it.
func checkSysdump(t *testing.T, n *scratchNode, cfg Config, logFile string) {
	t.Helper()
	start := time.Now()
	var buf bytes.Buffer
	err := sysdump.Write(context.Background(), &buf, sysdump.Options{
		Socket: cfg.Socket, HealthAddr: cfg.HealthAddr, BPFRoot: cfg.BPFRoot,
		DialHealth: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := netnsutil.Do(n.name, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
		MaxMapEntries: 2, MaxLogBytes: 4096, AgentLog: logFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	size := buf.Len()
	members := map[string]string{}
	for _, m := range testutil.TarMembers(t, &buf) {
		members[m.Header.Name[strings.Index(m.Header.Name, "/")+1:]] = string(m.Data)
	}
	t.Logf("sysdump: %d members, %d bytes compressed, %s", len(members), size, time.Since(start).Round(time.Millisecond))

	for name, body := range members {
		if strings.HasSuffix(name, ".error") {
			t.Logf("sysdump %s: %s", name, strings.TrimSpace(body))
		}
	}
	var st api.Status
	if err := json.Unmarshal([]byte(members["status.json"]), &st); err != nil || st.Node != "node1" {
		t.Errorf("status.json: node %q, err %v", st.Node, err)
	}
	// Every part an agent with a datapath has must be there, not as .error.
	for _, m := range []string{"status.json", "endpoints.json", "services.json", "bpf-lb.json", "agent-cmdline.txt", "metrics.txt",
		"kernel.txt", "bpf-programs.txt", "bpf-links.txt", "bpf-pinned.txt", "agent.log", "MEMBERS.txt"} {
		if _, ok := members[m]; !ok {
			t.Errorf("no %s in the archive (error: %q)", m, members[m+".error"])
		}
	}
	if _, ok := members["dmesg.txt"]; !ok && members["dmesg.txt.error"] == "" {
		t.Error("neither dmesg.txt nor the reason it is missing")
	}
	contains := map[string]string{
		"metrics.txt":       "axon_agent_ready 1",
		"agent-cmdline.txt": "pid ",
		"kernel.txt":        "kernel features (the agent's probes at start):\n  tcx",
		"bpf-pinned.txt":    "axon_ep_v4\tmap",
		"bpf-programs.txt":  "SchedCLS\taxon_pod_egress",
		"MEMBERS.txt":       "bpf-maps/axon_ep_v4.txt",
	}
	for m, want := range contains {
		if !strings.Contains(members[m], want) {
			t.Errorf("%s has no %q:\n%.1500s", m, want, members[m])
		}
	}
	if len(members["agent.log"]) > 4096 {
		t.Errorf("agent.log is %d bytes, bound 4096", len(members["agent.log"]))
	}
	// The bound: some pinned map (an array has all its slots) has more than
	// 2 entries, and its dump says how many were left out.
	bounded := 0
	for name, body := range members {
		if strings.HasPrefix(name, "bpf-maps/") && strings.Contains(body, "more not written (limit 2 per map") {
			bounded++
			if lines := strings.Count(body, "\n"); lines > 4 { // header, 2 entries, summary
				t.Errorf("%s has %d lines with a bound of 2 entries", name, lines)
			}
		}
	}
	if bounded == 0 {
		t.Error("no pinned map dump says it was cut at 2 entries")
	}
	// The pid the archive names is the agent's: its capabilities (all, or
	// exactly $AXON_TEST_AGENT_CAPS) are in the log.
	var pid int
	if _, err := fmt.Sscanf(members["agent-cmdline.txt"], "pid %d", &pid); err != nil {
		t.Errorf("agent-cmdline.txt: %v", err)
	} else if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(l, "CapEff:") || strings.HasPrefix(l, "CapBnd:") {
				t.Logf("agent pid %d %s (%s=%q)", pid, l, agentCapsEnv, os.Getenv(agentCapsEnv))
			}
		}
	}
	// No secret: the agent's kubeconfig holds a client key; none of it, nor
	// any private key, is in the archive.
	kc, err := os.ReadFile(cfg.Kubeconfig)
	if err != nil || !strings.Contains(string(kc), "client-key") {
		t.Fatalf("the test's kubeconfig has no client key to look for (%v)", err)
	}
	for name, body := range members {
		if strings.Contains(body, "PRIVATE KEY") || strings.Contains(body, "client-key-data") {
			t.Errorf("%s contains key material", name)
		}
	}
}
