package l4lb

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lb"
)

// memDP is an in-memory Datapath for the reload logic (pure logic: what is
// written when); the real datapath is exercised by the e2e test.
type memDP struct {
	vips   map[lb.FrontendKey]lb.Frontend
	tables map[lb.FrontendKey][]int
	writes int
	failOn string // fail the next upsert of this VIP address (once)
}

func newMemDP() *memDP {
	return &memDP{vips: map[lb.FrontendKey]lb.Frontend{}, tables: map[lb.FrontendKey][]int{}}
}

func (m *memDP) UpsertVIP(f lb.Frontend, _ bool, table []int) error {
	if m.failOn != "" && f.Key.Addr.String() == m.failOn {
		m.failOn = ""
		return errors.New("map full")
	}
	m.writes++
	m.vips[f.Key], m.tables[f.Key] = f, table
	return nil
}

func (m *memDP) DeleteVIP(k lb.FrontendKey) error {
	m.writes++
	delete(m.vips, k)
	delete(m.tables, k)
	return nil
}

func (m *memDP) render() string {
	var fs []lb.Frontend
	for _, f := range m.vips {
		fs = append(fs, f)
	}
	return lb.Render(fs)
}

func writeConfig(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newTestRunner writes goodConfig to dir/lb.yaml and returns a Runner of it
// programming dp, the file's path and its parsed config.
func newTestRunner(t *testing.T, dir string, dp Datapath) (*Runner, string, *Config) {
	t.Helper()
	path := filepath.Join(dir, "lb.yaml")
	writeConfig(t, path, goodConfig)
	cfg, raw, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRunner(path, cfg, raw, dp, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r, path, cfg
}

func TestReload(t *testing.T) {
	dp := newMemDP()
	r, path, cfg := newTestRunner(t, t.TempDir(), dp)
	first := dp.render()
	if len(dp.vips) != 2 || len(dp.tables[cfg.VIPs[0].Key]) != 4093 || dp.tables[cfg.VIPs[1].Key] != nil {
		t.Fatalf("initial programming wrong:\n%s", first)
	}

	// Unchanged file: nothing written.
	w := dp.writes
	if _, err := r.Reload(); !errors.Is(err, ErrUnchanged) || dp.writes != w {
		t.Fatalf("unchanged reload: err %v, %d writes", err, dp.writes-w)
	}

	// Invalid file: rejected, maps untouched, status says why.
	writeConfig(t, path, strings.Replace(goodConfig, "port: 80", "port: 80000", 1))
	if _, err := r.Reload(); err == nil || !strings.Contains(err.Error(), "vips[0].port: 80000") {
		t.Fatalf("invalid reload error = %v", err)
	}
	if dp.render() != first || dp.writes != w {
		t.Fatal("an invalid config changed the maps")
	}
	st := r.Status()
	if st.Rejected != 1 || !strings.Contains(st.LastError, "80000") || st.Generation != 1 {
		t.Errorf("status after rejected reload: %+v", st)
	}

	// Start-only setting changed: rejected.
	writeConfig(t, path, strings.Replace(goodConfig, "xdpMode: native", "xdpMode: disabled", 1))
	if _, err := r.Reload(); err == nil || !strings.Contains(err.Error(), "xdpMode") {
		t.Fatalf("start-only change error = %v", err)
	}

	// Valid change: one VIP rewritten, the other untouched.
	second := strings.Replace(goodConfig, "      - address: 10.0.1.2\n", "      - address: 10.0.1.2\n      - address: 10.0.1.4\n", 1)
	writeConfig(t, path, second)
	p, err := r.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Upsert) != 1 || p.Unchanged != 1 || dp.writes != w+1 {
		t.Fatalf("plan %s, %d writes", p, dp.writes-w)
	}
	if st := r.Status(); st.Generation != 2 || st.LastError != "" || len(st.VIPs[0].Backends) != 4 {
		t.Errorf("status after reload: %+v", st)
	}

	// Datapath failure mid-apply: rolled back to the running config.
	before := dp.render()
	writeConfig(t, path, strings.NewReplacer("10.0.1.4", "10.0.1.5", "2001:db8:1::1", "2001:db8:1::2").Replace(second))
	dp.failOn = "2001:db8::53"
	if _, err := r.Reload(); err == nil || !strings.Contains(err.Error(), "map full") || strings.Contains(err.Error(), "rolling back") {
		t.Fatalf("failing apply error = %v", err)
	}
	if got := dp.render(); got != before {
		t.Errorf("after a failed apply the maps are not rolled back:\n%s\nwant\n%s", got, before)
	}
	// The next reload of the same file retries (the failed write is not "unchanged").
	if _, err := r.Reload(); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if !strings.Contains(dp.render(), "10.0.1.5:80") {
		t.Errorf("retry did not apply:\n%s", dp.render())
	}
}

func TestStatusSocket(t *testing.T) {
	dir := t.TempDir()
	r, path, _ := newTestRunner(t, dir, newMemDP())
	ctx, cancel := context.WithCancel(context.Background())
	sock := filepath.Join(dir, "l4lb.sock")
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, sock, nil) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	c := NewClient(sock)
	var st Status
	var err error
	for range 100 { // the listener comes up asynchronously
		if st, err = c.Status(ctx); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(st.VIPs) != 2 || st.VIPs[0].VIP != "198.18.0.100:80/TCP" || st.VIPs[0].Forwarding != "dsr (ipip)" {
		t.Errorf("status %+v", st)
	}
	var sum float64
	for _, b := range st.VIPs[0].Backends {
		sum += b.Share
	}
	if sum < 0.999 || sum > 1.001 || st.VIPs[0].Backends[2].Share != 0 {
		t.Errorf("shares %+v", st.VIPs[0].Backends)
	}
	writeConfig(t, path, "interface: eth0\n")
	if _, err := c.Reload(ctx); err == nil || !strings.Contains(err.Error(), "vips: missing") {
		t.Errorf("reload of a bad file over the socket: %v", err)
	}
}

// TestPollDoesNotRepeatRejections: a rejected file is reported once by
// polling, again on an explicit reload, and applied once fixed.
func TestPollDoesNotRepeatRejections(t *testing.T) {
	r, path, _ := newTestRunner(t, t.TempDir(), newMemDP())
	writeConfig(t, path, "interface: eth0\n")
	if _, err := r.reload(false); err == nil {
		t.Fatal("bad file accepted")
	}
	for range 3 {
		if _, err := r.reload(false); !errors.Is(err, ErrUnchanged) {
			t.Fatalf("poll of the same bad file: %v, want ErrUnchanged", err)
		}
	}
	if _, err := r.Reload(); err == nil || errors.Is(err, ErrUnchanged) {
		t.Fatalf("explicit reload of a bad file: %v, want the error again", err)
	}
	if st := r.Status(); st.Rejected != 2 {
		t.Errorf("rejected %d times, want 2 (one poll, one explicit)", st.Rejected)
	}
	writeConfig(t, path, strings.Replace(goodConfig, "weight: 3", "weight: 4", 1))
	if _, err := r.reload(false); err != nil {
		t.Fatalf("fixed file: %v", err)
	}
}

// TestDrain: a backend removed by a reload stays (Terminating, no Maglev
// slot) while it has flows, and goes once it has none.
func TestDrain(t *testing.T) {
	dp := &flowDP{memDP: newMemDP(), flows: map[netip.AddrPort]int{}}
	r, path, cfg := newTestRunner(t, t.TempDir(), dp)
	gone := netip.MustParseAddrPort("10.0.1.2:80")
	dp.flows[gone] = 3
	writeConfig(t, path, strings.Replace(goodConfig, "      - address: 10.0.1.2\n", "", 1))
	if _, err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	web := dp.vips[cfg.VIPs[0].Key]
	last := web.Backends[len(web.Backends)-1]
	if netip.AddrPortFrom(last.Addr, last.Port) != gone || last.State != lb.Terminating {
		t.Fatalf("removed backend not kept as terminating: %+v", web.Backends)
	}
	for _, i := range dp.tables[web.Key] {
		if i >= 2 {
			t.Fatal("a draining backend has a Maglev slot")
		}
	}
	if err := r.ReapDrained(); err != nil {
		t.Fatal(err)
	}
	if len(dp.vips[web.Key].Backends) != 3 {
		t.Fatal("reaped while it still has flows")
	}
	delete(dp.flows, gone)
	if err := r.ReapDrained(); err != nil {
		t.Fatal(err)
	}
	if n := len(dp.vips[web.Key].Backends); n != 2 {
		t.Fatalf("after its flows ended the VIP has %d backends, want 2", n)
	}
	// Re-adding a draining backend makes it active again.
	dp.flows[gone] = 1
	writeConfig(t, path, strings.Replace(goodConfig, "      - address: 10.0.1.2\n", "", 1)+"# same\n")
	_, _ = r.Reload()
	writeConfig(t, path, goodConfig)
	if _, err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, b := range dp.vips[web.Key].Backends {
		if b.State != lb.Active && b.Addr.String() != "10.0.1.3" {
			t.Errorf("backend %s is %s after being listed again", b.Addr, b.State)
		}
	}
}

type flowDP struct {
	*memDP
	flows map[netip.AddrPort]int
}

func (f *flowDP) Flows() (map[lb.FrontendKey]int, map[netip.AddrPort]int, int, int, error) {
	return nil, f.flows, 0, 0, nil
}

func (f *flowDP) Packets() (map[string]uint64, error) { return nil, nil }
