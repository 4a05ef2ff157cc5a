package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/netnsutil"
)

// UninstallPodDir removes one pod's attachments and pins under dir, for the
// programs axon attaches inside a pod's netns (the VM-pod bridge bypass, the
// pod LB): tcx links by their pins (keep selects the roles); legacy cls_bpf
// filters, which live in the pod's netns, by looking for each pinned
// program's filter in every netns of netnsPaths (only a filter still running
// the pinned program is deleted, so the wrong netns is left alone; a netns
// that cannot be entered is skipped); then the pins, the map pins named in
// maps, links/ and dir itself.
func UninstallPodDir(dir string, keep func(kind, role string) bool, netnsPaths []string, maps ...string) error {
	pins, err := ListPins(dir, keep)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range netnsPaths {
		_ = netnsutil.DoAt(ns, func() error {
			for _, p := range pins {
				if p.Kind != PinTC {
					continue
				}
				if dev, err := netlink.LinkByName(p.Ifname); err == nil {
					errs = append(errs, DeleteOwnFilter(p, dev, TCHook(p.Role, true)))
				}
			}
			return nil
		})
	}
	for _, p := range pins {
		if p.Kind == PinTC {
			errs = append(errs, RemovePin(p.Path))
			continue
		}
		errs = append(errs, DetachLink(p))
	}
	for _, m := range maps {
		errs = append(errs, RemovePin(filepath.Join(dir, m)))
	}
	errs = append(errs, RemovePin(LinksDir(dir)), RemovePin(dir))
	return errors.Join(errs...)
}

// RemovePin removes the pin (or empty pin directory) p; one already gone is
// fine.
func RemovePin(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}
