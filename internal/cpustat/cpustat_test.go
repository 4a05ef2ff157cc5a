package cpustat

import (
	"os"
	"testing"
	"time"
)

func TestCPUBusyTicks(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  4705 356 584 3699176 23060 10 1277 99 7 0\n" +
		"cpu0 1393 280 234 1848686 13166 4 1000 50 7 0\n" +
		"cpu1 3312 76 350 1850490 9894 6 277 49 0 0\n" +
		"intr 12345\n"
	cases := []struct {
		name    string
		stat    string
		cpus    []int
		want    uint64
		wantErr bool
	}{
		{"all CPUs: user+nice+system+irq+softirq, not idle/iowait/steal/guest", stat, nil, 4705 + 356 + 584 + 10 + 1277, false},
		{"one CPU", stat, []int{1}, 3312 + 76 + 350 + 6 + 277, false},
		{"client and server CPUs", stat, []int{0, 1}, (1393 + 280 + 234 + 4 + 1000) + (3312 + 76 + 350 + 6 + 277), false},
		{"a CPU the machine does not have", stat, []int{0, 7}, 0, true},
		{"not /proc/stat", "garbage", nil, 0, true},
		{"short line", "cpu 1 2 3\n", nil, 0, true},
		{"non-numeric field", "cpu 1 2 x 4 5 6 7 8 9 10\n", nil, 0, true},
	}
	for _, c := range cases {
		got, err := BusyTicks(c.stat, c.cpus)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("%s: got %d, %v; want %d, error %v", c.name, got, err, c.want, c.wantErr)
		}
	}
}

func TestReadBusyMoves(t *testing.T) {
	a, err := ReadBusy(nil)
	if err != nil {
		t.Fatal(err)
	}
	// burn ~30 ms of CPU so at least one tick passes
	x := 0
	for i := 0; i < 60_000_000; i++ {
		x += i ^ (x >> 3)
	}
	b, err := ReadBusy([]int{})
	if err != nil {
		t.Fatal(err)
	}
	if b <= a {
		t.Errorf("busy ticks did not grow after burning CPU: %d -> %d (x=%d)", a, b, x)
	}
}

// TestProcessSecondsMoves: this process's CPU time grows while it spins; a
// pid that does not exist is an error.
func TestProcessSecondsMoves(t *testing.T) {
	before, err := ProcessSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < 150*time.Millisecond; {
	}
	after, err := ProcessSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 0.05 {
		t.Errorf("spun 150 ms, CPU time moved %.3f s (%.2f → %.2f)", after-before, before, after)
	}
	if _, err := ProcessSeconds(1 << 30); err == nil {
		t.Error("no error for a pid that does not exist")
	}
}
