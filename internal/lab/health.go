package lab

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lab/kubenode"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
)

// ProcessStatus is one lab process as `axon lab status` shows it.
type ProcessStatus struct {
	Name  string
	PID   int
	State string // "running" or "gone"
}

// HealthReport summarizes the lab's processes and what is wrong.
type HealthReport struct {
	Processes []ProcessStatus
	Problems  []string
}

// OK reports whether nothing is wrong.
func (r HealthReport) OK() bool { return len(r.Problems) == 0 }

func pidRunning(pid int) bool {
	if pid <= 0 {
		return false
	}
	state, _, err := proc.Stat(pid)
	return err == nil && state != 'Z' && syscall.Kill(pid, 0) == nil
}

// Health checks every recorded process, namespace and agent.
func (l *Lab) Health(ctx context.Context) HealthReport {
	st := l.State()
	var r HealthReport
	add := func(name string, pid int, ok bool) {
		s := "running"
		if !ok {
			s = "gone"
			r.Problems = append(r.Problems, fmt.Sprintf("%s (pid %d) is not running: `axon lab up` recreates the lab", name, pid))
		}
		r.Processes = append(r.Processes, ProcessStatus{name, pid, s})
	}
	for i, pid := range st.ControlPlane.PIDs {
		name := fmt.Sprint("control plane #", i)
		if i < len(controlplane.ProcessNames) {
			name = controlplane.ProcessNames[i]
		}
		add(name, pid, pidRunning(pid))
	}
	if st.Forwarder != nil {
		add("forwarder", st.Forwarder.PID, st.Forwarder.Alive())
	}
	for _, n := range st.Nodes {
		if n.Agent != nil {
			add("axon-agent/"+n.Name, n.Agent.PID, n.Agent.Alive())
		}
		if st.Kubelet { // the node's holder, containerd and kubelet (kubelet.go)
			r.kubeletNode(n)
		}
		if st.RunsAgent(n) {
			r.agentHealth(ctx, n)
		}
		if _, err := os.Stat(netnsutil.Path(n.Netns)); err != nil {
			r.Problems = append(r.Problems, fmt.Sprintf("netns %s is missing", n.Netns))
		}
	}
	for _, p := range st.Pods {
		if _, err := os.Stat(netnsutil.Path(p.Netns)); err != nil {
			r.Problems = append(r.Problems, fmt.Sprintf("netns %s of pod %s is missing", p.Netns, p.Name))
		}
	}
	for _, v := range st.VMPods { // --vm-pods: vmpods.go
		if v.QEMU != nil {
			add("qemu/"+v.Name, v.QEMU.PID, v.QEMU.Alive())
		}
		if v.DHCP != nil {
			add("udhcpd/"+v.Name, v.DHCP.PID, v.DHCP.Alive())
		}
	}
	if !st.Ready {
		r.Problems = append(r.Problems, "`axon lab up` did not finish: run it again")
	}
	return r
}

// kubeletNode adds a --kubelet node's processes: the mount namespace holder, containerd,
// kubelet.
func (r *HealthReport) kubeletNode(n Node) {
	ps, err := kubenode.Processes(n.KubeNodeDir)
	if err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf("node %s: %v", n.Name, err))
	}
	for _, p := range ps {
		s := "running"
		if !p.Alive {
			s = "gone"
			r.Problems = append(r.Problems, fmt.Sprintf("%s of node %s (pid %d) is not running (log %s): `axon lab up` recreates the lab", p.Name, n.Name, p.PID, p.Log))
		}
		r.Processes = append(r.Processes, ProcessStatus{p.Name + "/" + n.Name, p.PID, s})
	}
}

// agentHealth adds a problem when node n's agent does not answer healthy, with where to look:
// the lab agent's log, or the DaemonSet (--kubelet).
func (r *HealthReport) agentHealth(ctx context.Context, n Node) {
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := api.NewClient(n.Socket).Healthy(hctx); err != nil {
		where := fmt.Sprintf("DaemonSet %s/%s", AxonNamespace, AxonDaemonSet)
		if n.Agent != nil {
			where = "log " + n.Agent.Log
		}
		r.Problems = append(r.Problems, fmt.Sprintf("agent of %s: %v (%s)", n.Name, err, where))
	}
}
