package connrate

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/vishvananda/netns"
)

// Place is where one side of a paired connect-rate run connects from.
// Empty fields: where the process already is.
type Place struct {
	Netns  string `json:"netns,omitempty"`  // a network namespace file: /run/netns/NAME, /proc/PID/ns/net
	Cgroup string `json:"cgroup,omitempty"` // a cgroup v2 directory: sockets made there run its socket-LB hooks
}

// placer moves the calling (locked) OS thread into a side's network
// namespace and the whole process into its cgroup before that side's
// slice. A socket belongs to the netns of the thread and the cgroup of the
// process that made it, so every connection of a slice starts from its
// side's pod. The moves happen between slices, outside the timed loops.
// It sets the thread's netns itself rather than through netnsutil.Do: the
// timed loops stay in a namespace across many slices, and a switch per call
// would be timed with them.
type placer struct {
	ns   [2]netns.NsHandle // -1: the side has none (it runs in home)
	home netns.NsHandle    // the thread's netns at the start; -1 when no side has one
	cg   [2]string
	cur  int // the side placed last; -1 before the first
}

// newPlacer opens the sides' namespaces. Either both sides name a cgroup
// or neither: a side without one would run in the other side's. Call it on
// the locked thread that runs the loops, and close it on that thread.
func newPlacer(from [2]Place) (*placer, error) {
	p := &placer{ns: [2]netns.NsHandle{-1, -1}, home: -1, cur: -1}
	if (from[0].Cgroup == "") != (from[1].Cgroup == "") {
		return nil, fmt.Errorf("paired: cgroups %q and %q: give both sides a cgroup or neither (a side without one would run in the other's)", from[0].Cgroup, from[1].Cgroup)
	}
	for i, f := range from {
		if f.Cgroup != "" {
			if _, err := os.Stat(filepath.Join(f.Cgroup, "cgroup.procs")); err != nil {
				return nil, fmt.Errorf("paired: cgroup %s is not a cgroup v2 directory: %w", f.Cgroup, err)
			}
			p.cg[i] = f.Cgroup
		}
	}
	if from[0].Netns == "" && from[1].Netns == "" {
		return p, nil
	}
	var err error
	if p.home, err = netns.Get(); err != nil {
		return nil, fmt.Errorf("paired: the thread's own netns: %w", err)
	}
	for i, f := range from {
		if f.Netns == "" {
			continue
		}
		if p.ns[i], err = netns.GetFromPath(f.Netns); err != nil {
			p.closeFDs()
			return nil, fmt.Errorf("paired: open netns %s: %w", f.Netns, err)
		}
	}
	return p, nil
}

// enter places the thread and the process for side i.
func (p *placer) enter(i int) error {
	if p.cur == i {
		return nil
	}
	if h := p.ns[i]; h >= 0 || p.home >= 0 {
		if h < 0 {
			h = p.home
		}
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("paired: enter the netns of side %d: %w", i, err)
		}
	}
	if p.cg[i] != "" {
		procs := filepath.Join(p.cg[i], "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("paired: move into %s: %w", procs, err)
		}
	}
	p.cur = i
	return nil
}

// close returns the thread to its own netns (the process stays in the
// cgroup of the side placed last) and closes the namespace handles.
func (p *placer) close() error {
	var err error
	if p.home >= 0 && p.cur >= 0 {
		if e := netns.Set(p.home); e != nil {
			err = fmt.Errorf("paired: return to the thread's netns: %w", e)
		}
	}
	p.closeFDs()
	return err
}

func (p *placer) closeFDs() {
	for _, h := range []netns.NsHandle{p.ns[0], p.ns[1], p.home} {
		if h >= 0 {
			_ = h.Close()
		}
	}
}
