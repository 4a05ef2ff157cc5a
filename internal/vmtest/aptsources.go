package vmtest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// debianArchives are the Debian archives the machine's own apt sources use: whatever mirror
// or proxy host the machine is set up with, the kernel packages come from there too.
type debianArchives struct {
	Main     string // Repo-URI of a Debian suite's main component, e.g. <mirror>/debian/
	Security string // Repo-URI of a <suite>-security source; "" if the machine has none
}

// debianSuites are the names a Debian archive's suites start with: the release codenames and
// their aliases. A machine source whose suite is one of them (optionally with -updates,
// -backports, -proposed-updates or -security) and whose component is main is taken for a Debian
// archive; third-party sources name suites of their own (nodistro, cloud-sdk-bookworm,
// bookworm-pgdg) or components other than main.
var debianSuites = map[string]bool{
	"buster": true, "bullseye": true, "bookworm": true, "trixie": true, "forky": true, "duke": true,
	"sid": true, "oldoldstable": true, "oldstable": true, "stable": true, "testing": true, "unstable": true,
}

// machineArchives asks apt which sources the machine is configured with (its sources.list,
// sources.list.d one-line and deb822 files, as apt itself reads them) and picks the Debian
// archives out of them. stateDir and cacheDir are private: apt reads no state of the machine's.
func machineArchives(ctx context.Context, stateDir, cacheDir string) (debianArchives, error) {
	cmd := exec.CommandContext(ctx, "apt-get",
		"-o", "Dir::State="+stateDir,
		"-o", "Dir::State::status="+stateDir+"/status",
		"-o", "Dir::Cache="+cacheDir,
		"-q", "indextargets", "--no-release-info",
		"--format", "$(TARGET_OF)\t$(REPO_URI)\t$(RELEASE)\t$(COMPONENT)",
		"Created-By: Packages")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return debianArchives{}, fmt.Errorf("list the machine's apt sources (apt-get indextargets): %w\n%s", err, stderr.String())
	}
	return parseArchives(string(out))
}

// parseArchives picks the first Debian main and security archives out of `apt-get indextargets`
// lines "<deb|deb-src>\t<repo URI>\t<suite>\t<component>".
func parseArchives(out string) (debianArchives, error) {
	var a debianArchives
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 || f[0] != "deb" || f[3] != "main" {
			continue
		}
		uri, suite := f[1], f[2]
		base, security := strings.CutSuffix(suite, "-security")
		if !security {
			base, security = strings.CutSuffix(suite, "/updates") // before bullseye: <codename>/updates
		}
		for _, s := range []string{"-proposed-updates", "-updates", "-backports"} {
			if b, ok := strings.CutSuffix(base, s); ok && !security {
				base = b
				break
			}
		}
		if !debianSuites[base] {
			continue
		}
		switch {
		case security && a.Security == "":
			a.Security = uri
		case !security && a.Main == "":
			a.Main = uri
		}
	}
	if a.Main == "" {
		return a, errors.New("the machine's apt sources name no Debian archive (a deb source of a Debian suite " +
			"with component main); the VM kernels are Debian packages fetched from the machine's Debian mirror")
	}
	return a, nil
}

// sourcesList is the private sources.list of suite on the machine's Debian archives.
func (a debianArchives) sourcesList(suite, keyring string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "deb [signed-by=%s] %s %s main\n", keyring, a.Main, suite)
	if a.Security != "" {
		fmt.Fprintf(&b, "deb [signed-by=%s] %s %s-security main\n", keyring, a.Security, suite)
	}
	return b.String()
}
