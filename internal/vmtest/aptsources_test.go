package vmtest

import (
	"context"
	"os/exec"
	"strings"
	"testing"
)

func TestParseArchives(t *testing.T) {
	// Repository URIs as apt lists them; local ones, so the project names no host.
	const (
		mirror   = "file:/srv/mirror/debian/"
		security = "file:/srv/mirror/debian-security/"
	)
	cases := []struct {
		desc, in string
		want     debianArchives
		wantErr  string
	}{
		{desc: "deb822 main, updates and security, two architectures each",
			in: "deb\t" + mirror + "\tbookworm\tmain\ndeb\t" + mirror + "\tbookworm\tmain\n" +
				"deb\t" + mirror + "\tbookworm-updates\tmain\n" +
				"deb\t" + security + "\tbookworm-security\tmain\ndeb\t" + security + "\tbookworm-security\tmain\n",
			want: debianArchives{Main: mirror, Security: security}},
		{desc: "security listed first, main under an alias, apt's mirror method",
			in: "deb\tmirror+file:/etc/apt/security-mirrors.txt/\tstable-security\tmain\n" +
				"deb\tmirror+file:/etc/apt/mirrors.txt/\tstable\tmain\n",
			want: debianArchives{Main: "mirror+file:/etc/apt/mirrors.txt/", Security: "mirror+file:/etc/apt/security-mirrors.txt/"}},
		{desc: "old-style security suite <codename>/updates",
			in:   "deb\t" + mirror + "\tbuster\tmain\ndeb\t" + security + "\tbuster/updates\tmain\n",
			want: debianArchives{Main: mirror, Security: security}},
		{desc: "proposed-updates and backports count as the main archive",
			in:   "deb\tfile:/srv/a/\tbookworm-proposed-updates\tmain\ndeb\tfile:/srv/b/\ttrixie-backports\tmain\n",
			want: debianArchives{Main: "file:/srv/a/"}},
		{desc: "third-party sources and deb-src are not Debian archives",
			in: "deb\tfile:/srv/node_20.x/\tnodistro\tmain\n" +
				"deb\tfile:/srv/cloud-sdk/\tcloud-sdk-bookworm\tmain\n" +
				"deb\tfile:/srv/docker/linux/debian/\tbookworm\tstable\n" +
				"deb\tfile:/srv/pgdg/\tbookworm-pgdg\tmain\n" +
				"deb-src\t" + security + "\tbookworm-security\tmain\n" +
				"deb\t" + mirror + "\ttrixie\tmain\n",
			want: debianArchives{Main: mirror}},
		{desc: "no Debian archive (an Ubuntu machine)",
			in:      "deb\tfile:/srv/ubuntu/\tnoble\tmain\ndeb\tfile:/srv/ubuntu/\tnoble-security\tmain\n",
			wantErr: "no Debian archive"},
		{desc: "nothing", in: "", wantErr: "no Debian archive"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			got, err := parseArchives(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("parseArchives = %+v, %v; want error %q", got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("parseArchives = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestSourcesList(t *testing.T) {
	const key = "/usr/share/keyrings/debian-archive-keyring.gpg"
	cases := []struct {
		desc string
		a    debianArchives
		want string
	}{
		{desc: "main and security", a: debianArchives{Main: "file:/srv/debian/", Security: "file:/srv/debian-security/"},
			want: "deb [signed-by=" + key + "] file:/srv/debian/ trixie main\n" +
				"deb [signed-by=" + key + "] file:/srv/debian-security/ trixie-security main\n"},
		{desc: "main only", a: debianArchives{Main: "file:/srv/debian/"},
			want: "deb [signed-by=" + key + "] file:/srv/debian/ trixie main\n"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			if got := c.a.sourcesList("trixie", key); got != c.want {
				t.Errorf("sourcesList:\n%s\nwant:\n%s", got, c.want)
			}
		})
	}
}

// TestMachineArchives reads this machine's apt sources through apt (nothing is fetched).
func TestMachineArchives(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("no apt-get on this machine")
	}
	dir := t.TempDir()
	a, err := machineArchives(context.Background(), dir, dir)
	if err != nil {
		t.Skipf("this machine's apt sources: %v", err)
	}
	if !strings.Contains(a.Main, ":") || (a.Security != "" && !strings.Contains(a.Security, ":")) {
		t.Errorf("machineArchives = %+v, want repository URIs", a)
	}
	t.Logf("this machine's Debian archives: %+v", a)
}
