package vmtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestHostPressure(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"some avg10=93.13 avg60=76.31 avg300=35.03 total=7616101567\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 93.13, true},
		{"full avg10=1.00 avg60=0.00 avg300=0.00 total=0\n", 0, false},
		{"", 0, false},
	} {
		if v, ok := parseAvg10(tc.in); v != tc.want || ok != tc.ok {
			t.Errorf("parseAvg10(%q) = %v, %v; want %v, %v", tc.in, v, ok, tc.want, tc.ok)
		}
	}
	if got, want := summarizePressure([]float64{90, 10, 50, 70}), "median 60.0 % (min–max 10.0–90.0 %, 4 samples)"; got != want {
		t.Errorf("summarizePressure = %q, want %q", got, want)
	}
	if _, err := os.Stat("/proc/pressure/cpu"); err != nil {
		t.Skip("no /proc/pressure/cpu (kernel without PSI)")
	}
	dir := t.TempDir()
	stop := mirrorHostPressure(context.Background(), dir, 10*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	samples := stop()
	b, err := os.ReadFile(filepath.Join(dir, HostPressureFile))
	if err != nil || len(samples) == 0 {
		t.Fatalf("mirror: file %q (%v), %d samples", b, err, len(samples))
	}
	if _, ok := parseAvg10(string(b)); !ok {
		t.Errorf("mirrored file is not /proc/pressure/cpu: %q", b)
	}
}
