package kubenode

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// Ports of the kubelet inside the node's network namespace (one per node: no collisions).
const (
	kubeletPort        = 10250
	kubeletHealthzPort = 10248
)

// containerdConfig renders containerd's config (version 3, containerd 2.x). Every path is the
// node's own so that several nodes share the host:
//   - root, state, both sockets and runc's state root (Root: runc's default /run/containerd/runc is
//     a plain directory, shared by every mount namespace);
//   - pod netns bind mounts in /run/netns (containerd's default), which is the node's own
//     directory (privateDirs): CNI ADD gets /var/run/netns/cni-<uuid>, the path a CNI agent's
//     hostPath /var/run/netns shows it; nothing shows in the host's `ip netns`;
//   - restrict_oom_score_adj: containerd asks for oom_score_adj -998 for every sandbox (-997 for
//     Guaranteed containers); lowering it needs CAP_SYS_RESOURCE, which some hosts (this lab's
//     sandboxed machines among them) do not grant even to root: runc then fails with "can't get
//     final child's PID from pipe: EOF". Restricted, no container goes below containerd's own;
//   - NRI off (its socket, /var/run/nri/nri.sock, would be shared) and the opt plugin off (it
//     writes /opt/containerd);
//   - CNI from the node's /etc/cni/net.d (Config.CNIConfDir) and /opt/cni/bin, then Config.CNIBinDir
//     (see privateDirs); use_internal_loopback: no `loopback` CNI binary needed; SystemdCgroup false: kubelet runs
//     the cgroupfs driver (no systemd on the lab host).
func containerdConfig(c Config) string {
	q := tomlString
	dir := func(p string) string { return q(filepath.Join(c.Dir, p)) }
	return fmt.Sprintf(`# written by axon's kubenode for node %[1]s; do not edit
version = 3
root = %[2]s
state = %[3]s
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[grpc]
  address = %[4]s
[ttrpc]
  address = %[5]s
[debug]
  address = ""
[metrics]
  address = ""

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %[6]s

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/opt/cni/bin", %[7]s]
  conf_dir = "/etc/cni/net.d"
  use_internal_loopback = true
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = %[8]s
    Root = %[9]s
    SystemdCgroup = false
`, c.Name, dir("containerd/root"), dir("containerd/state"), q(c.socket()), q(c.socket()+".ttrpc"),
		q(c.PauseImage), q(c.CNIBinDir), q(c.Binaries.Runc), dir("containerd/runc"))
}

// kubeletConfig renders the KubeletConfiguration:
//   - cgroupfs driver with failCgroupV1 false (hybrid hosts), its own cgroupRoot;
//   - protectKernelDefaults true: never write the host's sysctls (see kernelTunables);
//   - API on 127.0.0.1 of the node netns (NodeIP with ServeOnNodeIP), x509 client certs from
//     ClientCAFile, no read-only port; its serving certificate is kubelet's self-signed one;
//   - evictionHard on memory only and image GC at 100%: the lab's images are imported, not
//     pulled, and a busy shared disk must not evict them or the pods;
//   - resolvConf "": pods get no host resolv.conf; with ClusterDNS, kubelet's clusterDNS and
//     clusterDomain give them the cluster's nameserver and search domains.
func kubeletConfig(c Config) string {
	q := yamlString
	return fmt.Sprintf(`# written by axon's kubenode for node %[1]s; do not edit
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: %[2]s
protectKernelDefaults: true
failSwapOn: false
address: %[7]s
port: %[3]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
containerRuntimeEndpoint: %[5]s
podLogsDir: "/var/log/pods"
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[6]s}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "100Mi"}
imageGCHighThresholdPercent: 100
resolvConf: ""
registerNode: true
`, c.Name, q(c.CgroupRoot), kubeletPort, kubeletHealthzPort, q("unix://"+c.socket()),
		q(c.ClientCAFile), q(c.apiAddress())) + c.dnsConfig()
}

// dnsConfig are the clusterDNS lines of the KubeletConfiguration (none without ClusterDNS).
func (c Config) dnsConfig() string {
	if c.ClusterDNS == nil {
		return ""
	}
	domain := c.ClusterDomain
	if domain == "" {
		domain = "cluster.local"
	}
	return fmt.Sprintf("clusterDNS: [%s]\nclusterDomain: %s\n", yamlString(c.ClusterDNS.String()), yamlString(domain))
}

// apiAddress is where kubelet's API listens: 127.0.0.1 of the node netns, or NodeIP.
func (c Config) apiAddress() string {
	if c.ServeOnNodeIP {
		return c.NodeIP.String()
	}
	return "127.0.0.1"
}

// kubeletArgs are the flags that are not (or no longer) config fields: --containerd points
// cadvisor at the node's containerd (its default is the host's /run/containerd/containerd.sock).
func kubeletArgs(c Config) []string {
	return []string{
		"--config=" + filepath.Join(c.Dir, "kubelet.yaml"),
		"--kubeconfig=" + c.Kubeconfig,
		"--root-dir=/var/lib/kubelet", // the node's own (privateDirs)
		"--hostname-override=" + c.Name,
		"--node-ip=" + c.nodeIPs(),
		"--containerd=" + c.socket(),
		"--v=1",
	}
}

// nodeIPs is kubelet's --node-ip: NodeIP, or the dual-stack pair NodeIP,NodeIPv6.
func (c Config) nodeIPs() string {
	if c.NodeIPv6 == nil {
		return c.NodeIP.String()
	}
	return c.NodeIP.String() + "," + c.NodeIPv6.String()
}

// tomlString quotes s as a TOML basic string (JSON escapes are a subset of TOML's).
func tomlString(s string) string { return jsonString(s) }

// yamlString quotes s as a YAML double-quoted scalar (JSON is YAML).
func yamlString(s string) string { return jsonString(s) }

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	// json.Marshal escapes <, > and & as \u003c...: valid in TOML and YAML, but unreadable.
	r := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&")
	return r.Replace(string(b))
}
