package e2eref

import "testing"

func TestArchive(t *testing.T) {
	for ref, want := range map[string]string{
		Pause:              "pause-3.10.2.tar",
		Agnhost:            "agnhost-2.63.0.tar",
		BusyBox:            "busybox-1.37.0-1.tar",
		DistrolessIptables: "distroless-iptables-v0.9.6.tar",
	} {
		if got := Archive(ref); got != want {
			t.Errorf("Archive(%s) = %s, want %s", ref, got, want)
		}
	}
}

// TestImages: every reference once, the required ones first (the lab imports those and
// refuses to start without them).
func TestImages(t *testing.T) {
	seen := map[string]bool{}
	optional := false
	for _, img := range Images {
		if seen[img.Ref] || seen[img.Manifest] {
			t.Errorf("%s (%s) listed twice", img.Ref, img.Manifest)
		}
		seen[img.Ref], seen[img.Manifest] = true, true
		if img.Required && optional {
			t.Errorf("%s is required but follows an optional image", img.Ref)
		}
		optional = optional || !img.Required
	}
	if !Images[0].Required || Images[0].Ref != Pause {
		t.Errorf("first image %+v, want pause, required", Images[0])
	}
}
