// Command coredns is the /coredns of the lab's agnhost image (hack/images). Upstream's agnhost
// carries a CoreDNS release binary, which the DNS specs of the e2e suite run as their own
// nameserver (`/coredns -conf /etc/coredns/Corefile`, test/e2e/network/dns_common.go); the
// real-kubelet lab runs it as its cluster DNS too (internal/lab/clusterdns). This is CoreDNS
// itself, from the module pinned in go.mod, with the plugins those Corefiles use: hosts, log
// and errors (the specs' servers); kubernetes, forward, cache, loadbalance, health, ready and
// reload (kubeadm's Corefile, and the one the DNS configMap specs write).
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
