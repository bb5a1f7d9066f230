// Command coredns is CoreDNS with only the plugins the real-node cluster DNS uses (tests/cluster/
// realnode.py): its stock main links every plugin (Route 53, Azure, Cloud DNS, etcd, ...), whose
// SDKs triple the build for nothing. This is the external-main way CoreDNS documents for choosing
// plugins at compile time.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order a query passes the plugins, as in CoreDNS's own plugin.cfg.
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
