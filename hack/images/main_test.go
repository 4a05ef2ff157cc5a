package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/deploy/image"
	"github.com/axonhq/axon/deploy/image/e2eref"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/testutil"
)

// TestCheckRefs: the references in deploy/image/e2e.go match the e2e image manifest of the
// pinned k8s.io/kubernetes, and a manifest that moves an image (here: another pause tag) is
// refused with both names in the message.
func TestCheckRefs(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join("..", "k8s")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Skipf("k8s.io/kubernetes not in the module cache (make deps downloads it): %v", err)
	}
	manifest := filepath.Join(dir, "test", "utils", "image", "manifest.go")
	if _, err := os.Stat(manifest); err != nil {
		t.Skipf("module not downloaded: %v", err)
	}
	if err := checkRefs(manifest); err != nil {
		t.Fatalf("the pinned module: %v", err)
	}
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	_, tag, _ := strings.Cut(e2eref.Pause, ":")
	moved := strings.Replace(string(b), `"pause", "`+tag+`"`, `"pause", "9.9"`, 1)
	if moved == string(b) {
		t.Fatalf("%s has no pause entry with tag %s", manifest, tag)
	}
	alt := filepath.Join(t.TempDir(), "manifest.go")
	if err := os.WriteFile(alt, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	err = checkRefs(alt)
	if err == nil || !strings.Contains(err.Error(), "registry.k8s.io/pause:9.9") || !strings.Contains(err.Error(), e2eref.Pause) {
		t.Fatalf("checkRefs with pause moved to 9.9: %v, want an error naming both references", err)
	}
	t.Logf("refused as expected: %v", err)
}

// inRoot runs argv with root as its root folder, /proc mounted there (in a mount and PID
// namespace of its own, gone when it ends) and only the image's PATH in its environment, as a
// container of the image would run it. /proc matters: busybox's shell runs its own applets
// through /proc/self/exe, and only where that works.
func inRoot(root string, stdin string, argv ...string) *exec.Cmd {
	cmd := exec.Command("unshare", append([]string{"--mount", "--pid", "--fork", "--mount-proc=/proc", "--root=" + root}, argv...)...)
	cmd.Env = []string{image.E2EToolsPath}
	cmd.Stdin = strings.NewReader(stdin)
	return cmd
}

