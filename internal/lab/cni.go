package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/axonhq/axon/internal/netnsutil"
)

// cniPlugin is one plugin invocation as a kubelet/container runtime does it:
// the binary, its network config and the CNI_PATH it may use for delegates.
type cniPlugin struct {
	path    string
	cniPath string
	config  []byte
}

// axonCNI is the axon-cni plugin configured for node n.
func axonCNI(binDir string, n Node) (cniPlugin, error) {
	p := filepath.Join(binDir, "axon-cni")
	if _, err := os.Stat(p); err != nil {
		return cniPlugin{}, fmt.Errorf("axon-cni not found in %s: run `make build` (or pass --bin-dir): %w", binDir, err)
	}
	cfg, err := json.Marshal(map[string]any{
		"cniVersion": "1.1.0", "name": "axon", "type": "axon-cni", "socket": n.Socket, "mtu": 1500,
	})
	if err != nil {
		return cniPlugin{}, err
	}
	return cniPlugin{path: p, cniPath: binDir, config: cfg}, nil
}

// baselineConfList is the chained network config of the baseline datapath
// (reference ptp + host-local). Plugins of a list receive name and
// cniVersion from the list, as libcni does.
func baselineConfList(stateDir string, n Node) map[string]any {
	var ranges [][]map[string]string
	for _, p := range n.BaselineCIDRs {
		ranges = append(ranges, []map[string]string{{"subnet": p.String()}})
	}
	return map[string]any{
		"cniVersion": "1.0.0",
		"name":       "baseline",
		"plugins": []map[string]any{{
			"type":   "ptp",
			"ipMasq": false,
			"mtu":    1500,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  ranges,
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
				"dataDir": filepath.Join(stateDir, "nodes", n.Name, "baseline-ipam"),
			},
		}},
	}
}

func baselineCNI(stateDir string, n Node) (cniPlugin, error) {
	ptp, err := DepPath("ptp")
	if err != nil {
		return cniPlugin{}, err
	}
	if _, err := DepPath("host-local"); err != nil {
		return cniPlugin{}, err
	}
	list := baselineConfList(stateDir, n)
	plugin := list["plugins"].([]map[string]any)[0]
	conf := map[string]any{"cniVersion": list["cniVersion"], "name": list["name"]}
	for k, v := range plugin {
		conf[k] = v
	}
	cfg, err := json.Marshal(conf)
	if err != nil {
		return cniPlugin{}, err
	}
	return cniPlugin{path: ptp, cniPath: filepath.Dir(ptp), config: cfg}, nil
}

func pluginFor(st *State, n Node, datapath string) (cniPlugin, error) {
	switch datapath {
	case DatapathAxon:
		return axonCNI(st.BinDir, n)
	case DatapathBaseline:
		return baselineCNI(st.StateDir, n)
	}
	return cniPlugin{}, fmt.Errorf("unknown datapath %q (want %s or %s)", datapath, DatapathAxon, DatapathBaseline)
}

// invoke runs the plugin inside the node's network namespace with the
// kubelet's environment and returns its stdout.
func (c cniPlugin) invoke(ctx context.Context, command string, n Node, p Pod) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+netnsutil.Path(n.Netns), "--", c.path)
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+p.ContainerID,
		"CNI_NETNS="+netnsutil.Path(p.Netns),
		"CNI_IFNAME="+p.IfName,
		"CNI_PATH="+c.cniPath,
		fmt.Sprintf("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s", p.Namespace, p.Name, p.ContainerID),
	)
	cmd.Stdin = bytes.NewReader(c.config)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		var cerr types.Error
		if json.Unmarshal(stdout.Bytes(), &cerr) == nil && cerr.Msg != "" {
			msg = cerr.Error()
		}
		return nil, fmt.Errorf("CNI %s %s for pod %s on %s: %w: %s", command, filepath.Base(c.path), p.Name, n.Name, err, msg)
	}
	return stdout.Bytes(), nil
}

// cniAdd wires the pod and returns its addresses (IPv4 first).
func (c cniPlugin) add(ctx context.Context, n Node, p Pod) ([]netip.Addr, error) {
	out, err := c.invoke(ctx, "ADD", n, p)
	if err != nil {
		return nil, err
	}
	raw, err := current.NewResult(out)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD for pod %s: parse result %q: %w", p.Name, out, err)
	}
	res, err := current.NewResultFromResult(raw)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD for pod %s: convert result: %w", p.Name, err)
	}
	var v4, v6 []netip.Addr
	for _, ipc := range res.IPs {
		a, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	ips := append(v4, v6...)
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI ADD for pod %s returned no IP addresses: %s", p.Name, out)
	}
	return ips, nil
}

func (c cniPlugin) del(ctx context.Context, n Node, p Pod) error {
	_, err := c.invoke(ctx, "DEL", n, p)
	return err
}
