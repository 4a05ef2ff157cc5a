package controlplane

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/proc"
)

func TestListenInodes(t *testing.T) {
	// 6443 = 0x192B. Rows: loopback LISTEN, wildcard LISTEN, other IP LISTEN, loopback ESTABLISHED.
	tcp4 := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:192B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0
   1: 00000000:192B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0 100 0 0 10 0
   2: 0B1212C6:192B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0
   3: 0100007F:192B 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 444 1 0 100 0 0 10 0
   4: 0100007F:0951 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0 100 0 0 10 0
`
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:192B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 666 1 0 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:192B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0 100 0 0 10 0
   2: 20010DB8000000000000000000000001:192B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 888 1 0 100 0 0 10 0
`
	for _, tc := range []struct {
		name  string
		table string
		port  int
		want  []string
	}{
		{"ipv4 loopback and wildcard only", tcp4, 6443, []string{"111", "222"}},
		{"ipv4 other port", tcp4, 2385, []string{"555"}},
		{"ipv4 nobody", tcp4, 2379, nil},
		{"ipv6 loopback and v4-mapped loopback", tcp6, 6443, []string{"666", "777"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := listenInodes([]byte(tc.table), tc.port)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("listenInodes = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPortOwnerNamesThisProcess(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	err = portFree(port)
	if err == nil {
		t.Fatalf("portFree(%d) = nil while we listen on it", port)
	}
	if want := "pid " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("portFree error %q does not name %q", err, want)
	}
}

func TestPKIGeneratedOnceAndIdentities(t *testing.T) {
	dir := t.TempDir()
	extra := net.ParseIP("198.18.0.1")
	ca, err := ensurePKI(dir, []net.IP{extra})
	if err != nil {
		t.Fatal(err)
	}
	files := []string{caCertFile, caKeyFile, apiserverCertFile, apiserverKeyFile, adminCertFile, adminKeyFile, saKeyFile, saPubFile}
	before := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("missing %s: %v", f, err)
		}
		before[f] = b
	}
	for _, f := range []string{caKeyFile, apiserverKeyFile, adminKeyFile, saKeyFile} {
		st, _ := os.Stat(filepath.Join(dir, f))
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, st.Mode().Perm())
		}
	}

	// Second call: nothing rewritten.
	if _, err := ensurePKI(dir, []net.IP{extra}); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if !bytes.Equal(b, before[f]) {
			t.Errorf("%s rewritten by a second ensurePKI", f)
		}
	}

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	load := func(f string) *x509.Certificate {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		c, err := parseCertPEM(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		return c
	}
	srv := load(apiserverCertFile)
	for _, host := range []string{"127.0.0.1", "::1", "198.18.0.1", "localhost", "kubernetes.default.svc"} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("apiserver cert not valid for %s: %v", host, err)
		}
	}
	adm := load(adminCertFile)
	if adm.Subject.CommonName != AdminUser || fmt.Sprint(adm.Subject.Organization) != "["+AdminGroup+"]" {
		t.Errorf("admin subject = %v", adm.Subject)
	}
	if _, err := adm.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("admin cert is not a client cert of the CA: %v", err)
	}

	// A new SAN re-issues only the serving certificate.
	if _, err := ensurePKI(dir, []net.IP{extra, net.ParseIP("198.18.0.2")}); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		changed := !bytes.Equal(b, before[f])
		if want := f == apiserverCertFile || f == apiserverKeyFile; changed != want {
			t.Errorf("%s changed=%v after adding a SAN, want %v", f, changed, want)
		}
	}
}

