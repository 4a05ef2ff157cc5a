// Command coredns is the /coredns of the lab's agnhost image (hack/images). Upstream's agnhost
// carries a CoreDNS release binary, which the DNS specs of the e2e suite run as their own
// nameserver (`/coredns -conf /etc/coredns/Corefile`, test/e2e/network/dns_common.go). This is
// CoreDNS itself, from the module pinned in go.mod, with the plugins those Corefiles use:
// hosts and log, and errors for a Corefile that reports them.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/log"
)

func main() { coremain.Run() }
