package kubenode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/axonhq/axon/internal/atomicfile"
	"github.com/axonhq/axon/internal/proc"
)

const stateFile = "node.json"

// nodeState is node.json: what Stop needs without the Config.
type nodeState struct {
	Name       string `json:"name"`
	NetnsPath  string `json:"netnsPath,omitempty"`
	CgroupRoot string `json:"cgroupRoot"`
	// OwnedDirs are the node's directories bound over host paths (see privateDirs); Stop removes them.
	OwnedDirs []string `json:"ownedDirs,omitempty"`
	// Processes in start order (holder, containerd, kubelet); stopped in reverse.
	Processes []proc.Named `json:"processes"`
}

// readState reads node.json; none is an empty state.
func readState(dir string) (nodeState, error) {
	var st nodeState
	err := atomicfile.ReadJSON(filepath.Join(dir, stateFile), &st)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("%w (stop stray processes by hand, then delete it)", err)
	}
	return st, nil
}

func writeState(dir string, st nodeState) error {
	return atomicfile.WriteJSON(filepath.Join(dir, stateFile), st, 0o644)
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
		if err := st.Processes[i].Stop(10 * time.Second); err != nil {
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
		if err := st.Processes[i].Stop(5 * time.Second); err != nil {
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
		out = append(out, Process{Name: p.Name, PID: p.PID, Alive: p.Alive(), Log: p.Log})
	}
	return out, nil
}
