package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/agent"
	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/uninstall"
)

// newUninstallCmd is `axon uninstall`: remove axon from this node so that
// another CNI plugin can take over (internal/uninstall).
func newUninstallCmd() *cobra.Command {
	o := uninstall.Options{
		BPFRoot:       agent.DefaultBPFRoot,
		StateDir:      agent.DefaultStateDir,
		Socket:        api.DefaultSocket,
		CgroupRoot:    agent.Cgroup2Mount(),
		CNIConfDir:    "/etc/cni/net.d",
		CNIConfFile:   agent.CNIConfFile,
		CNIBinDir:     "/opt/cni/bin",
		RouteProtocol: agent.RouteProtocol,
		DevicePrefix:  cni.AliasPrefix,
	}
	var of outputFlag
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove axon from this node (programs, pins, pod devices, routes, CNI files, state)",
		Long: `Remove everything axon-agent and axon-cni put on this node, so that another CNI
plugin can take over: the BPF programs and links (tcx, legacy tc filters, XDP,
the socket LB's and the bypass's cgroup links) and every pin under --bpf-root,
the pods' host-side devices (alias axon-cni:...), the agent's routes (protocol
0xa0, every table), the Bandwidth Manager's root qdisc, the CNI configuration
in --cni-conf-dir, axon-cni in --cni-bin-dir, and the agent's state directory.

Run it in the node's network namespace as root, with the agent's own
--bpf-root, --state-dir, --socket and --cgroup-root, after stopping the agent:
it refuses while an agent still serves --socket or holds the lock of
<state-dir>/ipam. Pods still running lose their network (their devices and
routes go): drain the node or delete them first. Running it again reports that
nothing is left and succeeds. --dry-run lists what it would remove.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := of.parse(); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			items, err := uninstall.Run(o, log)
			out := cmd.OutOrStdout()
			if of.structured() {
				if items == nil {
					items = []uninstall.Item{}
				}
				if werr := of.write(cmd, map[string]any{"dryRun": o.DryRun, "items": items}); werr != nil {
					return werr
				}
				return err
			}
			verb := "removed"
			if o.DryRun {
				verb = "would remove"
			}
			for _, it := range items {
				fmt.Fprintf(out, "%s %s\n", verb, it)
			}
			switch {
			case err != nil:
			case len(items) == 0:
				fmt.Fprintln(out, "nothing of axon is left on this node")
			default:
				fmt.Fprintf(out, "%d items %s\n", len(items), verb)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.BPFRoot, "bpf-root", o.BPFRoot, "the agent's --bpf-root: every pin under it goes, with what it attaches")
	f.StringVar(&o.StateDir, "state-dir", o.StateDir, "the agent's --state-dir (its ipam, endpoints and node.json go; the directory too when nothing else is in it)")
	f.StringVar(&o.Socket, "socket", defaultSocket(), "the agent's API socket: uninstall refuses while an agent serves it ($AXON_SOCKET)")
	f.StringVar(&o.CgroupRoot, "cgroup-root", o.CgroupRoot, "the agent's --cgroup-root, where the socket LB and the bypass attached")
	f.StringVar(&o.CNIConfDir, "cni-conf-dir", o.CNIConfDir, "CNI configuration directory: "+agent.CNIConfFile+" in it goes; empty = leave it")
	f.StringVar(&o.CNIBinDir, "cni-bin-dir", o.CNIBinDir, "CNI binary directory: "+uninstall.CNIBinary+" in it goes; empty = leave it")
	f.BoolVar(&o.DryRun, "dry-run", false, "list what would be removed and change nothing")
	of.register(cmd)
	return cmd
}
