package kubenode

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// validConfig is a Config whose files exist (fake executables, a regular file as netns).
func validConfig(t *testing.T) Config {
	t.Helper()
	d := t.TempDir()
	bin := filepath.Join(d, "bin")
	for _, sub := range []string{"bin", "cni-bin", "cni-conf"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "kubelet"} {
		if err := os.WriteFile(filepath.Join(bin, f), []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"netns", "kubeconfig", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(d, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Config{
		Name: "node1", NetnsPath: filepath.Join(d, "netns"), NodeIP: net.IPv4(198, 19, 0, 1),
		Kubeconfig: filepath.Join(d, "kubeconfig"), ClientCAFile: filepath.Join(d, "ca.crt"),
		Binaries: Binaries{
			Containerd: filepath.Join(bin, "containerd"), ShimDir: bin, Ctr: filepath.Join(bin, "ctr"),
			Runc: filepath.Join(bin, "runc"), Kubelet: filepath.Join(bin, "kubelet"),
		},
		CNIBinDir: filepath.Join(d, "cni-bin"), CNIConfDir: filepath.Join(d, "cni-conf"), Dir: filepath.Join(d, "node"),
	}
}

func TestConfigErrorsSayWhatToDo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		want   []string
	}{
		{"name not a DNS label", func(c *Config) { c.Name = "Node_1" }, []string{`Name="Node_1"`, "DNS label"}},
		{"kubelet missing", func(c *Config) { c.Binaries.Kubelet = "/nonexistent/kubelet" }, []string{"Binaries.Kubelet", "run `make deps`"}},
		{"shim missing", func(c *Config) { c.Binaries.ShimDir = c.CNIConfDir }, []string{"containerd-shim-runc-v2", "run `make deps`"}},
		{"runc not executable", func(c *Config) { c.Binaries.Runc = c.Kubeconfig }, []string{"Binaries.Runc", "not an executable file"}},
		{"loopback node IP", func(c *Config) { c.NodeIP = net.IPv4(127, 0, 0, 1) }, []string{"NodeIP=127.0.0.1", "uplink"}},
		{"no node IP", func(c *Config) { c.NodeIP = nil }, []string{"NodeIP=<nil>"}},
		{"IPv4 as NodeIPv6", func(c *Config) { c.NodeIPv6 = net.IPv4(198, 19, 0, 2) }, []string{"NodeIPv6=198.19.0.2", "IPv6 address"}},
		{"loopback NodeIPv6", func(c *Config) { c.NodeIPv6 = net.IPv6loopback }, []string{"NodeIPv6=::1"}},
		{"NodeIPv6 beside an IPv6 NodeIP", func(c *Config) { c.NodeIP, c.NodeIPv6 = net.ParseIP("fd00::1"), net.ParseIP("fd00::2") }, []string{"want an IPv4 NodeIP"}},
		{"relative cgroup root", func(c *Config) { c.CgroupRoot = "kubenode" }, []string{`CgroupRoot="kubenode"`, "absolute"}},
		{"cgroup root escapes", func(c *Config) { c.CgroupRoot = "/a/../../b" }, []string{"clean path"}},
		{"no netns", func(c *Config) { c.NetnsPath = "/run/netns/does-not-exist-kubenode" }, []string{"NetnsPath", "ip netns add"}},
		{"no state dir", func(c *Config) { c.Dir = "" }, []string{"Dir is empty"}},
		{"socket path too long", func(c *Config) { c.Dir = "/tmp/" + strings.Repeat("d", 90) }, []string{"too long for a unix socket"}},
		{"image archive missing", func(c *Config) { c.Images = []string{"/nonexistent/image.tar"} }, []string{"Images", "make image"}},
		{"private dir relative", func(c *Config) { c.PrivateDirs = []string{"run/axon"} }, []string{`"run/axon"`, "absolute"}},
		{"private dir root", func(c *Config) { c.PrivateDirs = []string{"/"} }, []string{"PrivateDirs"}},
		{"CNI plugins in the node's /opt/cni/bin", func(c *Config) { c.CNIBinDir = "/opt/cni/bin" }, []string{`CNIBinDir="/opt/cni/bin"`, "replaces with its own directory"}},
		{"kubeconfig in a private dir", func(c *Config) {
			c.PrivateDirs = []string{filepath.Join(filepath.Dir(c.Kubeconfig), "kc")}
			c.Kubeconfig = filepath.Join(c.PrivateDirs[0], "kubeconfig")
		}, []string{"Kubeconfig=", "replaces with its own directory"}},
		// the node's cgroup2 subtree bound at a host path would leave a directory on the host
		{"cgroup2 dir on host", func(c *Config) { c.PrivateDirs = []string{"/run/axon"}; c.CgroupV2Dir = "/run/cg2" }, []string{`CgroupV2Dir="/run/cg2"`, "below one of PrivateDirs"}},
		{"cgroup2 dir = private", func(c *Config) { c.PrivateDirs = []string{"/run/kubenode"}; c.CgroupV2Dir = "/run/kubenode" }, []string{"CgroupV2Dir", "below one of PrivateDirs"}},
		{"CNI conf dir missing", func(c *Config) { c.CNIConfDir = "/nonexistent/cni" }, []string{"CNIConfDir", "create the CNI conf dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig(t)
			tc.mutate(&c)
			err := c.setDefaults()
			if err == nil {
				t.Fatal("setDefaults accepted the config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	c := validConfig(t)
	if err := c.setDefaults(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	if c.CgroupRoot != "/axon-kubenode-node1" || c.PauseImage != DefaultPauseImage {
		t.Errorf("defaults: CgroupRoot %q PauseImage %q", c.CgroupRoot, c.PauseImage)
	}
}

func TestContainerdConfigKeepsNodesApart(t *testing.T) {
	c := validConfig(t)
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	got := containerdConfig(c)
	for _, want := range []string{
		"version = 3",
		`root = "` + c.Dir + `/containerd/root"`,
		`state = "` + c.Dir + `/containerd/state"`,
		`address = "` + c.Dir + `/containerd.sock"`,
		`address = "` + c.Dir + `/containerd.sock.ttrpc"`,
		"restrict_oom_score_adj = true",
		"use_internal_loopback = true",
		`bin_dirs = ["/opt/cni/bin", "` + c.CNIBinDir + `"]`,
		`conf_dir = "/etc/cni/net.d"`,
		`BinaryName = "` + c.Binaries.Runc + `"`,
		`Root = "` + c.Dir + `/containerd/runc"`,
		"SystemdCgroup = false",
		`sandbox = "` + DefaultPauseImage + `"`,
		`"io.containerd.nri.v1.nri"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("containerd config lacks %q:\n%s", want, got)
		}
	}
}

func TestKubeletConfig(t *testing.T) {
	c := validConfig(t)
	c.ClientCAFile = filepath.Join(filepath.Dir(c.ClientCAFile), `ca "quoted".crt`) // quoting survives
	if err := os.WriteFile(c.ClientCAFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	var kc map[string]any
	if err := yaml.Unmarshal([]byte(kubeletConfig(c)), &kc); err != nil {
		t.Fatalf("kubelet config is not YAML: %v\n%s", err, kubeletConfig(c))
	}
	for key, want := range map[string]any{
		"kind": "KubeletConfiguration", "cgroupDriver": "cgroupfs", "failCgroupV1": false,
		"cgroupRoot": "/axon-kubenode-node1", "protectKernelDefaults": true, "readOnlyPort": float64(0),
		"healthzBindAddress": "127.0.0.1", "address": "127.0.0.1",
		"containerRuntimeEndpoint": "unix://" + c.Dir + "/containerd.sock", "podLogsDir": "/var/log/pods",
		"resolvConf": "",
	} {
		if kc[key] != want {
			t.Errorf("%s = %#v, want %#v", key, kc[key], want)
		}
	}
	authn, _ := kc["authentication"].(map[string]any)
	x509, _ := authn["x509"].(map[string]any)
	if x509["clientCAFile"] != c.ClientCAFile {
		t.Errorf("authentication.x509.clientCAFile = %#v, want %q", x509["clientCAFile"], c.ClientCAFile)
	}
	c.ServeOnNodeIP = true // the API (exec, logs) on the node IP, for the apiserver's egress proxy
	if err := yaml.Unmarshal([]byte(kubeletConfig(c)), &kc); err != nil {
		t.Fatal(err)
	}
	if _, ok := kc["clusterDNS"]; ok {
		t.Errorf("clusterDNS set without Config.ClusterDNS: %v", kc["clusterDNS"])
	}
	c.ClusterDNS = c.NodeIP
	kc = nil
	if err := yaml.Unmarshal([]byte(kubeletConfig(c)), &kc); err != nil {
		t.Fatal(err)
	}
	if dns, _ := kc["clusterDNS"].([]any); len(dns) != 1 || dns[0] != "198.19.0.1" || kc["clusterDomain"] != "cluster.local" {
		t.Errorf("ClusterDNS: clusterDNS = %#v, clusterDomain = %#v, want [198.19.0.1] and cluster.local", kc["clusterDNS"], kc["clusterDomain"])
	}
	if kc["address"] != "198.19.0.1" || kc["healthzBindAddress"] != "127.0.0.1" {
		t.Errorf("ServeOnNodeIP: address = %#v, healthzBindAddress = %#v, want 198.19.0.1 and 127.0.0.1", kc["address"], kc["healthzBindAddress"])
	}
	args := strings.Join(kubeletArgs(c), " ")
	for _, want := range []string{"--root-dir=/var/lib/kubelet", "--hostname-override=node1", "--node-ip=198.19.0.1 ", "--containerd=" + c.Dir + "/containerd.sock"} {
		if !strings.Contains(args, want) {
			t.Errorf("kubelet args %q lack %q", args, want)
		}
	}
	c.NodeIPv6 = net.ParseIP("fd00:198:19::1") // dual-stack: both InternalIPs
	if args := strings.Join(kubeletArgs(c), " "); !strings.Contains(args, "--node-ip=198.19.0.1,fd00:198:19::1 ") {
		t.Errorf("with NodeIPv6: kubelet args %q lack the dual-stack --node-ip pair", args)
	}
}
