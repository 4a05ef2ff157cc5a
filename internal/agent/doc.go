// Package agent implements axon-agent, the per-node agent of axon. It
// watches the kube-apiserver (its own Node, the other Nodes, the Pods on
// this node, Services, EndpointSlices and Namespaces), persists the
// endpoint registry and the IPAM pools under --state-dir, and serves the
// local API on a unix socket (--socket) and /healthz and /metrics on
// --health-addr.
//
// Agent (agent.go) is the composition root: it builds the features below,
// runs the reconcile loop that drives them one after the other, and
// dispatches the local API to them. Each feature is a type that owns its
// state and the lock that guards it:
//
//   - nodeStatus (status.go): the uplink, this node's podCIDRs, the kube
//     client and the reconcile counts; node.go resolves the uplink, sets the
//     pools from the own Node and keeps node.json.
//   - routeTable (routes.go): the podCIDR routes to the other nodes.
//   - podDatapath (pods.go, datapath.go, endpoints.go): the tc datapath on
//     the uplink, the endpoint map and the pod devices it is attached to;
//     the endpoint handlers (PutEndpoint, DeleteEndpoint, GC) call into it.
//   - serviceSync (services*.go, hostport.go, events.go): the Service watch,
//     Services, EndpointSlices and Pod hostPorts translated into the lb
//     table and written to an lb.Writer.
//   - socketLB (socklb.go, optout.go): the socket load balancer (cgroup
//     hooks) that translates ClusterIPs at connect/sendmsg, with the per-Pod
//     and per-Namespace opt-out; the Service watch writes through it.
//   - nodePort (nodeport*.go): the north-south load balancer on the uplink
//     (NodePort, LoadBalancer, externalIP and HostPort frontends), its
//     health-check servers, conntrack GC, metrics and API routes; it shares
//     the Service table with the socket LB through teeWriter.
//   - bandwidth (bandwidth.go): the Bandwidth Manager, pod bandwidth
//     annotations enforced by EDT on the uplink and a token bucket before
//     the pod, fq on the uplink and BBR in the pods.
//   - sockBypass (sockmap.go, sockmap_metrics.go): the same-node TCP bypass
//     (sock_ops + sk_msg on a SOCKHASH), its kernel self-test, and the
//     admission of local pods by the axon.io/sockmap annotation (Pod or
//     Namespace) and the bandwidth annotations.
//
// # Locks
//
// A feature's work lock (podDatapath.mu, socketLB.mu, nodePort.mu,
// bandwidth.mu, sockBypass.mu, serviceSync.mu) may be held across BPF and
// netlink calls;
// status readers take only the status locks, which are leaves. No lock is
// held across a call to the kube-apiserver: Events go through client-go's
// asynchronous recorder, and the north-south LB creates its annotation
// Events with no lock held. The only nestings, in this order:
//
//	socketLB.mu  → serviceSync.mu (SetWriter, the Namespace hook)
//	nodePort.mu  → serviceSync.mu (SetWriter)
//	serviceSync.mu → maglevCache.mu (the north-south LB's frontend options)
//
// and any lock → the leaves: nodeStatus.mu, routeTable.mu,
// podDatapath.stMu, socketLB.stMu, sockBypass.stMu, the registry's, the
// IPAM's, the Event recorder's and the kube client's. The reconcile takes the
// feature locks one at a time and passes what a feature needs of another (the
// uplink, the socket LB's writer, the pod datapath's routing mode) as
// arguments, so podDatapath.mu, bandwidth.mu, sockBypass.mu and the others
// never nest.
package agent
