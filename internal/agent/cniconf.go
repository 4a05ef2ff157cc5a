package agent

// The CNI configuration file: the agent writes it itself once it is ready
// to serve CNI ADD (datapath loaded, podCIDR known, caches synced), so the
// kubelet reports the node's network ready only when pods can be wired.
// It is written atomically (temp file + rename, 0644) and rewritten when
// someone changed or removed it. It stays on SIGTERM: a restart or an
// upgrade must not turn the node NotReady (pods keep forwarding while the
// agent is down, and CNI ADDs meanwhile fail and are retried by the
// kubelet, as they would with the file gone). `axon uninstall` removes it.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/axonhq/axon/internal/atomicfile"
	"github.com/axonhq/axon/internal/cni"
)

// CNIConfFile is the file the agent writes into --cni-conf-dir.
const CNIConfFile = cni.ConfListFile

// ensureCNIConf writes the configuration list into --cni-conf-dir unless
// it is there with this content. No-op when CNIConfDir is empty. It returns
// whether it wrote.
func (c Config) ensureCNIConf() (bool, error) {
	if c.CNIConfDir == "" {
		return false, nil
	}
	want, err := cni.ConfList(c.Socket, c.cniMTU())
	if err != nil {
		return false, err
	}
	path := filepath.Join(c.CNIConfDir, CNIConfFile)
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err := atomicfile.Write(path, want, 0o644); err != nil {
		return false, fmt.Errorf("write CNI configuration: %w (check --cni-conf-dir %s: it must be the runtime's CNI configuration directory, writable by the agent)", err, c.CNIConfDir)
	}
	return true, nil
}

func (c Config) cniMTU() int {
	if c.CNIMTU == 0 {
		return cni.DefaultMTU
	}
	return c.CNIMTU
}

func (c Config) validateCNIConf() error {
	if c.CNIMTU != 0 && (c.CNIMTU < cni.MinMTU || c.CNIMTU > cni.MaxMTU) {
		return fmt.Errorf("--cni-mtu %d is out of range: use %d..%d", c.CNIMTU, cni.MinMTU, cni.MaxMTU)
	}
	if c.CNIConfDir != "" && c.bypassOnly() {
		return fmt.Errorf("--cni-conf-dir with --mode=bypass-only: another CNI plugin networks the pods and owns the CNI configuration; drop --cni-conf-dir")
	}
	if c.CNIConfDir != "" && !filepath.IsAbs(c.CNIConfDir) {
		return fmt.Errorf("--cni-conf-dir %q must be an absolute path, e.g. /host/etc/cni/net.d", c.CNIConfDir)
	}
	return nil
}
