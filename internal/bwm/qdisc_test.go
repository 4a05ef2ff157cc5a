package bwm

import (
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// scratchNetns creates a netns for the test and returns its name and a
// netlink handle in it.
func scratchNetns(t *testing.T) (string, *netlink.Handle) {
	t.Helper()
	name := testutil.NewNetns(t, "axt-bw-q-")
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	return name, nl
}

// TestFQ installs fq on a single-queue and mq + fq on a multi-queue device,
// leaves a right device alone and puts fq back after it was removed. Where
// the kernel has no sch_fq, the error must say so.
func TestFQ(t *testing.T) {
	testutil.RequireRoot(t, "network namespaces and qdiscs")
	_, nl := scratchNetns(t)
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

func TestPodGSOMaxSize(t *testing.T) {
	for bits, want := range map[uint64]uint32{1_000_000: 16 << 10, 10_000_000: 16 << 10, 50_000_000: 31250, 100_000_000: 62500, 1e9: 64 << 10} {
		if got := PodGSOMaxSize(bits); got != want {
			t.Errorf("PodGSOMaxSize(%d) = %d, want %d", bits, got, want)
		}
	}
	testutil.RequireRoot(t, "network namespaces")
	name, nl := scratchNetns(t)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	nsPath := netnsutil.Path(name)
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
