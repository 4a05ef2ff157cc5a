package vmtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultModules are loaded at boot when they are modules of the kernel (built-in ones
// are skipped). A trailing "?" marks a module that may be missing from a kernel entirely.
func DefaultModules() []string {
	return []string{
		// the 9p shares and the NIC
		"9p", "9pnet_virtio", "virtio_net", "virtio_pci?",
		// datapath tests and probes
		"veth", "dummy", "sch_ingress", "cls_bpf", "sch_fq", "tcp_bbr", "netkit?",
		// the VM-pod bridge bypass tests: tap devices (/dev/net/tun)
		"tun",
		// lab subset
		"bridge", "br_netfilter?",
		// Bandwidth Manager's TBF baseline (the reference bandwidth CNI plugin: ifb + tbf + u32 + mirred)
		"sch_tbf", "ifb", "cls_u32", "act_mirred",
		// the same-node TCP bypass's sidecar tests: iptables-nft nat REDIRECT and -m owner in pod namespaces
		// (libcrc32c, which nf_conntrack and nf_tables need, fails its init without the crc32c algorithm:
		// a soft dependency, which no modprobe resolves in the VM)
		"crc32c_generic?", "nf_tables?", "nft_compat?", "nft_chain_nat?", "xt_REDIRECT?", "xt_owner?", "nf_nat?",
	}
}

// ModuleIndex is a parsed modules.dep plus modules.builtin of one kernel.
type ModuleIndex struct {
	paths   map[string]string   // name → path relative to the modules dir
	deps    map[string][]string // name → names of its dependencies
	builtin map[string]bool
}

// modName turns "kernel/net/sched/sch_fq.ko.xz" into "sch_fq" (dashes become underscores).
func modName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// ParseModules reads modules.dep and modules.builtin (optional) from a modules dir.
func ParseModules(modulesDir string) (*ModuleIndex, error) {
	dep, err := os.ReadFile(filepath.Join(modulesDir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("read modules.dep (run depmod -b): %w", err)
	}
	builtin, err := os.ReadFile(filepath.Join(modulesDir, "modules.builtin"))
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("read modules.builtin: %w", err)
	}
	return parseModuleIndex(dep, builtin)
}

func parseModuleIndex(dep, builtin []byte) (*ModuleIndex, error) {
	idx := &ModuleIndex{paths: map[string]string{}, deps: map[string][]string{}, builtin: map[string]bool{}}
	sc := bufio.NewScanner(bytes.NewReader(dep))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		path, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: no colon: %q", n, line)
		}
		name := modName(path)
		idx.paths[name] = path
		for _, d := range strings.Fields(rest) {
			idx.deps[name] = append(idx.deps[name], modName(d))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(builtin), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			idx.builtin[modName(line)] = true
		}
	}
	return idx, nil
}

// Path returns the module's file path relative to the modules dir.
func (idx *ModuleIndex) Path(name string) (string, bool) {
	p, ok := idx.paths[strings.ReplaceAll(name, "-", "_")]
	return p, ok
}

// Resolve returns the modules to load, dependencies first, for the wanted names.
// Built-in modules are left out; a wanted module the kernel lacks is an error unless
// it is marked optional with a trailing "?", in which case it is reported in missing.
func (idx *ModuleIndex) Resolve(wanted []string) (order []string, missing []string, err error) {
	seen := map[string]bool{}
	var visit func(name string, stack []string) error
	visit = func(name string, stack []string) error {
		if seen[name] {
			return nil
		}
		for _, s := range stack {
			if s == name {
				return fmt.Errorf("module dependency cycle: %s", strings.Join(append(stack, name), " -> "))
			}
		}
		for _, d := range idx.deps[name] {
			if err := visit(d, append(stack, name)); err != nil {
				return err
			}
		}
		seen[name] = true
		order = append(order, name)
		return nil
	}
	for _, w := range wanted {
		optional := strings.HasSuffix(w, "?")
		name := strings.ReplaceAll(strings.TrimSuffix(w, "?"), "-", "_")
		switch {
		case idx.builtin[name]:
			continue
		case idx.paths[name] == "":
			if optional {
				missing = append(missing, name)
				continue
			}
			return nil, nil, fmt.Errorf("module %s is neither a module nor built into this kernel (mark it optional with %q)", name, name+"?")
		}
		if err := visit(name, nil); err != nil {
			return nil, nil, err
		}
	}
	return order, missing, nil
}
