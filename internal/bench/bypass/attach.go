package bypass

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/agent"
	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/sockmap"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/netnsutil"
)

// switcher turns the bypass on or off for the two bench pods' new
// connections and reads the bypass's counters.
type switcher interface {
	// set makes the pods' next connections take arm (ArmBypass or ArmStack).
	set(ctx context.Context, arm string) error
	// counters are the bypass's BPF counters (summed over CPUs).
	counters(ctx context.Context) (map[string]uint64, error)
	// conns are the sockets in the SOCKHASH with their modes and bytes.
	conns(ctx context.Context) ([]api.SockmapConn, error)
	// close undoes what the switcher set up.
	close(ctx context.Context) error
}

// agentSwitch switches through the product: the pods' axon.io/sockmap
// annotation, which the agent turns into admission map entries.
type agentSwitch struct {
	kube   kubernetes.Interface
	agent  *api.Client
	pods   []lab.Pod
	wait   time.Duration
	armNow string
}

func (s *agentSwitch) set(ctx context.Context, arm string) error {
	if s.armNow == arm {
		return nil
	}
	value := agent.SockmapEnabled
	if arm == ArmStack {
		value = agent.SockmapDisabled
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, agent.AnnotationSockmap, value)
	for _, p := range s.pods {
		if _, err := s.kube.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("annotate pod %s/%s %s=%s: %w", p.Namespace, p.Name, agent.AnnotationSockmap, value, err)
		}
	}
	// Wait until the agent applied it: the pods are listed as not admitted
	// (stack), or no longer listed with at least as many pods admitted
	// (bypass), in its status. The counters around each measurement show
	// what the kernel did (the report's redirect_bytes check).
	deadline := time.Now().Add(s.wait)
	for {
		st, err := s.agent.Status(ctx)
		if err == nil && st.Sockmap != nil {
			out := 0
			for _, p := range s.pods {
				if slices.ContainsFunc(st.Sockmap.NotAdmitted, func(n string) bool { return strings.HasPrefix(n, p.Namespace+"/"+p.Name+":") }) {
					out++
				}
			}
			if (arm == ArmStack && out == len(s.pods)) || (arm == ArmBypass && out == 0 && st.Sockmap.PodsAdmitted >= len(s.pods)) {
				s.armNow = arm
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not apply %s=%s to the bench pods within %s (status: %v): is it watching Pods?", agent.AnnotationSockmap, value, s.wait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *agentSwitch) counters(ctx context.Context) (map[string]uint64, error) {
	rep, err := s.agent.SockmapConns(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the agent's bypass counters: %w", err)
	}
	if !rep.Enabled {
		return nil, fmt.Errorf("the agent's bypass turned off during the benchmark: %s", rep.Reason)
	}
	return rep.Counters, nil
}

func (s *agentSwitch) conns(ctx context.Context) ([]api.SockmapConn, error) {
	rep, err := s.agent.SockmapConns(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the agent's bypassed connections: %w", err)
	}
	return rep.Conns, nil
}

func (s *agentSwitch) close(context.Context) error { return nil } // the pods go with the benchmark

// directSwitch loads internal/datapath/sockmap itself, on the lab node's
// cgroup root with a private pin dir, and admits exactly the two bench pods
// (SetPod, SetNetns) for the bypass arm and withdraws them (DeletePod,
// DeleteNetns) for the stack arm.
type directSwitch struct {
	b      *sockmap.Bypass
	pinDir string
	pods   []directPod
	armNow string
}

type directPod struct {
	ip     netip.Addr
	cookie uint64
}

// directPinDir is the direct attach's pin dir for node: under the lab's pin
// root, so that `axon lab down` removes what an interrupted run left.
func directPinDir(node string) string {
	return filepath.Join(lab.PinRoot, "bench-sockmap-"+node)
}

// loadDirect loads the bypass on cgroup (the node's cgroup root) for pods,
// with the stream verdict where the kernel self-test asks for it. It returns
// the self-test's verdict for the report.
func loadDirect(ctx context.Context, node, cgroup string, pods []lab.Pod, log *slog.Logger) (*directSwitch, string, error) {
	pinDir := directPinDir(node)
	if _, err := os.Stat(pinDir); err == nil { // an interrupted run's
		if err := sockmap.Uninstall(pinDir); err != nil {
			return nil, "", fmt.Errorf("remove the bypass a previous benchmark left in %s: %w", pinDir, err)
		}
	}
	s := &directSwitch{pinDir: pinDir}
	for _, p := range pods {
		c, err := netnsutil.Cookie(netnsutil.Path(p.Netns))
		if err != nil {
			return nil, "", fmt.Errorf("netns cookie of pod %s: %w", p.Name, err)
		}
		s.pods = append(s.pods, directPod{ip: p.IP, cookie: c})
	}
	st := sockmap.SelfTest(ctx)
	cfg := sockmap.Config{StreamVerdict: st.StreamVerdict}
	b, err := sockmap.Load(pinDir, cgroup, cfg, log)
	guard := "with the splice guard"
	if errors.Is(err, sockmap.ErrNoSpliceGuard) {
		// qperf never splices: the measurement needs no guard, but the
		// report says the guard's cost (a trampoline on every read and
		// write of the node) is not in it.
		_ = sockmap.Uninstall(pinDir)
		guard = "without the splice guard, which this kernel cannot run (" + firstLine(err) +
			"); qperf does not splice, and the guard's cost on every read and write of the node is not in these numbers"
		cfg.NoSpliceGuard = true
		b, err = sockmap.Load(pinDir, cgroup, cfg, log)
	}
	if err != nil {
		_ = sockmap.Uninstall(pinDir)
		return nil, "", fmt.Errorf("load the bypass on %s: %w", cgroup, err)
	}
	s.b = b
	verdict := "without the no-op stream verdict (the kernel self-test does not ask for it)"
	if st.StreamVerdict {
		verdict = "with the no-op stream verdict, as the kernel self-test asks"
	}
	return s, verdict + ", " + guard, nil
}

// firstLine is the first line of err's text (a verifier log may follow).
func firstLine(err error) string {
	head, _, _ := strings.Cut(err.Error(), "\n")
	return head
}

func (s *directSwitch) set(_ context.Context, arm string) error {
	if s.armNow == arm {
		return nil
	}
	var errs []error
	for _, p := range s.pods {
		if arm == ArmBypass {
			errs = append(errs, s.b.SetPod(p.ip, p.cookie), s.b.SetNetns(p.cookie))
		} else {
			errs = append(errs, s.b.DeletePod(p.ip), s.b.DeleteNetns(p.cookie))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("switch the bench pods to the %s: %w", arm, err)
	}
	s.armNow = arm
	return nil
}

func (s *directSwitch) counters(context.Context) (map[string]uint64, error) { return s.b.Metrics() }

func (s *directSwitch) conns(context.Context) ([]api.SockmapConn, error) {
	cs, err := s.b.Conns()
	if err != nil {
		return nil, err
	}
	out := make([]api.SockmapConn, 0, len(cs))
	for _, c := range cs {
		out = append(out, api.SockmapConn{Local: c.Local, Remote: c.Remote, Netns: c.Netns, Mode: c.Mode, Alias: c.Alias,
			RedirectedMsgs: c.RedirectedMsgs, RedirectedBytes: c.RedirectedBytes, PassedBytes: c.PassedBytes})
	}
	return out, nil
}

// close withdraws the pods, unloads the programs and removes the pins.
func (s *directSwitch) close(ctx context.Context) error {
	err := s.set(ctx, ArmStack)
	err = errors.Join(err, s.b.Close(), sockmap.Uninstall(s.pinDir))
	if rerr := os.RemoveAll(filepath.Join(s.pinDir, "links")); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if rerr := os.Remove(s.pinDir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("remove %s (what is left in it?): %w", s.pinDir, rerr))
	}
	return err
}
