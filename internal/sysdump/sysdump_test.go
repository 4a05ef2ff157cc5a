package sysdump

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/testutil"
)

// TestWriteWithoutAgent: with no agent at the socket, no metrics address
// and an empty BPF root the archive is still written, and each missing
// part says why (the agent's parts name the socket).
func TestWriteWithoutAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "axon.sock")
	var buf bytes.Buffer
	if err := Write(context.Background(), &buf, Options{Socket: sock, BPFRoot: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	members := map[string]string{}
	for _, m := range testutil.TarMembers(t, &buf) {
		h := m.Header
		if !strings.HasPrefix(h.Name, "axon-sysdump-") || h.Mode != 0o600 {
			t.Errorf("member %s mode %o: want axon-sysdump-<time>/..., 0600", h.Name, h.Mode)
		}
		members[h.Name[strings.Index(h.Name, "/")+1:]] = string(m.Data)
	}
	for _, tc := range []struct{ member, want string }{
		{"status.json.error", sock},
		{"agent-cmdline.txt.error", sock},
		{"metrics.txt.error", "no --health-addr given"},
		{"kernel.txt.error", "the agent's status was not readable"},
		{"kernel.txt", "uname: Linux"},
		{"bpf-pinned.txt", ""},
		{"MEMBERS.txt", "status.json.error"},
	} {
		body, ok := members[tc.member]
		if !ok || !strings.Contains(body, tc.want) {
			t.Errorf("%s (present %v): %q, want it to contain %q", tc.member, ok, body, tc.want)
		}
	}
	if _, ok := members["status.json"]; ok {
		t.Error("status.json written without an agent")
	}
}
