package bwm

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func scratchHandleT(t *testing.T) *netlink.Handle {
	t.Helper()
	name := "axt-bw-q-" + randHex(t)
	h, err := netns.NewNamed(name) // moves this thread: restore right away
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(); _ = netns.DeleteNamed(name) })
	nl, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	return nl
}

// TestFQ installs fq on a single-queue and mq + fq on a multi-queue device,
// leaves a right device alone and puts fq back after it was removed. Where
// the kernel has no sch_fq, the error must say so.
func TestFQ(t *testing.T) {
	if !rootUser() {
		t.Skip("needs root: network namespaces and qdiscs")
	}
	nl := scratchHandleLocked(t)
	for _, c := range []struct {
		name   string
		queues int
		layout string
	}{{"one", 1, "fq"}, {"four", 4, "mq+fq"}} {
		t.Run(c.layout, func(t *testing.T) {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "q" + c.name, NumTxQueues: c.queues, NumRxQueues: c.queues}, PeerName: "p" + c.name}
			if err := nl.LinkAdd(v); err != nil {
				t.Fatal(err)
			}
			st, err := EnsureFQ(nl, "q"+c.name, 2*time.Second)
			if !fqAvailable() {
				if err == nil || !strings.Contains(err.Error(), "sch_fq") {
					t.Fatalf("without sch_fq: err %v, want one naming sch_fq", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.Layout != c.layout || !st.Applied || st.Queues != c.queues {
				t.Fatalf("first install: %+v", st)
			}
			l, _ := nl.LinkByName("q" + c.name)
			qs, _ := nl.QdiscList(l)
			for _, q := range qs {
				if fq, ok := q.(*netlink.Fq); ok && (fq.Horizon != 2_000_000 || fq.Pacing != 1) {
					t.Errorf("fq %+v: want pacing on, horizon 2s", fq)
				}
			}
			if st, err = EnsureFQ(nl, "q"+c.name, 2*time.Second); err != nil || st.Applied {
				t.Fatalf("second call touched a right device: %+v %v", st, err)
			}
			// someone replaces the root qdisc
			pf := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)}, QdiscType: "pfifo_fast"}
			if err := nl.QdiscReplace(pf); err != nil {
				t.Fatal(err)
			}
			st, err = EnsureFQ(nl, "q"+c.name, 2*time.Second)
			if err != nil || !st.Applied || st.Found != "pfifo_fast" || st.Layout != c.layout {
				t.Fatalf("after pfifo_fast replaced it: %+v %v", st, err)
			}
			if err := RemoveFQ(nl, "q"+c.name); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func rootUser() bool { return unix.Geteuid() == 0 }

// scratchHandleLocked creates a named netns without moving the test's
// thread for longer than the creation.
func scratchHandleLocked(t *testing.T) *netlink.Handle {
	t.Helper()
	var nl *netlink.Handle
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Error(err)
			return
		}
		defer orig.Close()
		nl = scratchHandleT(t)
		if err := netns.Set(orig); err != nil {
			t.Error(err)
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
	if nl == nil {
		t.FailNow()
	}
	return nl
}

func TestPodGSOMaxSize(t *testing.T) {
	for bits, want := range map[uint64]uint32{1_000_000: 16 << 10, 10_000_000: 16 << 10, 50_000_000: 31250, 100_000_000: 62500, 1e9: 64 << 10} {
		if got := PodGSOMaxSize(bits); got != want {
			t.Errorf("PodGSOMaxSize(%d) = %d, want %d", bits, got, want)
		}
	}
	if !rootUser() {
		t.Skip("needs root: network namespaces")
	}
	nl := scratchHandleLocked(t)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	var nsPath string
	for _, e := range mustReadDir(t, "/run/netns") {
		if strings.HasPrefix(e, "axt-bw-q-") {
			if h, err := netns.GetFromName(e); err == nil {
				if nl2, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE); err == nil {
					if _, err := nl2.LinkByName("peer0"); err == nil {
						nsPath = "/run/netns/" + e
					}
					nl2.Close()
				}
				h.Close()
			}
		}
	}
	if nsPath == "" {
		t.Fatal("scratch netns not found")
	}
	prev, err := SetPodGSOMaxSize(nsPath, "eth0", 8192)
	if err != nil || prev != 65536 {
		t.Fatalf("cap: prev %d, %v", prev, err)
	}
	l, _ := nl.LinkByName("eth0")
	if l.Attrs().GSOMaxSize != 8192 {
		t.Fatalf("gso_max_size %d after the cap", l.Attrs().GSOMaxSize)
	}
	if prev, err = SetPodGSOMaxSize(nsPath, "eth0", 65536); err != nil || prev != 8192 {
		t.Fatalf("restore: prev %d, %v", prev, err)
	}
}

func mustReadDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
