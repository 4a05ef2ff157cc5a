package kubenode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// privateDir is a host path that the node sees as one of its own directories.
type privateDir struct {
	host string // path as the node's processes (and its pods' hostPath volumes) see it
	dir  string // the node's directory bound there
}

// privateDirs are the paths kubelet, containerd and CNI installers use whatever their config
// says, or that a DaemonSet reaches through hostPath. On the host they are plain directories that
// a mount namespace does not separate: every node would share them and a killed node would leave
// files there (a second kubelet's device-plugin socket would replace the first's).
//   - /var/lib/kubelet: kubelet's root dir; device-plugins/kubelet.sock and pki/ are hard-coded there;
//   - /var/log/pods, /var/log/containers: pod logs and the per-container symlinks kubelet writes;
//   - /run/containerd: containerd 2.x puts every shim's socket in /run/containerd/s, ctr its FIFOs
//     in /run/containerd/fifo;
//   - /etc/cni/net.d = Config.CNIConfDir, /opt/cni/bin = the node's own (empty) plugin dir: where
//     a CNI DaemonSet installs its conflist and binary;
//   - /run/netns: containerd's pod netns bind mounts (cni-<uuid>), the path CNI ADD gets; a CNI
//     agent's hostPath of /var/run/netns must see exactly its own node's pods.
func (c Config) privateDirs() []privateDir {
	d := func(p string) string { return filepath.Join(c.Dir, p) }
	out := []privateDir{
		{"/var/lib/kubelet", d("kubelet")},
		{"/var/log/pods", d("pod-logs")},
		{"/var/log/containers", d("container-logs")},
		{"/run/containerd", d("run-containerd")},
		{"/etc/cni/net.d", c.CNIConfDir},
		{"/opt/cni/bin", d("cni-bin")},
		{"/run/netns", d("run-netns")},
	}
	for _, p := range c.PrivateDirs {
		out = append(out, privateDir{p, d(filepath.Join("private", strings.ReplaceAll(strings.Trim(p, "/"), "/", "_")))})
	}
	return out
}

// ownedDirs are the node directories Stop removes (CNIConfDir is the caller's).
func (c Config) ownedDirs() []string {
	var out []string
	for _, p := range c.privateDirs() {
		if p.dir != c.CNIConfDir {
			out = append(out, p.dir)
		}
	}
	return out
}

// bindPrivateDirs binds each node directory over its host path in the mount namespace of holder.
// A host path that does not exist is created (empty) on the host: a bind needs a target. It is
// never removed again: other nodes' mounts may sit on it.
func bindPrivateDirs(ctx context.Context, t tools, holder int, dirs []privateDir) error {
	h := strconv.Itoa(holder)
	for _, p := range dirs {
		if err := os.MkdirAll(p.dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", p.dir, err)
		}
		for _, argv := range [][]string{
			{t.nsenter, "-t", h, "-m", "--", t.mkdir, "-p", p.host},
			{t.nsenter, "-t", h, "-m", "--", t.mount, "--bind", p.dir, p.host},
		} {
			if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("node mount namespace: %s: %w: %s", strings.Join(argv[5:], " "), err, out)
			}
		}
	}
	return nil
}

// mountNodeFilesystems gives the node, in the mount namespace of holder, what a real node has to
// itself, after the private dirs are bound:
//   - its own bpffs at /sys/fs/bpf (every bpffs mount is a new, empty instance): two nodes' BPF
//     agents pin under the same names (/sys/fs/bpf/axon) and must not share them;
//   - its own cgroup2 subtree (CgroupRoot) bound at Config.CgroupV2Dir, when set: a DaemonSet's
//     hostPath there (axon's hostCgroupRoot) is the node's cgroup2 root, never the machine's;
//   - every mount made shared (rshared /): the holder started them private, so the peer groups
//     are the node's own, none is shared with the host. Containers with mountPropagation
//     HostToContainer (a CNI agent's bpffs and /var/run/netns) need a shared or slave source.
func mountNodeFilesystems(ctx context.Context, t tools, holder int, c Config, cg cgroups) error {
	h := strconv.Itoa(holder)
	argvs := [][]string{
		{t.nsenter, "-t", h, "-m", "--", t.mkdir, "-p", "/sys/fs/bpf"},
		{t.nsenter, "-t", h, "-m", "--", t.mount, "-t", "bpf", "-o", "mode=0700", "bpffs", "/sys/fs/bpf"},
	}
	if c.CgroupV2Dir != "" {
		v2, ok := cg.v2Mount()
		if !ok {
			return fmt.Errorf("config CgroupV2Dir=%q: the host has no cgroup2 hierarchy to bind there", c.CgroupV2Dir)
		}
		argvs = append(argvs,
			[]string{t.nsenter, "-t", h, "-m", "--", t.mkdir, "-p", c.CgroupV2Dir},
			[]string{t.nsenter, "-t", h, "-m", "--", t.mount, "--bind", filepath.Join(v2, c.CgroupRoot), c.CgroupV2Dir})
	}
	argvs = append(argvs, []string{t.nsenter, "-t", h, "-m", "--", t.mount, "--make-rshared", "/"})
	for _, argv := range argvs {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("node mount namespace: %s: %w: %s", strings.Join(argv[5:], " "), err, out)
		}
	}
	return nil
}
