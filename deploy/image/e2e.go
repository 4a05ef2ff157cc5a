package image

import (
	"path/filepath"
	"time"
)

// The images the upstream e2e suite of Kubernetes v1.36.3 (and its kubelet's default sandbox)
// pulls, by the names test/utils/image/manifest.go of that module gives them. The real-kubelet
// lab imports them into each node's containerd, so no registry is contacted. hack/images checks
// these against the module before it builds anything.
const (
	PauseRef   = "registry.k8s.io/pause:3.10.2"
	AgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
)

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

// AgnhostImage is agnhost as upstream lays it out where the e2e suite looks: /agnhost (a
// static Go build of test/images/agnhost) with the /agnhost-2 link, porter's localhost.crt and
// localhost.key (from porterDir, test/images/agnhost/porter) and an empty /uploads; entrypoint
// /agnhost, command pause. Unlike upstream's it has no Alpine base: no shell, curl, nc or dig,
// so e2e tests that exec those inside an agnhost pod fail here.
func AgnhostImage(agnhostBin, porterDir, arch string, created time.Time) (Contents, error) {
	if _, err := StaticELF(agnhostBin); err != nil {
		return Contents{}, err
	}
	return Contents{
		Entries: []Entry{
			{Path: "/agnhost", Src: agnhostBin},
			{Path: "/agnhost-2", Link: "agnhost"},
			{Path: "/localhost.crt", Src: filepath.Join(porterDir, "localhost.crt"), Mode: 0o644},
			{Path: "/localhost.key", Src: filepath.Join(porterDir, "localhost.key"), Mode: 0o644},
			{Path: "/uploads", Dir: true},
		},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Arch:       arch,
		CreatedBy:  "deploy/image: /agnhost (test/images/agnhost, CGO_ENABLED=0)",
		Created:    created,
	}, nil
}
