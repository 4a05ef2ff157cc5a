package image

import (
	"path/filepath"
	"time"
)

// E2EToolsPackages are the Debian packages of the tools layer under agnhost (and the whole of
// glibc-dns-testing): the commands the sig-network e2e tests run inside those containers
// (E2ETools). Upstream's agnhost is Alpine with busybox, bind-tools, curl, netcat-openbsd and
// iproute2; glibc-dns-testing is Debian with dnsutils. GNU wget because busybox's in Debian has
// no -T (timeout), which the tests pass. dash is /bin/sh, not busybox: Debian builds busybox's
// shell to prefer its own applets over PATH (wherever /proc/self/exe works, as in a container),
// so under it `nc` would be busybox's nc whatever /bin/nc is. Their dependencies come from apt
// (internal/debroot), minus E2EToolsExclude.
var E2EToolsPackages = []string{"bind9-dnsutils", "busybox-static", "curl", "dash", "iproute2", "libc-bin", "netcat-openbsd", "wget"}

// E2EToolsExclude are dependencies only maintainer scripts use, which never run in the image.
var E2EToolsExclude = []string{"debconf", "debconf-2.0", "dpkg", "perl-base"}

// E2EToolsLinks are the links netcat-openbsd's postinst makes with update-alternatives: without
// it /bin/nc would be busybox's nc, which lacks the -v, -t and -u of the tests' commands.
var E2EToolsLinks = map[string]string{"/bin/nc": "nc.openbsd"}

// PackageSet is a Debian root an image is made of: Packages and their closure in apt's lists
// minus Exclude, unpacked with Links, the alternatives their maintainer scripts would make
// (internal/debroot).
type PackageSet struct {
	Name     string
	Packages []string
	Exclude  []string
	Links    map[string]string
}

// The package sets of the e2e images.
var (
	// ToolsSet is the tools layer under agnhost, glibc-dns-testing's whole root.
	ToolsSet = PackageSet{"e2e tools", E2EToolsPackages, E2EToolsExclude, E2EToolsLinks}
	// BusyBoxSet is the busybox image: upstream's is busybox alone, its applets linked; here
	// Debian's static build, linked by debroot.
	BusyBoxSet = PackageSet{"busybox", []string{"busybox-static"}, E2EToolsExclude, nil}
	// DistrolessIptablesSet is distroless-iptables (upstream: Debian's iptables and conntrack
	// on a distroless base, kube-proxy's base image). The e2e suite runs `sleep 600`, then
	// through `/bin/sh -x -c`: `test -f /proc/net/nf_conntrack`, `cat`, `grep`, `which
	// conntrack` and `conntrack -L` (KubeProxy CLOSE_WAIT): busybox gives the shell and the
	// small tools. The links are the iptables alternatives, nft first as in Debian.
	DistrolessIptablesSet = PackageSet{"distroless-iptables", []string{"busybox-static", "conntrack", "iptables"}, E2EToolsExclude,
		map[string]string{
			"/usr/sbin/iptables": "iptables-nft", "/usr/sbin/iptables-save": "iptables-nft-save", "/usr/sbin/iptables-restore": "iptables-nft-restore",
			"/usr/sbin/ip6tables": "ip6tables-nft", "/usr/sbin/ip6tables-save": "ip6tables-nft-save", "/usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
		}}
)

// E2EToolsPath is the image's PATH (Alpine's, as upstream's agnhost has): the e2e suite runs
// "sh", "nc" and "dig" by name.
const E2EToolsPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// E2ETool is one command the e2e tests run inside agnhost or glibc-dns-testing, with a command
// line that proves it runs (its shared libraries resolve) in the image's root.
type E2ETool struct {
	Name  string
	Check []string // run in the image root; must exit 0
	Used  string   // which tests use it, and how
}

