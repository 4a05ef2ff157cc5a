package vmguest

import (
	"reflect"
	"testing"
)

func TestParseLdd(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      []string
	}{
		{"qperf on Debian 12", `	linux-vdso.so.1 (0x00007ffd5a3f2000)
	libibverbs.so.1 => /lib/x86_64-linux-gnu/libibverbs.so.1 (0x00007f899da43000)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f899d842000)
	/lib64/ld-linux-x86-64.so.2 (0x00007f899daa1000)
`, []string{"/lib/x86_64-linux-gnu/libibverbs.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}},
		{"vdso only", "\tlinux-vdso.so.1 (0x00007ffd5a3f2000)\n", nil},
		{"a library ldd cannot find is left out", "\tlibfoo.so.1 => not found\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseLdd([]byte(tc.out)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseLdd = %q, want %q", got, tc.want)
			}
		})
	}
}
