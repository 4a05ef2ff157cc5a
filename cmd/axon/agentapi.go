package main

import (
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab"
)

// labStateDir mirrors the lab's default state dir; `--node` resolves a lab
// node's agent socket below it.
const labStateDir = "/run/axon-lab"

// agentFlags selects which agent the command talks to.
type agentFlags struct {
	socket string
	node   string
	out    outputFlag
}

// defaultSocket is the --socket default of every command that talks to (or
// about) the agent: $AXON_SOCKET, else the agent's own default.
func defaultSocket() string {
	if s := os.Getenv("AXON_SOCKET"); s != "" {
		return s
	}
	return api.DefaultSocket
}

func (f *agentFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.socket, "socket", defaultSocket(), "agent API socket (env AXON_SOCKET)")
	cmd.Flags().StringVarP(&f.node, "node", "n", "", "talk to this lab node's agent (overrides --socket)")
	f.out.register(cmd)
}

func (f *agentFlags) client() (*api.Client, error) {
	if err := f.out.parse(); err != nil {
		return nil, err
	}
	sock := f.socket
	if f.node != "" {
		sock = filepath.Join(labStateDir, "nodes", f.node, "axon.sock")
		// lab.json knows where the node's agent listens (with --kubelet: inside the node's own /run/axon)
		if l, err := lab.Load(labStateDir); err == nil {
			if c, err := l.Agent(f.node); err == nil {
				sock = c.Socket()
			}
		}
	}
	return api.NewClient(sock), nil
}

func newStatusCmd() *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the node agent's state: one line per datapath decision and why",
		Long: "Show the node agent's state: readiness, kube-apiserver connection, podCIDRs, and one\n" +
			"line per datapath decision (attach mode tcx/legacy, host routing BPF/legacy, device\n" +
			"mode) with the reason for each fallback, then the kernel features probed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if f.out.structured() {
				return f.out.write(cmd, st)
			}
			printStatus(cmd.OutOrStdout(), st)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func printStatus(out io.Writer, st api.Status) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	ready := "yes"
	if !st.Ready {
		ready = "no: " + st.Message
	}
	apis := "disconnected"
	if st.APIServer.Connected {
		apis = "connected"
		if st.APIServer.Synced {
			apis += ", synced"
		}
	}
	if st.APIServer.Message != "" {
		apis += " (" + st.APIServer.Message + ")"
	}
	fmt.Fprintf(w, "Node:\t%s\n", st.Node)
	fmt.Fprintf(w, "Ready:\t%s\n", ready)
	fmt.Fprintf(w, "Version:\t%s\n", st.Version)
	fmt.Fprintf(w, "KubeAPIServer:\t%s\n", apis)
	fmt.Fprintf(w, "PodCIDRs:\t%s\n", joinPrefixes(st.PodCIDRs))
	fmt.Fprintf(w, "Uplink:\t%s\n", st.Uplink)
	fmt.Fprintf(w, "Endpoints:\t%d\n", st.Endpoints)
	fmt.Fprintf(w, "Node routes:\t%d\n", st.Routes)
	w.Flush()
	fmt.Fprintln(out, "Datapath:")
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, d := range st.Datapath {
		fmt.Fprintf(w, "  %s\t%s\t%s\n", d.Name, d.Value, d.Reason)
	}
	w.Flush()
	fmt.Fprintln(out, "Kernel features:")
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, ft := range st.Features {
		yes := "no"
		if ft.Available {
			yes = "yes"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", ft.Name, yes, ft.Reason)
	}
	w.Flush()
}

func joinPrefixes(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "(none)"
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

func newEndpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "endpoint",
		Short: "Inspect the pod endpoints the agent programs into the datapath",
	}
	var f agentFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List pod endpoints: pod, IPs, host device, state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			eps, err := c.Endpoints(cmd.Context())
			if err != nil {
				return err
			}
			sort.Slice(eps, func(i, j int) bool {
				if eps[i].PodNamespace != eps[j].PodNamespace {
					return eps[i].PodNamespace < eps[j].PodNamespace
				}
				return eps[i].PodName < eps[j].PodName
			})
			if f.out.structured() {
				if eps == nil {
					eps = []api.Endpoint{}
				}
				return f.out.write(cmd, eps)
			}
			vm := slices.ContainsFunc(eps, func(ep api.Endpoint) bool { return ep.VMBypass != "" })
			plb := slices.ContainsFunc(eps, func(ep api.Endpoint) bool { return ep.PodLB != "" })
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			head := "POD\tIPS\tHOST DEVICE\tIFINDEX\tSTATE\tCONTAINER"
			if vm { // only on nodes with VM pods that asked for the bridge bypass
				head += "\tVM BYPASS"
			}
			if plb { // only on nodes with pods the socket LB skips
				head += "\tPOD LB"
			}
			fmt.Fprintln(w, head)
			for _, ep := range eps {
				ips := make([]string, len(ep.IPs))
				for i, ip := range ep.IPs {
					ips[i] = ip.String()
				}
				pod := ep.PodName
				if ep.PodNamespace != "" {
					pod = ep.PodNamespace + "/" + ep.PodName
				}
				cid := ep.ContainerID
				if len(cid) > 12 {
					cid = cid[:12]
				}
				row := fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s", pod, strings.Join(ips, ","), ep.HostIfName, ep.HostIfIndex, ep.State, cid)
				if vm {
					row += "\t" + cmp.Or(ep.VMBypass, "-")
				}
				if plb {
					row += "\t" + cmp.Or(ep.PodLB, "-")
				}
				fmt.Fprintln(w, row)
			}
			return w.Flush()
		},
	}
	f.register(list)
	cmd.AddCommand(list)
	return cmd
}
