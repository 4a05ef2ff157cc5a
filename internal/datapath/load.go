package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Helpers every object's loader uses.

// IncompatibleHint adds to a load error caused by a pinned map of another
// layout (ebpf.ErrMapIncompatible) what to do about it.
func IncompatibleHint(err error, pinDir string) error {
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w (a map pinned under %s by another axon version has a different layout: "+
			"run the uninstall (axon lab down) or remove the pinned map, the agent re-creates the entries)", err, pinDir)
	}
	return err
}

// VerifierDetail expands a verifier error to the full verifier log.
func VerifierDetail(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%+v", ve)
	}
	return err
}

// BoolU8 is a load-time bool constant (volatile const __u8 cfg_*) for b.
func BoolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