// TestE2EToolsRunInRoot builds the tools layer as make images does (the Debian packages of
// image.E2EToolsPackages and their closure, cached in ~/.cache/axon/debroot) and runs every
// command of image.E2ETools with that root as its root (unshare --root, /proc mounted): each
// one's shared libraries resolve inside the root, so the closure is complete; nc is OpenBSD's,
// also when the shell runs it. Then the command lines the e2e tests use against servers
// on loopback: curl and wget over HTTP, nc over TCP and UDP, answered. The check does use the
// root's libraries, not the host's: a copy without libcurl.so.4 fails to run curl.
func TestE2EToolsRunInRoot(t *testing.T) {
	testutil.RequireRoot(t, "unshare --root into the unpacked packages")
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("no apt-get: the tools layer is built from Debian packages")
	}
	start := time.Now()
	tl, err := RootLayer(context.Background(), filepath.Join(lab.DepsDir(), "debroot"), image.ToolsSet)
	if err != nil {
		t.Fatal(err)
	}
	root := tl.root.Dir
	t.Logf("%d packages in %s (cached %v) in %s; layer of %d entries", len(tl.root.Packages), root, tl.root.Cached, time.Since(start).Round(time.Millisecond), len(tl.layer.Entries))
	for _, tool := range image.E2ETools {
		out, err := inRoot(root, "", tool.Check...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %q in the image root: %v\n%s", tool.Name, tool.Check, err, out)
		}
	}

	// The tests' own command lines, against servers on loopback.
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "web"+r.URL.Path) })}
	go srv.Serve(hl)
	t.Cleanup(func() { srv.Close() })
	tl2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl2.Close() })
	testutil.ServeConns(tl2, func(c net.Conn) { testutil.AnswerLines(c, 5*time.Second, "tcp-answer") })
	uc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			uc.WriteTo(append([]byte("udp-answer:"), buf[:n]...), from)
		}
	}()
	web, tcp, udp := hl.Addr().String(), tl2.Addr().(*net.TCPAddr), uc.LocalAddr().(*net.UDPAddr)
	for _, tc := range []struct {
		name, stdin, cmd, want string
	}{
		{"curl", "", "curl -g -q -s --max-time 15 --connect-timeout 1 http://" + web + "/hostName", "web/hostName"},
		{"wget", "", "wget -q -O - -T 1 http://" + web + "/up", "web/up"},
		{"nc tcp", "", fmt.Sprintf("echo hostName | nc -v -t -w 2 %s %d", tcp.IP, tcp.Port), "tcp-answer"},
		{"nc udp", "", fmt.Sprintf("echo hostName | nc -w 1 -u %s %d", udp.IP, udp.Port), "udp-answer:hostName"},
		{"nc in sh", "", "nc -h 2>&1 | head -1", "OpenBSD netcat"},
		{"loop", "", "for i in $(seq 0 2); do echo; curl -q -s --connect-timeout 2 http://" + web + "/ ; done | grep -c web/", "3"},
	} {
		out, err := inRoot(root, tc.stdin, "/bin/sh", "-c", tc.cmd).Output()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %q: %v, output %q, want %q in it", tc.name, tc.cmd, err, out, tc.want)
		}
	}

	// Negative: the same root without libcurl's library cannot run curl.
	broken := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("cp", "-al", root, broken).CombinedOutput(); err != nil {
		t.Fatalf("cp -al: %v\n%s", err, out)
	}
	libs, _ := filepath.Glob(filepath.Join(broken, "usr", "lib", "*", "libcurl.so.4*"))
	if len(libs) == 0 {
		t.Fatalf("no libcurl.so.4 in %s", broken)
	}
	for _, l := range libs {
		if err := os.Remove(l); err != nil {
			t.Fatal(err)
		}
	}
	out, err := inRoot(broken, "", "curl", "--version").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "libcurl.so.4") {
		t.Fatalf("curl without libcurl.so.4: %v, %q: want a loader error naming it", err, out)
	}
	t.Logf("without libcurl.so.4, as expected: %s", strings.TrimSpace(string(out)))
}

