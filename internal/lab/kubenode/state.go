package kubenode

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/axonhq/axon/internal/proc"
)

const stateFile = "node.json"

// procRecord identifies one detached process in node.json. StartTime (see proc.Record) guards
// against signalling an unrelated process that reused the PID.
type procRecord struct {
	Name      string   `json:"name"`
	PID       int      `json:"pid"`
	StartTime uint64   `json:"startTime"`
	Args      []string `json:"args"`
	Env       []string `json:"env,omitempty"`
	Log       string   `json:"log"`
}

func (r procRecord) record() *proc.Record {
	return &proc.Record{PID: r.PID, StartTime: r.StartTime, Log: r.Log}
}

// nodeState is node.json: what Stop needs without the Config.
type nodeState struct {
	Name       string `json:"name"`
	NetnsPath  string `json:"netnsPath,omitempty"`
	CgroupRoot string `json:"cgroupRoot"`
	// OwnedDirs are the node's directories bound over host paths (see privateDirs); Stop removes them.
	OwnedDirs []string `json:"ownedDirs,omitempty"`
	// Processes in start order (holder, containerd, kubelet); stopped in reverse.
	Processes []procRecord `json:"processes"`
}

func readState(dir string) (nodeState, error) {
	var st nodeState
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read %s: %w", stateFile, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse %s: %w (stop stray processes by hand, then delete it)", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

func writeState(dir string, st nodeState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode node state: %w", err)
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	return nil
}

// Stop stops the node recorded in dir: kubelet first (so it restarts nothing), then every
// process left in the node's cgroups (containerd, its shims, the pods' containers), then the
// mount namespace holder; the mount namespace, and with it every mount containerd and kubelet
// made (overlays, pod netns, the rshared root dir, the /proc/sys binds), goes with its last
// process. It removes the cgroups and the runtime's directories; logs/ and node.json stay.
// Stop on a dir without node.json does nothing.
func Stop(dir string) error {
	st, err := readState(dir)
	if err != nil {
		return err
	}
	if st.Name == "" && st.CgroupRoot == "" && len(st.Processes) == 0 {
		return nil
	}
	var errs []error
	for i := len(st.Processes) - 1; i >= 0; i-- {
		if st.Processes[i].Name != "kubelet" {
			continue
		}
		if err := st.Processes[i].record().Stop(10 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop kubelet: %w", err))
		}
	}
	if st.CgroupRoot != "" {
		cg, err := findCgroups(st.CgroupRoot)
		if err != nil {
			errs = append(errs, err)
		} else if err := cg.killAll(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(st.Processes) - 1; i >= 0; i-- { // anything that escaped its cgroup
		if err := st.Processes[i].record().Stop(5 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", st.Processes[i].Name, err))
		}
	}
	if st.CgroupRoot != "" && len(errs) == 0 {
		cg, err := findCgroups(st.CgroupRoot)
		if err == nil {
			err = cg.remove()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		rm := st.OwnedDirs
		for _, p := range []string{"containerd", "sysctl", "containerd.sock", "containerd.sock.ttrpc"} {
			rm = append(rm, filepath.Join(dir, p))
		}
		for _, p := range rm {
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop node %s (%s): %w", st.Name, dir, errors.Join(errs...))
	}
	st.Processes = nil
	return writeState(dir, st)
}

// Process is one of a node's processes as node.json records it.
type Process struct {
	Name  string // holder, containerd or kubelet
	PID   int
	Alive bool // still the recorded process (same start time), not exited
	Log   string
}

// Processes lists the processes of the node recorded in dir, in start order; none when dir has
// no node.json.
func Processes(dir string) ([]Process, error) {
	st, err := readState(dir)
	if err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(st.Processes))
	for _, p := range st.Processes {
		out = append(out, Process{Name: p.Name, PID: p.PID, Alive: p.record().Alive(), Log: p.Log})
	}
	return out, nil
}
