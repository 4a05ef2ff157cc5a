package bwm

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Global sysctls (read only: axon never changes the node's own settings).
const (
	allowedCCPath   = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
	availableCCPath = "/proc/sys/net/ipv4/tcp_available_congestion_control"
	ccPath          = "/proc/sys/net/ipv4/tcp_congestion_control" // per netns
)

// CheckCongestionControl says whether algo can be set inside a pod netns:
// the kernel must have it (tcp_available_congestion_control, the tcp_bbr
// module loaded) and, because a non-initial netns may only choose from it,
// it must be in tcp_allowed_congestion_control.
func CheckCongestionControl(algo string) error {
	avail, err := readWords(availableCCPath)
	if err != nil {
		return err
	}
	if !slices.Contains(avail, algo) {
		return fmt.Errorf("congestion control %q is not available (%s = %s): load it, e.g. modprobe tcp_%s", algo, availableCCPath, strings.Join(avail, " "), algo)
	}
	allowed, err := readWords(allowedCCPath)
	if err != nil {
		return err
	}
	if !slices.Contains(allowed, algo) {
		return fmt.Errorf("congestion control %q is not in %s (%s): pods may only pick allowed ones; add it on the node, e.g. sysctl -w net.ipv4.tcp_allowed_congestion_control=\"%s %s\"", algo, allowedCCPath, strings.Join(allowed, " "), strings.Join(allowed, " "), algo)
	}
	return nil
}

func readWords(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return strings.Fields(string(b)), nil
}

// SetCongestionControl sets net.ipv4.tcp_congestion_control = algo inside
// the network namespace at nsPath (new sockets of the pod use it) and
// returns the previous value. /proc/sys/net resolves to the netns of the
// thread that opens it, so the write happens on a locked thread inside it.
func SetCongestionControl(nsPath, algo string) (prev string, err error) {
	err = ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		b, err := os.ReadFile(ccPath)
		if err != nil {
			return fmt.Errorf("read tcp_congestion_control: %w", err)
		}
		prev = strings.TrimSpace(string(b))
		if prev == algo {
			return nil
		}
		if err := os.WriteFile(ccPath, []byte(algo), 0o644); err != nil {
			return fmt.Errorf("set tcp_congestion_control=%s: %w (check %s)", algo, err, allowedCCPath)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("pod netns %s: %w", nsPath, err)
	}
	return prev, nil
}

// CongestionControl reads net.ipv4.tcp_congestion_control inside nsPath.
func CongestionControl(nsPath string) (string, error) {
	var cc string
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		b, err := os.ReadFile(ccPath)
		cc = strings.TrimSpace(string(b))
		return err
	})
	return cc, err
}