// E2ETools are the commands the sig-network tests of the pinned e2e suite run in these images
// (test/e2e/network, test/e2e/framework/network and framework/service of k8s.io/kubernetes).
var E2ETools = []E2ETool{
	{"sh", []string{"/bin/sh", "-x", "-c", "true"}, "every kubectl exec of the suite (`/bin/sh -x -c <cmd>`, RunHostCmd) and the DNS probers' `sh -c` loops"},
	{"curl", []string{"curl", "--version"}, "Services session affinity, type changes, NodePort, HostPort, Networking Granular Checks (`curl -g -q -s 'http://<pod>/dial?...'`)"},
	{"nc", []string{"sh", "-c", "nc -h 2>&1 | grep -q OpenBSD"}, "Services reachability (`echo hostName | nc -v -t -w 2 <ip> <port>`, `-u` for UDP), HostPort UDP, node-pod UDP checks, conntrack tests"},
	{"dig", []string{"dig", "-v"}, "DNS conformance probers in agnhost and glibc-dns-testing (`dig +notcp +noall +answer +search <name> A`, `+tcp`)"},
	{"nslookup", []string{"nslookup", "-version"}, "Services: a type change to ExternalName resolves the name from an agnhost pod (`nslookup <svc>.<ns>.svc.<domain>`)"},
	{"getent", []string{"getent", "--version"}, "DNS /etc/hosts and pod hostname tests (`getent hosts <name>`)"},
	{"ss", []string{"ss", "-V"}, "NodePort: no host port opened (`ss -ant46 'sport = :<port>'`, not conformance)"},
	{"ip", []string{"ip", "-V"}, "upstream's hostexec tools (iproute2); not used by the conformance selection"},
	{"wget", []string{"sh", "-c", "wget --help 2>&1 | grep -q -- -T"}, "Services up/down and serve-hostname reachability (`wget -q -O - -T 1`, `wget -T 5 -qO-`; not conformance)"},
	{"coreutils", []string{"sh", "-c", "for i in $(seq 1 2); do echo; date; hostname; done | grep -v '^\\s*$' | tail -n +2 | grep -q . && test -n x && sleep 0"},
		"seq, echo, grep, tail, test, date, sleep, hostname of those command lines (busybox)"},
}

// PauseImage is the pause image: the static binary of build/pause/linux/pause.c (gcc -Os
// -static) as /pause, run as 65535:65535 like upstream's.
func PauseImage(pauseBin, arch string, created time.Time) (Contents, error) {
	if _, err := StaticELF(pauseBin); err != nil {
		return Contents{}, err
	}
	return Contents{
		Entries:    []Entry{{Path: "/pause", Src: pauseBin}},
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		Arch:       arch,
		CreatedBy:  "deploy/image: /pause (build/pause/linux/pause.c, gcc -Os -static)",
		Created:    created,
	}, nil
}

// AgnhostImage is agnhost as upstream lays it out where the e2e suite looks, on tools (the layer
// of E2EToolsPackages, TreeEntries of a debroot): /agnhost (a static Go build of
// test/images/agnhost) with the /agnhost-2 link, /coredns (a static CoreDNS: the DNS specs
// run it from agnhost as their own nameserver, `/coredns -conf <Corefile>`), porter's
// localhost.crt and localhost.key (from porterDir, test/images/agnhost/porter) and an empty
// /uploads; entrypoint /agnhost, command pause, Alpine's PATH.
func AgnhostImage(agnhostBin, corednsBin, porterDir string, tools Layer, arch string, created time.Time) (Contents, error) {
	for _, b := range []string{agnhostBin, corednsBin} {
		if _, err := StaticELF(b); err != nil {
			return Contents{}, err
		}
	}
	return Contents{
		Base: []Layer{tools},
		Entries: []Entry{
			{Path: "/agnhost", Src: agnhostBin},
			{Path: "/agnhost-2", Link: "agnhost"},
			{Path: "/coredns", Src: corednsBin},
			{Path: "/localhost.crt", Src: filepath.Join(porterDir, "localhost.crt"), Mode: 0o644},
			{Path: "/localhost.key", Src: filepath.Join(porterDir, "localhost.key"), Mode: 0o644},
			{Path: "/uploads", Dir: true},
		},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Env:        []string{E2EToolsPath},
		Arch:       arch,
		CreatedBy:  "deploy/image: /agnhost (test/images/agnhost, CGO_ENABLED=0)",
		Created:    created,
	}, nil
}

// RootImage is an image of one layer, a Debian root (TreeEntries of a debroot), with cmd and
// Alpine's PATH: glibc-dns-testing (upstream: Debian with dnsutils; the tools layer, the very
// layer agnhost has, so a node stores it once), busybox (BusyBoxPackages) and
// distroless-iptables (DistrolessIptablesPackages). The e2e suite gives each its own command.
func RootImage(root Layer, cmd []string, arch string, created time.Time) Contents {
	return Contents{
		Entries:   root.Entries,
		Cmd:       cmd,
		Env:       []string{E2EToolsPath},
		Arch:      arch,
		CreatedBy: root.CreatedBy,
		Created:   created,
	}
}

// RegressionIssue74839Image is the invalid-conntrack-state spec's server: a static Go build of
// test/images/regression-issue-74839 as its entrypoint (upstream puts it on debian-base; the
// program needs nothing from it). It answers TCP on port 9000 and, through a raw socket,
// sends each new connection a segment outside the window.
func RegressionIssue74839Image(bin, arch string, created time.Time) (Contents, error) {
	if _, err := StaticELF(bin); err != nil {
		return Contents{}, err
	}
	return Contents{
		Entries:    []Entry{{Path: "/regression-issue-74839", Src: bin}},
		Entrypoint: []string{"/regression-issue-74839"},
		Arch:       arch,
		CreatedBy:  "deploy/image: /regression-issue-74839 (test/images/regression-issue-74839, CGO_ENABLED=0)",
		Created:    created,
	}, nil
}
