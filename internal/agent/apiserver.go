package agent

// How the agent finds the kube-apiserver: a kubeconfig file, or the Pod's
// service account (token and CA) with either the address kubelet put in
// $KUBERNETES_SERVICE_HOST/PORT (the "kubernetes" ClusterIP) or the real
// apiserver named by --k8s-api-server. Without kube-proxy that ClusterIP
// only works once axon itself serves Services, which it learns from that
// same apiserver: the first boot of a node needs --k8s-api-server.

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	// APIServerEnv gives --k8s-api-server when the flag is not passed (a
	// DaemonSet can then take it from a ConfigMap shared with other
	// components).
	APIServerEnv = "AXON_K8S_API_SERVER"
	// DefaultServiceAccountDir is where the kubelet mounts a Pod's
	// service-account token and the cluster CA (token, ca.crt).
	DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// ParseAPIServer validates a --k8s-api-server value and returns it as an
// https URL: "https://host[:port]" or "host:port" (https assumed); an IPv6
// host is bracketed ("[fd00::1]:6443"). Anything else (another scheme, a
// path, a missing port without a scheme) is an error that says what to pass.
func ParseAPIServer(s string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("--k8s-api-server %q: %s: pass the kube-apiserver as https://host:port or host:port, e.g. https://10.0.0.10:6443 (not the kubernetes Service's ClusterIP)", s, why)
	}
	if strings.TrimSpace(s) != s || s == "" {
		return "", bad("empty or surrounded by spaces")
	}
	if !strings.Contains(s, "://") {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			return "", bad(err.Error())
		}
		if err := checkHostPort(host, port); err != nil {
			return "", bad(err.Error())
		}
		return "https://" + net.JoinHostPort(host, port), nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", bad(err.Error())
	}
	switch {
	case u.Scheme != "https":
		return "", bad("scheme " + u.Scheme + " (only https: the service-account token must not travel in clear)")
	case u.User != nil:
		return "", bad("credentials in the URL")
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "":
		return "", bad("a path, query or fragment")
	}
	if err := checkHostPort(u.Hostname(), u.Port()); err != nil {
		return "", bad(err.Error())
	}
	return "https://" + u.Host, nil
}

func checkHostPort(host, port string) error {
	if host == "" {
		return errors.New("no host")
	}
	if strings.ContainsAny(host, "/ @?#") {
		return errors.New("invalid host")
	}
	if port == "" && strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return errors.New("invalid host")
	}
	if port != "" {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("port %q is not 1..65535", port)
		}
	}
	return nil
}

// restConfig builds the agent's client config (see the file comment). The
// agent only reads and writes built-in types, so it talks protobuf (JSON
// stays acceptable): at 10 000 Services the initial lists decode several
// times faster and allocate far less than with JSON.
func (c Config) restConfig() (*rest.Config, error) {
	var rc *rest.Config
	var err error
	server := ""
	if c.APIServer != "" {
		if server, err = ParseAPIServer(c.APIServer); err != nil {
			return nil, err
		}
	}
	if c.Kubeconfig != "" {
		// --k8s-api-server overrides the kubeconfig's server, as kubectl --server does
		if rc, err = clientcmd.BuildConfigFromFlags(server, c.Kubeconfig); err != nil {
			return nil, fmt.Errorf("load --kubeconfig %s: %w", c.Kubeconfig, err)
		}
	} else if rc, err = inClusterConfig(server, c.serviceAccountDir()); err != nil {
		return nil, err
	}
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return rc, nil
}

// restConfig is the client config of a kubeconfig file (tests' admin and
// agent identities).
func restConfig(kubeconfig string) (*rest.Config, error) {
	return Config{Kubeconfig: kubeconfig}.restConfig()
}

func (c Config) serviceAccountDir() string {
	if c.ServiceAccountDir != "" {
		return c.ServiceAccountDir
	}
	return DefaultServiceAccountDir
}

// inClusterConfig is rest.InClusterConfig with the server and the
// service-account directory given: server "" = the kubernetes Service
// from $KUBERNETES_SERVICE_HOST/PORT. The token file is re-read by
// client-go as the kubelet rotates it.
func inClusterConfig(server, saDir string) (*rest.Config, error) {
	if server == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("in-cluster kube config: $KUBERNETES_SERVICE_HOST/PORT are not set (outside a Pod, pass --kubeconfig; in a Pod without kube-proxy, pass --k8s-api-server)")
		}
		server = "https://" + net.JoinHostPort(host, port)
	}
	token, ca := filepath.Join(saDir, "token"), filepath.Join(saDir, "ca.crt")
	for _, f := range []string{token, ca} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("in-cluster kube config for %s: %w (mount the Pod's service account, automountServiceAccountToken, or pass --kubeconfig)", server, err)
		}
	}
	return &rest.Config{Host: server, BearerTokenFile: token, TLSClientConfig: rest.TLSClientConfig{CAFile: ca}}, nil
}
