// Package charttest runs the helm binary that `make deps` builds into the
// cache on the repository's chart (deploy/helm/axon) and decodes what it
// renders, for the tests that check the chart (deploy) and the ones that
// start an agent the way the chart does (internal/agent).
package charttest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/axonhq/axon/internal/lab"
)

// Helm runs the cached helm with args, isolated from any user's helm
// configuration; it skips the test when `make deps` has not built helm.
func Helm(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	bin, err := lab.DepPath("helm")
	if errors.Is(err, lab.ErrDepMissing) {
		t.Skipf("helm not built: run make deps (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME=/nonexistent", "HELM_CACHE_HOME=/nonexistent", "HELM_DATA_HOME=/nonexistent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// Render runs `helm template axon <chart> --namespace kube-system` with
// extra arguments (--set ...) and fails the test on an error.
func Render(t testing.TB, chart string, extra ...string) []byte {
	t.Helper()
	out, err := Helm(t, append([]string{"template", "axon", chart, "--namespace", "kube-system"}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Decode reads a multi-document rendering into typed objects; kinds
// client-go does not know (the ServiceMonitor) come back unstructured, and
// documents of comments only are skipped.
func Decode(t testing.TB, raw []byte) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read a rendering: %v", err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if runtime.IsNotRegisteredError(err) {
			u := &unstructured.Unstructured{}
			if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
				t.Fatalf("decode a document: %v\n%s", err, doc)
			}
			objs = append(objs, u)
			continue
		}
		if err != nil {
			t.Fatalf("decode a document: %v\n%s", err, doc)
		}
		objs = append(objs, obj)
	}
	return objs
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
