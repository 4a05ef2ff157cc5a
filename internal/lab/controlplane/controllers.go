package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Defaults for the optional controllers (Config.Controllers): their HTTPS health ports on
// 127.0.0.1, the upstream defaults.
const (
	DefaultSchedulerPort         = 10259
	DefaultControllerManagerPort = 10257
)

// Identities of the controllers and kubelets (Config.Controllers). The bootstrap RBAC policy of
// kube-apiserver binds the first two; the Node authorizer and NodeRestriction admission
// recognise the node ones.
const (
	SchedulerUser         = "system:kube-scheduler"
	ControllerManagerUser = "system:kube-controller-manager"
	NodeUserPfx           = "system:node:"
	NodeGroup             = "system:nodes"
	// apiserverKubeletUser is the apiserver's client identity towards kubelets (logs, exec,
	// port-forward). Kubelets authenticate it with the lab CA (their --client-ca-file).
	apiserverKubeletUser = "kube-apiserver-kubelet-client"
)

// Files under <Dir>/pki and <Dir>/kubeconfigs for the controllers.
const (
	kubeletClientCertFile = "apiserver-kubelet-client.crt"
	kubeletClientKeyFile  = "apiserver-kubelet-client.key"
	schedulerKubeconfig   = "kube-scheduler.kubeconfig"
	kcmKubeconfig         = "kube-controller-manager.kubeconfig"
)

// ensureControllerPKI issues (once) the controllers' client certificates and the apiserver's
// kubelet client certificate, and writes the controllers' kubeconfigs.
func (cp *ControlPlane) ensureControllerPKI() error {
	pki := filepath.Join(cp.cfg.Dir, "pki")
	if !exists(filepath.Join(pki, kubeletClientCertFile)) || !exists(filepath.Join(pki, kubeletClientKeyFile)) {
		if err := cp.ca.issueToFiles(pki, kubeletClientCertFile, kubeletClientKeyFile, leafSpec{
			CommonName: apiserverKubeletUser, Organization: []string{AdminGroup},
		}); err != nil {
			return fmt.Errorf("apiserver kubelet client certificate: %w", err)
		}
	}
	for _, c := range []struct{ user, file string }{
		{SchedulerUser, schedulerKubeconfig},
		{ControllerManagerUser, kcmKubeconfig},
	} {
		base := c.file[:len(c.file)-len(".kubeconfig")]
		if _, err := cp.clientKubeconfig(filepath.Join(pki, "components"), base, leafSpec{CommonName: c.user},
			filepath.Join(cp.cfg.Dir, "kubeconfigs", c.file)); err != nil {
			return fmt.Errorf("%s kubeconfig: %w", c.user, err)
		}
	}
	return nil
}

// KubeletKubeconfig returns the path of a kubeconfig for the kubelet of node: a client
// certificate with CN=system:node:<node> and O=system:nodes, which the Node authorizer and the
// NodeRestriction admission limit to that node's own objects; server
// https://127.0.0.1:<APIPort> (reachable from a node netns through the forwarder). The
// certificate is issued once and reused. It needs Config.Controllers (the Node authorizer).
func (cp *ControlPlane) KubeletKubeconfig(node string) (string, error) {
	if !cp.cfg.Controllers {
		return "", fmt.Errorf("kubelet kubeconfig for %s: the control plane runs without Config.Controllers, so the apiserver has no Node authorizer: start it with Controllers=true", node)
	}
	if !nodeNameRE.MatchString(node) {
		return "", fmt.Errorf("kubelet kubeconfig: node name %q is not a valid DNS subdomain (lowercase letters, digits, '-', '.')", node)
	}
	return cp.clientKubeconfig(filepath.Join(cp.cfg.Dir, "pki", "kubelets"), node,
		leafSpec{CommonName: NodeUserPfx + node, Organization: []string{NodeGroup}},
		filepath.Join(cp.cfg.Dir, "kubeconfigs", "kubelet-"+node+".kubeconfig"))
}

