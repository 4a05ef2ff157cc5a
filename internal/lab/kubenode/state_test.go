package kubenode

import (
	"os"
	"testing"

	"github.com/axonhq/axon/internal/proc"
)

func TestProcessesReportsWhichAreAlive(t *testing.T) {
	dir := t.TempDir()
	if ps, err := Processes(dir); err != nil || len(ps) != 0 {
		t.Fatalf("no node.json: %v, %v; want none, nil", ps, err)
	}
	_, start, err := proc.Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	st := nodeState{Name: "node1", Processes: []proc.Named{
		{Name: "holder", Record: proc.Record{PID: os.Getpid(), StartTime: start, Log: "h.log"}},
		{Name: "containerd", Record: proc.Record{PID: os.Getpid(), StartTime: start + 1}}, // the PID reused by another process
		{Name: "kubelet"},
	}}
	if err := writeState(dir, st); err != nil {
		t.Fatal(err)
	}
	ps, err := Processes(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []Process{{"holder", os.Getpid(), true, "h.log"}, {"containerd", os.Getpid(), false, ""}, {"kubelet", 0, false, ""}}
	if len(ps) != len(want) {
		t.Fatalf("got %v, want %v", ps, want)
	}
	for i := range want {
		if ps[i] != want[i] {
			t.Errorf("process %d: got %+v, want %+v", i, ps[i], want[i])
		}
	}
	if err := os.WriteFile(dir+"/"+stateFile, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Processes(dir); err == nil {
		t.Error("a corrupt node.json: no error")
	}
}
