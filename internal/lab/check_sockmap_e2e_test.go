package lab_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestLabCheckSockmap runs `axon lab check`'s same-node TCP bypass part in a
// one-node lab with the bypass on, under both datapaths (axon, and the
// baseline with the agent in bypass-only mode). Where the agent has the
// bypass on, the check must pass (a pod pair's connection echoed intact with
// both sockets in the SOCKHASH); where it keeps it off (the 6.18 dev host:
// its kernel self-test's splice check fails without BPF trampolines) the
// check must be n/a with exactly the agent's reason, and `axon lab check`
// must still succeed.
func TestLabCheckSockmap(t *testing.T) {
	for _, datapath := range []string{"axon", "baseline"} {
		t.Run(datapath, func(t *testing.T) {
			need(t, "axon", "axon-agent")
			l := up(t, "--nodes", "1", "--pods-per-node", "2", "--datapath", datapath, "--sockmap", "on", "--no-demo")
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			agent, err := l.Agent("node1")
			if err != nil {
				t.Fatal(err)
			}
			// The check waits for the agent's bypass to settle (it is
			// "pending" until the agent's first reconcile); its status is
			// read after.
			res, err := l.CheckSockmap(ctx, 5*time.Second)
			if err != nil || len(res.Checks) != 1 {
				t.Fatalf("CheckSockmap: %v, %+v", err, res)
			}
			st, err := agent.Status(ctx)
			if err != nil || st.Sockmap == nil {
				t.Fatalf("agent status: %v (sockmap %+v)", err, st.Sockmap)
			}
			if strings.HasPrefix(st.Sockmap.Reason, "pending") {
				t.Fatalf("the agent's bypass is still pending after the check: %q", st.Sockmap.Reason)
			}
			c := res.Checks[0]
			if st.Sockmap.Enabled {
				if !c.OK() || c.Conn.Bytes != 256<<10 || c.RedirectBytes < uint64(c.Conn.Bytes) {
					t.Errorf("the agent has the bypass on, the check: %+v", c)
				}
			} else if want := "the agent keeps the bypass off: " + st.Sockmap.Reason; c.NA != want {
				t.Errorf("the agent keeps the bypass off (%q); the check says n/a %q, error %q; want n/a %q", st.Sockmap.Reason, c.NA, c.Err, want)
			}
			t.Logf("agent: enabled %v, reason %q; check: n/a %q, error %q, conn %+v", st.Sockmap.Enabled, st.Sockmap.Reason, c.NA, c.Err, c.Conn)
			out := axon(t, "check", "--timeout", "5s")
			if !strings.Contains(out, "same-node TCP bypass checks passed") {
				t.Errorf("axon lab check printed no bypass check:\n%s", out)
			}
		})
	}
}