// Agent and kubelet kubeconfigs carry the identity RBAC, the Node authorizer and NodeRestriction
// expect, are issued once, and refuse node names that are not DNS subdomains (they become file
// names).
func TestClientKubeconfigIdentity(t *testing.T) {
	dir := t.TempDir()
	ca, err := ensurePKI(filepath.Join(dir, "pki"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cp := &ControlPlane{cfg: Config{Dir: dir, APIPort: 16443, Controllers: true}, ca: ca}
	kinds := []struct {
		name     string
		issue    func(string) (string, error)
		certDir  string
		userPfx  string
		wantOrgs string
	}{
		{"agent", cp.AgentKubeconfig, "agents", AgentUserPfx, "[" + AgentGroup + "]"},
		{"kubelet", cp.KubeletKubeconfig, "kubelets", NodeUserPfx, "[" + NodeGroup + "]"},
	}
	for _, k := range kinds {
		for _, tc := range []struct {
			node    string
			wantErr bool
		}{
			{node: "node1"},
			{node: "worker-2.lab"},
			{node: "", wantErr: true},
			{node: "../etc", wantErr: true},
			{node: "Node1", wantErr: true},
		} {
			t.Run(k.name+"/"+tc.node, func(t *testing.T) {
				path, err := k.issue(tc.node)
				if tc.wantErr {
					if err == nil {
						t.Fatalf("%s kubeconfig for %q = %s, want an error", k.name, tc.node, path)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				kc, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(kc), "server: https://127.0.0.1:16443") {
					t.Errorf("kubeconfig lacks the server URL:\n%s", kc)
				}
				crt, _ := os.ReadFile(filepath.Join(dir, "pki", k.certDir, tc.node+".crt"))
				c, err := parseCertPEM(crt)
				if err != nil {
					t.Fatal(err)
				}
				if c.Subject.CommonName != k.userPfx+tc.node || fmt.Sprint(c.Subject.Organization) != k.wantOrgs {
					t.Errorf("%s subject = %v", k.name, c.Subject)
				}
				// Issued once: a second call keeps the certificate.
				if _, err := k.issue(tc.node); err != nil {
					t.Fatal(err)
				}
				crt2, _ := os.ReadFile(filepath.Join(dir, "pki", k.certDir, tc.node+".crt"))
				if !bytes.Equal(crt, crt2) {
					t.Errorf("%s certificate re-issued on second call", k.name)
				}
			})
		}
	}
	// Without the Node authorizer a kubelet identity could do nothing: refuse, and say why.
	plain := &ControlPlane{cfg: Config{Dir: dir, APIPort: 16443}, ca: ca}
	if _, err := plain.KubeletKubeconfig("node1"); err == nil || !strings.Contains(err.Error(), "Controllers=true") {
		t.Errorf("KubeletKubeconfig without Controllers: err = %v, want one that says to set Controllers=true", err)
	}
}

func TestConfigValidation(t *testing.T) {
	exe := "/bin/true"
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"no binaries", Config{Dir: t.TempDir()}, "make deps"},
		{"missing binary", Config{Dir: t.TempDir(), EtcdBinary: "/nonexistent/etcd", APIServerBinary: exe}, "make deps"},
		{"bad cidr", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe, ServiceCIDR: "10.96.0.0"}, "ServiceCIDR"},
		{"port collision", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe, APIPort: 2380, EtcdPort: 2379}, "collides"},
		{"port range", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe, APIPort: 70000}, "1..65535"},
		{"controllers without binaries", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe, Controllers: true, SchedulerBinary: exe}, "ControllerManagerBinary"},
		{"scheduler port collision", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe, Controllers: true,
			SchedulerBinary: exe, ControllerManagerBinary: exe, SchedulerPort: DefaultAPIPort}, "SchedulerPort"},
		{"controller ports unused without controllers", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe, SchedulerPort: DefaultAPIPort}, ""},
		{"ok", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe}, ""},
		{"ok with controllers", Config{Dir: t.TempDir(), EtcdBinary: exe, APIServerBinary: exe, Controllers: true,
			SchedulerBinary: exe, ControllerManagerBinary: exe}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.setDefaults()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.cfg.APIPort != DefaultAPIPort || tc.cfg.EtcdPort != DefaultEtcdPort || tc.cfg.ServiceCIDR != DefaultServiceCIDR {
					t.Errorf("defaults not applied: %+v", tc.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("setDefaults() = %v, want an error mentioning %q", err, tc.wantErr)
			}
		})
	}
}

// A port held by another process fails Start before anything is spawned, naming the holder.
func TestStartPortBusy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	_, err = Start(context.Background(), Config{Dir: dir, APIPort: port, EtcdPort: freePortPair(t), EtcdBinary: "/bin/true", APIServerBinary: "/bin/true"})
	if err == nil {
		t.Fatal("Start succeeded with its API port taken")
	}
	for _, want := range []string{"APIPort", strconv.Itoa(port), "pid " + strconv.Itoa(os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, pidsFile)); !os.IsNotExist(err) {
		t.Errorf("pids.json left behind after a refused start: %v", err)
	}
}

// A process that dies at start-up fails Start quickly with its log tail, and leaves no record.
func TestStartReportsLogTailOfCrashingProcess(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "fake-etcd")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'fatal: simulated etcd failure' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	apiPort, etcdPort := freeControlPlanePorts(t)
	_, err := Start(context.Background(), Config{Dir: dir, APIPort: apiPort, EtcdPort: etcdPort, EtcdBinary: fake, APIServerBinary: "/bin/true"})
	if err == nil {
		t.Fatal("Start succeeded with a crashing etcd")
	}
	for _, want := range []string{"etcd not ready", "process exited", "simulated etcd failure", "etcd.log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("Start took %v to notice the crash", d)
	}
	if _, err := os.Stat(filepath.Join(dir, pidsFile)); !os.IsNotExist(err) {
		t.Errorf("pids.json left behind after a failed start: %v", err)
	}
	if err := Stop(dir); err != nil {
		t.Errorf("Stop after failed start: %v", err)
	}
}

