package sockmap

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/axonhq/axon/internal/testutil"
)

// selfTestBroken are the checks this kernel really gets wrong, with what
// the failure must say. splice: no kernel up to 6.18 can splice(2) the bytes
// redirected into a socket's psock queue (tcp_bpf has no splice_read; Go's
// io.Copy between TCP connections gets 0 bytes and EOF): the product needs
// the splice guard, which SelfTest does not load. A kernel without
// sk_psock.msg_tot_len (before 6.6.128 / 6.12.75 / 6.18.14, e.g. Debian's
// 6.1) gives sk_msg nothing to bound a peer's queue with, and its FIONREAD
// does not count redirected bytes (tcp_bpf has no ioctl there).
func selfTestBroken(t *testing.T) map[string]string {
	broken := map[string]string{"splice": "cannot splice(2) from a socket in a SOCKHASH"}
	if !kernelHasMsgTotLen(t) {
		broken["backpressure"] = "no back-pressure"
		broken["fionread_redirected"] = "FIONREAD 0 for"
	}
	return broken
}

// kernelHasMsgTotLen: the running kernel's struct sk_psock has msg_tot_len
// (the psock queue length FIONREAD and the back-pressure bound read).
func kernelHasMsgTotLen(t testing.TB) bool {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatalf("kernel BTF: %v", err)
	}
	var psock *btf.Struct
	if err := spec.TypeByName("sk_psock", &psock); err != nil {
		t.Fatalf("kernel BTF has no struct sk_psock: %v", err)
	}
	for _, m := range psock.Members {
		if m.Name == "msg_tot_len" {
			return true
		}
	}
	return false
}

// TestSelfTest runs the self-test on this kernel: every check passes, or
// fails only where the kernel is known broken, with that reason; a kernel
// with the FIONREAD bug gets the stream verdict and passes FIONREAD with it.
func TestSelfTest(t *testing.T) {
	testutil.RequireRoot(t, "loads BPF programs, creates a network namespace")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Stretch(t, 60*time.Second))
	defer cancel()
	start := time.Now()
	res := SelfTest(ctx)
	t.Logf("self-test took %v: OK=%v StreamVerdict=%v reason=%q", time.Since(start).Round(time.Millisecond), res.OK, res.StreamVerdict, res.Reason)
	want := []string{"fionread_stack_bytes", "redirect", "fionread_redirected", "wakeup_redirected", "wakeup_stack_bytes",
		"splice", "half_close", "close", "msg_peek", "large_write", "backpressure"}
	got := map[string]Check{}
	for _, c := range res.Checks {
		t.Logf("  %-22s ok=%-5v %s", c.Name, c.OK, c.Detail)
		got[c.Name] = c
	}
	broken := selfTestBroken(t)
	t.Logf("known broken on this kernel: %v", broken)
	var firstBroken string
	for _, name := range want {
		c, ok := got[name]
		switch {
		case !ok:
			t.Errorf("check %s did not run", name)
		case c.OK:
		case broken[name] != "" && strings.Contains(c.Detail, broken[name]):
			if firstBroken == "" {
				firstBroken = name
			}
			t.Logf("check %s fails as known on this kernel", name)
		default:
			t.Errorf("check %s failed: %s", name, c.Detail)
		}
	}
	switch {
	case firstBroken == "" && !res.OK && !t.Failed():
		t.Errorf("every check passed but OK=false (reason %q)", res.Reason)
	case firstBroken != "" && (res.OK || !strings.HasPrefix(res.Reason, firstBroken+": ")):
		t.Errorf("check %s failed but OK=%v, reason %q: want OK=false with that check as the reason", firstBroken, res.OK, res.Reason)
	}
}