// TestE2EImagesInContainerd imports agnhost and glibc-dns-testing (make images' tarballs,
// built or refreshed here as make images does) into a private real containerd (its own root,
// state and socket under the test's folder, started and stopped by PID) and runs them with
// runc, as the e2e suite's pods run: agnhost's own netexec serving HTTP and UDP in the
// container's network namespace, answered by curl and nc in the same container as the tests'
// command lines ask, and dig in glibc-dns-testing. What the image root test cannot show: the
// image's configuration (PATH, entrypoint) and a shell that runs with /proc as a runtime
// mounts it.
func TestE2EImagesInContainerd(t *testing.T) {
	testutil.RequireRoot(t, "containerd and runc")
	bins := map[string]string{}
	for _, n := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc-debian"} {
		p, err := lab.DepPath(n)
		if err != nil {
			t.Skipf("%v", err)
		}
		bins[n] = p
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("no apt-get: the tools layer is built from Debian packages")
	}
	out := filepath.Join(lab.DepsDir(), "images-k8s-"+lab.K8sVersion)
	start := time.Now()
	if err := run(out, "..", filepath.Join(lab.DepsDir(), "debroot"), time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	t.Logf("images ready in %s", time.Since(start).Round(time.Millisecond))

	const ns = "axon-images-test"
	// ctr's containers live in the cgroup /<namespace>/<id>; runc removes <id>, the namespace's
	// folder is removed here once containerd has stopped (cleanups run last registered first).
	t.Cleanup(func() {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + ns)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+ns) {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("remove the test's cgroup: %v", err)
			}
		}
	})
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// The shim and runc by PATH, as containerd finds them.
	pathEnv := "PATH=" + filepath.Dir(bins["containerd-shim-runc-v2"]) + ":" + filepath.Dir(bins["runc-debian"]) + ":" + os.Getenv("PATH")
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ctd := exec.Command(bins["containerd"], "--config", filepath.Join(dir, "config.toml"))
	ctd.Env = append(os.Environ(), pathEnv)
	ctd.Stdout, ctd.Stderr = logf, logf
	if err := ctd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- ctd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			ctd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			t.Logf("containerd log:\n%s", b)
		}
	})
	ctr := func(args ...string) (string, error) {
		cmd := exec.Command(bins["ctr"], append([]string{"--address", sock, "--namespace", ns}, args...)...)
		cmd.Env = append(os.Environ(), pathEnv)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	deadline := time.Now().Add(testutil.Stretch(t, 20*time.Second))
	for {
		if _, err := ctr("version"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("containerd did not answer on %s: %v", sock, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, img := range e2eref.Images {
		if img.Ref == e2eref.Pause { // no runtime here runs a sandbox
			continue
		}
		if o, err := ctr("images", "import", filepath.Join(out, e2eref.Archive(img.Ref))); err != nil {
			t.Fatalf("import %s: %v\n%s", img.Ref, err, o)
		}
	}
	// The DNS specs' own nameserver: agnhost's /coredns with the Corefile the e2e suite writes
	// (generateCoreDNSConfigmap), asked by dig in the same container.
	corefile := `. {\n\thosts {\n\t\t1.1.1.1 notexistname.resolv.conf.local\n\t}\n\tlog\n}\n`
	for _, tc := range []struct {
		ref, script string
		want        []string
	}{
		{e2eref.Agnhost, "/agnhost netexec --http-port 8080 --udp-port 8081 >/dev/null 2>&1 & " +
			"for i in $(seq 1 50); do curl -g -q -s --connect-timeout 1 'http://127.0.0.1:8080/echo?msg=axon-http' && break; sleep 0.1; done; echo; " +
			"echo udp=$(echo hostName | nc -w 1 -u 127.0.0.1 8081); " +
			"echo | nc -v -t -w 2 127.0.0.1 8080 2>&1 | head -1; nc -h 2>&1 | head -1; dig -v 2>&1; getent --version | head -1; echo wget=$(wget -q -O - -T 1 http://127.0.0.1:8080/hostname)",
			[]string{"axon-http", "Connection to 127.0.0.1 8080 port [tcp/*] succeeded!", "OpenBSD netcat (Debian", "DiG 9.", "getent (Debian GLIBC"}},
		{e2eref.Agnhost, "printf '" + corefile + "' > /tmp/Corefile; /coredns -conf /tmp/Corefile > /tmp/coredns.log 2>&1 & " +
			"for i in $(seq 1 50); do a=$(dig +short +time=1 +tries=1 @127.0.0.1 notexistname.resolv.conf.local) && [ -n \"$a\" ] && break; sleep 0.1; done; " +
			"echo answer=$a; kill $!; cat /tmp/coredns.log",
			[]string{"answer=1.1.1.1\n", "CoreDNS-1.", "notexistname.resolv.conf.local. udp"}},
		{e2eref.GlibcDNSTesting, "dig -v 2>&1; getent --version | head -1", []string{"DiG 9.", "GLIBC"}},
		// The Conntrack specs' init container and client, in upstream's own words.
		{e2eref.BusyBox, "echo Pausing start. && sleep 0; nc 2>&1 | grep Usage; busybox | head -1",
			[]string{"Pausing start.", "Usage: nc", "BusyBox v1."}},
		// The KubeProxy CLOSE_WAIT spec's host tools.
		{e2eref.DistrolessIptables, "sleep 0; test -f /proc/net/nf_conntrack || echo no-proc-conntrack; which conntrack; conntrack --version; iptables --version; cat /proc/version | grep -c Linux",
			[]string{"/usr/sbin/conntrack", "conntrack v1.4", "iptables v1.8", "(nf_tables)"}},
	} {
		// The script writes its output into a file on the host, not through ctr's own stdout:
		// ctr copies a container's output from the shim's FIFOs and can lose the last bytes
		// when the task exits (seen once: busybox's banner, the script's last line, missing).
		name := "t-" + testutil.RandSuffix(t)
		outDir := t.TempDir()
		co, err := ctr("run", "--rm", "--mount", "type=bind,src="+outDir+",dst=/axon-out,options=rbind:rw",
			tc.ref, name, "/bin/sh", "-c", "exec >/axon-out/log 2>&1; set -x; "+tc.script)
		if err != nil {
			t.Errorf("%s: ctr run: %v\n%s", tc.ref, err, co)
			continue
		}
		b, err := os.ReadFile(filepath.Join(outDir, "log"))
		if err != nil {
			t.Errorf("%s: the script's output: %v\nctr printed:\n%s", tc.ref, err, co)
			continue
		}
		o := string(b)
		for _, w := range tc.want {
			if !strings.Contains(o, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.ref, w, o)
			}
		}
		if tc.ref == e2eref.Agnhost && strings.Contains(tc.script, "netexec") {
			// netexec answers "hostName" over UDP and /hostname over HTTP with the container's
			// hostname (ctr run keeps the host's UTS namespace).
			host, err := os.Hostname()
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{"udp=" + host + "\n", "wget=" + host + "\n"} {
				if !strings.Contains(o, w) {
					t.Errorf("agnhost: %q not in:\n%s", w, o)
				}
			}
		}
		t.Logf("%s:\n%s", tc.ref, o)
	}

	// regression-issue-74839 has no shell: run its entrypoint as the spec does (POD_IP from the
	// downward API, NET_RAW is in containerd's default capabilities), see it listen on 9000 and
	// open its raw socket, and still run a second later (a failed raw socket panics).
	name := "t-" + testutil.RandSuffix(t)
	boomLog := filepath.Join(dir, "boom.log")
	if o, err := ctr("run", "-d", "--log-uri", "file://"+boomLog, "--env", "POD_IP=127.0.0.1", "--env", "POD_IPS=127.0.0.1",
		e2eref.RegressionIssue74839, name); err != nil {
		t.Fatalf("%s: ctr run: %v\n%s", e2eref.RegressionIssue74839, err, o)
	}
	t.Cleanup(func() {
		ctr("task", "kill", "-s", "SIGKILL", name)
		for range 50 {
			if _, err := ctr("task", "rm", name); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		ctr("container", "rm", name)
	})
	var boom []byte
	for deadline := time.Now().Add(testutil.Stretch(t, 10*time.Second)); ; time.Sleep(100 * time.Millisecond) {
		boom, _ = os.ReadFile(boomLog)
		if strings.Contains(string(boom), "listen on 0.0.0.0:9000") && strings.Contains(string(boom), "probing 127.0.0.1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no listen/probing lines in its log:\n%s", e2eref.RegressionIssue74839, boom)
		}
	}
	time.Sleep(time.Second)
	if o, err := ctr("task", "ls"); err != nil || !regexp.MustCompile(name+`\s+\d+\s+RUNNING`).MatchString(o) {
		boom, _ = os.ReadFile(boomLog)
		t.Fatalf("%s: not running a second on (%v):\n%s\nlog:\n%s", e2eref.RegressionIssue74839, err, o, boom)
	}
	t.Logf("%s:\n%s", e2eref.RegressionIssue74839, boom)
}