func TestPIDsRoundTripAndStopIgnoresReusedPID(t *testing.T) {
	dir := t.TempDir()
	// Our own PID with a wrong start time: Stop must not signal us.
	self := proc.Named{Name: "impostor", Record: proc.Record{PID: os.Getpid(), StartTime: 1}}
	if err := writePIDs(dir, pidState{Processes: []proc.Named{self}}); err != nil {
		t.Fatal(err)
	}
	st, err := readPIDs(dir)
	if err != nil || len(st.Processes) != 1 || st.Processes[0].PID != os.Getpid() {
		t.Fatalf("readPIDs = %+v, %v", st, err)
	}
	if self.Alive() {
		t.Fatal("record with a wrong start time reported alive")
	}
	if err := Stop(dir); err != nil {
		t.Fatal(err)
	}
	if err := Stop(dir); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := Stop(filepath.Join(dir, "never-created")); err != nil {
		t.Fatalf("Stop on a missing dir: %v", err)
	}
}

// freePortPair returns a port p such that p and p+1 are free on 127.0.0.1 right now.
func freePortPair(t *testing.T) int {
	t.Helper()
	p, release := holdPortPair(t)
	release()
	return p
}

// holdPortPair finds p with p and p+1 free on 127.0.0.1 and keeps both bound
// until release is called, so a port picked meanwhile cannot collide.
func holdPortPair(t *testing.T) (int, func()) {
	t.Helper()
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		if err == nil {
			return p, func() { l.Close(); l2.Close() }
		}
		l.Close()
	}
	t.Fatal("no free pair of ports on 127.0.0.1")
	return 0, nil
}

// freeControlPlanePorts returns an API port and an etcd client port (whose
// peer port is +1) that are free and distinct: two independent picks can
// return the same port once the first listener is closed.
func freeControlPlanePorts(t *testing.T) (api, etcd int) {
	t.Helper()
	etcd, releaseEtcd := holdPortPair(t)
	defer releaseEtcd()
	l, err := net.Listen("tcp", "127.0.0.1:0") // cannot be etcd or etcd+1: both are held
	if err != nil {
		t.Fatal(err)
	}
	api = l.Addr().(*net.TCPAddr).Port
	l.Close()
	return api, etcd
}

// TestAPIServerArgs: without Controllers the apiserver's arguments are exactly the ones of the
// lab before Controllers existed (adopt compares them: a running lab must stay adopted across
// an upgrade); with Controllers authorization is Node,RBAC and the ServiceAccount admission is
// back, with NodeRestriction and the kubelet client certificate.
func TestAPIServerArgs(t *testing.T) {
	cp := &ControlPlane{cfg: Config{Dir: "/d", APIPort: 6443, EtcdPort: 2379, ServiceCIDR: DefaultServiceCIDR}}
	want := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=6443",
		"--etcd-servers=http://127.0.0.1:2379",
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		"--client-ca-file=/d/pki/ca.crt",
		"--tls-cert-file=/d/pki/apiserver.crt",
		"--tls-private-key-file=/d/pki/apiserver.key",
		"--cert-dir=/d/pki/apiserver-generated",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=/d/pki/sa.pub",
		"--service-account-signing-key-file=/d/pki/sa.key",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0",
	}
	if got := cp.apiserverArgs(); !slices.Equal(got, want) {
		t.Errorf("apiserver args without Controllers:\n got %q\nwant %q", got, want)
	}
	if n := len(cp.plan()); n != 2 {
		t.Errorf("plan without Controllers has %d processes, want etcd and kube-apiserver", n)
	}

	cp.cfg.Controllers = true
	got := cp.apiserverArgs()
	for _, a := range []string{"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate=/d/pki/apiserver-kubelet-client.crt", "--kubelet-client-key=/d/pki/apiserver-kubelet-client.key"} {
		if !slices.Contains(got, a) {
			t.Errorf("apiserver args with Controllers lack %s: %q", a, got)
		}
	}
	for _, a := range []string{"--authorization-mode=RBAC", "--disable-admission-plugins=ServiceAccount"} {
		if slices.Contains(got, a) {
			t.Errorf("apiserver args with Controllers still have %s", a)
		}
	}
	if slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "--egress-selector-config-file") }) {
		t.Errorf("apiserver args without EgressProxySocket have an egress selector: %q", got)
	}
	cp.cfg.EgressProxySocket = "/run/x/egress.sock"
	got = cp.apiserverArgs()
	for _, a := range []string{"--egress-selector-config-file=/d/egress-selector.yaml", "--kubelet-preferred-address-types=InternalIP"} {
		if !slices.Contains(got, a) {
			t.Errorf("apiserver args with EgressProxySocket lack %s: %q", a, got)
		}
	}
	var names []string
	for _, p := range cp.plan() {
		names = append(names, p.name)
	}
	if want := []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}; !slices.Equal(names, want) {
		t.Errorf("plan with Controllers %v, want %v", names, want)
	}
}
