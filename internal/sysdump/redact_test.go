package sysdump

import (
	"slices"
	"testing"
)

func TestRedactArgs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args, out []string
	}{
		{"plain flags kept", []string{"axon-agent", "--bpf-root=/sys/fs/bpf/axon", "--kubeconfig", "/etc/kc"}, []string{"axon-agent", "--bpf-root=/sys/fs/bpf/axon", "--kubeconfig", "/etc/kc"}},
		{"token with =", []string{"a", "--token=abc", "-v"}, []string{"a", "--token=<redacted>", "-v"}},
		{"password as next arg", []string{"a", "-db-password", "hunter2", "--x"}, []string{"a", "-db-password", "<redacted>", "--x"}},
		{"secret flag followed by a flag", []string{"a", "--client-secret", "--y"}, []string{"a", "--client-secret", "--y"}},
		{"bearer token file name is a token too", []string{"a", "--bearer-token-file=/t"}, []string{"a", "--bearer-token-file=<redacted>"}},
		{"value not a flag", []string{"a", "token=abc"}, []string{"a", "token=abc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := redactArgs(tc.args); !slices.Equal(got, tc.out) {
				t.Fatalf("redactArgs(%q) = %q, want %q", tc.args, got, tc.out)
			}
		})
	}
}