// schedulerArgs: leader election off (one replica), serving on 127.0.0.1 only; the same
// kubeconfig serves for delegated authentication and authorization.
func (cp *ControlPlane) schedulerArgs() []string {
	kc := filepath.Join(cp.cfg.Dir, "kubeconfigs", schedulerKubeconfig)
	return []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.cfg.SchedulerPort),
		"--cert-dir=" + filepath.Join(cp.cfg.Dir, "pki", "kube-scheduler-generated"),
		"--leader-elect=false",
		"--profiling=false",
		"--v=0",
	}
}

// controllerManagerArgs: the default controller set ("*": among them the ServiceAccount and
// token controllers, EndpointSlice, Endpoints, node lifecycle, the workload controllers and the
// garbage collector), each with its own service-account credentials like kubeadm's; service
// account tokens signed with the apiserver's signing key; CSRs signed by the lab CA. Pod CIDRs
// stay with axon's IPAM (--allocate-node-cidrs is off).
func (cp *ControlPlane) controllerManagerArgs() []string {
	pki := func(f string) string { return filepath.Join(cp.cfg.Dir, "pki", f) }
	kc := filepath.Join(cp.cfg.Dir, "kubeconfigs", kcmKubeconfig)
	return []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.cfg.ControllerManagerPort),
		"--cert-dir=" + pki("kube-controller-manager-generated"),
		"--leader-elect=false",
		"--controllers=*",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + pki(saKeyFile),
		"--root-ca-file=" + pki(caCertFile),
		"--cluster-signing-cert-file=" + pki(caCertFile),
		"--cluster-signing-key-file=" + pki(caKeyFile),
		"--service-cluster-ip-range=" + cp.cfg.ServiceCIDR,
		"--allocate-node-cidrs=false",
		"--profiling=false",
		"--v=0",
	}
}

// waitHealthz polls https://127.0.0.1:<port>/healthz of a controller until it answers 200.
// The controllers serve a self-signed certificate they generate themselves on loopback: the
// check is about liveness, not identity, so it does not verify it.
func (cp *ControlPlane) waitHealthz(ctx context.Context, port int, exited <-chan struct{}) error {
	hc := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback liveness probe of a self-signed server
			DisableKeepAlives: true,
		},
	}
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/healthz"
	return poll(ctx, cp.cfg.ReadyTimeout, exited, func(ctx context.Context) error {
		return getOK(ctx, hc, url)
	})
}

// clientKubeconfig issues (once) a client certificate <certDir>/<base>.{crt,key} for spec and
// writes a kubeconfig for it at path.
func (cp *ControlPlane) clientKubeconfig(certDir, base string, spec leafSpec, path string) (string, error) {
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return "", fmt.Errorf("kubeconfig for %s: %w", spec.CommonName, err)
	}
	certFile, keyFile := base+".crt", base+".key"
	if !exists(filepath.Join(certDir, certFile)) || !exists(filepath.Join(certDir, keyFile)) {
		if err := cp.ca.issueToFiles(certDir, certFile, keyFile, spec); err != nil {
			return "", fmt.Errorf("certificate for %s: %w", spec.CommonName, err)
		}
	}
	cert, err := os.ReadFile(filepath.Join(certDir, certFile))
	if err != nil {
		return "", fmt.Errorf("kubeconfig for %s: %w", spec.CommonName, err)
	}
	key, err := os.ReadFile(filepath.Join(certDir, keyFile))
	if err != nil {
		return "", fmt.Errorf("kubeconfig for %s: %w", spec.CommonName, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("kubeconfig for %s: %w", spec.CommonName, err)
	}
	if err := writeKubeconfig(path, cp.Server(), cp.ca.CertPEM, cert, key, spec.CommonName); err != nil {
		return "", err
	}
	return path, nil
}
