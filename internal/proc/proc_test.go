package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stat      string
		wantState byte
		wantStart uint64
		wantErr   bool
	}{
		{
			name:      "plain",
			stat:      "1234 (etcd) S 1 1234 1234 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 12 0 98765 1000 10 18446744073709551615",
			wantState: 'S',
			wantStart: 98765,
		},
		{
			name:      "comm with spaces and parens",
			stat:      "7 (a) b (c) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0 0",
			wantState: 'R',
			wantStart: 42,
		},
		{
			name:      "zombie",
			stat:      "9 (kube-apiserver) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0",
			wantState: 'Z',
			wantStart: 77,
		},
		{
			name:      "dead",
			stat:      "9 (x) X 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 78 0 0",
			wantState: 'X',
			wantStart: 78,
		},
		{name: "truncated", stat: "9 (x) S 1 2 3", wantErr: true},
		{name: "garbage", stat: "nonsense", wantErr: true},
		{name: "starttime not a number", stat: "9 (x) S 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 soon 0 0", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, start, err := parseStat([]byte(tc.stat))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil && (state != tc.wantState || start != tc.wantStart) {
				t.Errorf("got state=%c start=%d, want %c %d", state, start, tc.wantState, tc.wantStart)
			}
		})
	}
}

func TestAlive(t *testing.T) {
	_, self, err := Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if Exited(os.Getpid()) {
		t.Error("Exited(this process) = true")
	}
	for _, tc := range []struct {
		name string
		r    *Record
		want bool
	}{
		{"nil", nil, false},
		{"zero pid", &Record{}, false},
		{"negative pid", &Record{PID: -1, StartTime: self}, false},
		{"this process", &Record{PID: os.Getpid(), StartTime: self}, true},
		{"reused pid (other start time)", &Record{PID: os.Getpid(), StartTime: self + 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.Alive(); got != tc.want {
				t.Errorf("Alive() = %v, want %v", got, tc.want)
			}
		})
	}
}

// Stop never signals a PID whose start time differs: here that PID is this test process.
func TestStopIgnoresReusedPID(t *testing.T) {
	for _, r := range []*Record{nil, {}, {PID: os.Getpid(), StartTime: 1}} {
		if err := r.Stop(time.Second); err != nil {
			t.Errorf("Stop(%+v) = %v", r, err)
		}
	}
}

func TestStartAndStop(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "sub", "p.log") // directory created by Start
	r, exited, err := Start(Spec{
		Argv:   []string{"/bin/sh", "-c", `echo "env=$PROC_TEST_VAR"; exec sleep 60`},
		Env:    []string{"PROC_TEST_VAR=42"},
		Log:    logPath,
		Banner: "=== banner\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(time.Second) })
	if r.PID <= 0 || r.StartTime == 0 || r.Log != logPath {
		t.Fatalf("record %+v", r)
	}
	if !r.Alive() {
		t.Fatal("started process not alive")
	}
	waitLog(t, logPath, "env=42")
	if tail, _ := LogTail(logPath, 10); !strings.HasPrefix(tail, "=== banner\n") {
		t.Errorf("log does not start with the banner:\n%s", tail)
	}
	if err := r.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if r.Alive() {
		t.Error("alive after Stop")
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Error("exit channel not closed after Stop")
	}
	if err := r.Stop(time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "p.log")
	// SIGTERM stays ignored across exec.
	r, exited, err := Start(Spec{Argv: []string{"/bin/sh", "-c", `trap "" TERM; echo ready; exec sleep 60`}, Log: logPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(time.Second) })
	waitLog(t, logPath, "ready")
	t0 := time.Now()
	if err := r.Stop(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Errorf("Stop returned after %v, before the grace period: SIGTERM was not ignored?", d)
	}
	if r.Alive() {
		t.Error("alive after Stop")
	}
	<-exited
}

// A process that exits at once still gets a record (its start time is read before it is
// reaped); its exit is reported on the channel.
func TestStartExitsAtOnce(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "p.log")
	r, exited, err := Start(Spec{Argv: []string{"/bin/sh", "-c", "echo bye; exit 3"}, Log: logPath})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("exit channel not closed")
	}
	if r.StartTime == 0 || r.Alive() {
		t.Errorf("record %+v: start time missing or still alive", r)
	}
}

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"empty argv", Spec{Log: filepath.Join(dir, "a.log")}, "empty command"},
		{"missing binary", Spec{Argv: []string{filepath.Join(dir, "nope")}, Log: filepath.Join(dir, "b.log")}, "start " + filepath.Join(dir, "nope")},
		{"log is a directory", Spec{Argv: []string{"/bin/true"}, Log: dir}, "open log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Start(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start error = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestLogTail(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		path    string
		n       int
		want    string
		wantErr bool
	}{
		{"last lines", write("a", "1\n2\n3\n4\n"), 2, "3\n4", false},
		{"fewer lines than n", write("b", "1\n2\n"), 5, "1\n2", false},
		{"no final newline", write("c", "1\n2\n3"), 2, "2\n3", false},
		{"trailing blank lines dropped", write("d", "1\n2\n\n\n"), 1, "2", false},
		{"empty", write("e", ""), 3, "", false},
		{"missing", filepath.Join(dir, "missing"), 3, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LogTail(tc.path, tc.n)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("LogTail = %q, want %q", got, tc.want)
			}
		})
	}
}

func waitLog(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, _ := os.ReadFile(path); strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never contained %q", path, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStartTime(t *testing.T) {
	got, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// this test process started before now and not long ago
	if now := time.Now(); got.After(now.Add(time.Second)) || got.Before(now.Add(-10*time.Minute)) {
		t.Fatalf("StartTime of the test process = %s, now %s", got, now)
	}
	if _, err := StartTime(-1); err == nil {
		t.Fatal("StartTime(-1): want an error")
	}
	// a child started now: within the kernel's 10 ms ticks of the time
	// taken around its exec (btime alone would be up to a second off)
	before := time.Now()
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	got, err = StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if got.Before(before.Add(-20*time.Millisecond)) || got.After(after.Add(20*time.Millisecond)) {
		t.Fatalf("StartTime of a child started between %s and %s = %s", before.Format("15:04:05.000"), after.Format("15:04:05.000"), got.Format("15:04:05.000"))
	}
}
