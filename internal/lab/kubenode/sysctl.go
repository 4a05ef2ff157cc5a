package kubenode

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// kernelTunables are the machine-wide sysctls kubelet checks at start (setupKernelTunables in
// pkg/kubelet/cm, values from k8s.io/component-helpers/node/util/sysctl). With
// protectKernelDefaults false kubelet WRITES them — on the lab host that would change the whole
// machine — with true it refuses to start unless they hold these values. The node therefore runs
// with protectKernelDefaults true and, in its private mount namespace only, a file holding the
// expected value bound over each /proc/sys path that differs. The root namespace's values are
// never written.
var kernelTunables = []struct {
	path  string // below /proc/sys
	value int
}{
	{"vm/overcommit_memory", 1},
	{"vm/panic_on_oom", 0},
	{"kernel/panic", 10},
	{"kernel/panic_on_oops", 1},
	{"kernel/keys/root_maxkeys", 1000000},
	{"kernel/keys/root_maxbytes", 25000000},
}

// bindKernelTunables binds the expected value over every tunable that differs, inside the mount
// namespace of holder, and checks that the node sees it there.
func bindKernelTunables(ctx context.Context, t tools, holder int, dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for _, kt := range kernelTunables {
		procPath := filepath.Join("/proc/sys", kt.path)
		cur, err := readIntFile(procPath)
		if err != nil {
			return fmt.Errorf("kernel tunable kubelet checks: %w", err)
		}
		if cur == kt.value {
			continue
		}
		f := filepath.Join(dir, strings.ReplaceAll(kt.path, "/", "."))
		if err := os.WriteFile(f, []byte(strconv.Itoa(kt.value)+"\n"), 0o444); err != nil {
			return fmt.Errorf("write %s: %w", f, err)
		}
		if out, err := exec.CommandContext(ctx, t.nsenter, "-t", strconv.Itoa(holder), "-m", "--", t.mount, "--bind", f, procPath).CombinedOutput(); err != nil {
			return fmt.Errorf("bind %s over %s in the node's mount namespace: %w: %s", f, procPath, err, out)
		}
		out, err := exec.CommandContext(ctx, t.nsenter, "-t", strconv.Itoa(holder), "-m", "--", "/bin/cat", procPath).Output()
		if err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(kt.value) {
			return fmt.Errorf("%s in the node's mount namespace reads %q (%v), want %d after the bind mount", procPath, out, err, kt.value)
		}
		log.Debug("kernel tunable bound in the node's mount namespace", "sysctl", kt.path, "host", cur, "node", kt.value)
	}
	return nil
}

func readIntFile(p string) (int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return v, nil
}
