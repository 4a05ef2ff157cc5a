package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/axonhq/axon/internal/atomicfile"
)

// Certificate lifetimes: the lab is disposable, but a long-lived lab dir must not expire mid-run.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 2 * 365 * 24 * time.Hour
)

// Files under <Dir>/pki.
const (
	caCertFile        = "ca.crt"
	caKeyFile         = "ca.key"
	apiserverCertFile = "apiserver.crt"
	apiserverKeyFile  = "apiserver.key"
	adminCertFile     = "admin.crt"
	adminKeyFile      = "admin.key"
	saKeyFile         = "sa.key"
	saPubFile         = "sa.pub"
)

// Identities the lab issues certificates for.
const (
	AdminUser     = "axon-lab-admin"
	AdminGroup    = "system:masters"
	AgentUserPfx  = "system:axon-agent:"
	AgentGroup    = "axon:agents"
	AgentRoleName = "axon-agent"
)

// authority is the lab's certificate authority.
type authority struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// leafSpec describes a certificate signed by the lab CA.
type leafSpec struct {
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	Server       bool
}

// ensurePKI creates <dir>/pki once (CA, apiserver serving cert, admin client cert, service
// account key pair) and loads it on later calls. Files that exist are never rewritten, except
// the apiserver serving cert when it lacks a SAN the current config needs.
func ensurePKI(dir string, sans []net.IP) (*authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	ca, err := ensureCA(dir)
	if err != nil {
		return nil, err
	}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	ips := append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, sans...)
	if ok, err := certCovers(filepath.Join(dir, apiserverCertFile), ips); err != nil || !ok {
		if err := ca.issueToFiles(dir, apiserverCertFile, apiserverKeyFile, leafSpec{
			CommonName: "kube-apiserver", DNSNames: dns, IPs: ips, Server: true,
		}); err != nil {
			return nil, fmt.Errorf("apiserver certificate: %w", err)
		}
	}
	if !exists(filepath.Join(dir, adminCertFile)) || !exists(filepath.Join(dir, adminKeyFile)) {
		if err := ca.issueToFiles(dir, adminCertFile, adminKeyFile, leafSpec{
			CommonName: AdminUser, Organization: []string{AdminGroup},
		}); err != nil {
			return nil, fmt.Errorf("admin certificate: %w", err)
		}
	}
	if !exists(filepath.Join(dir, saKeyFile)) || !exists(filepath.Join(dir, saPubFile)) {
		if err := writeServiceAccountKeys(dir); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

func ensureCA(dir string) (*authority, error) {
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	if exists(certPath) && exists(keyPath) {
		return loadCA(certPath, keyPath)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: "axon-lab-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	keyPEM, err := marshalKey(key)
	if err != nil {
		return nil, err
	}
	// Key first: a CA cert without its key would be unusable on the next run.
	if err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(certPath, pemBlock("CERTIFICATE", der), 0o644); err != nil {
		return nil, err
	}
	return loadCA(certPath, keyPath)
}

func loadCA(certPath, keyPath string) (*authority, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (delete the pki dir to regenerate it)", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (delete the pki dir to regenerate it)", keyPath, err)
	}
	return &authority{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// issue signs a new leaf certificate and returns the certificate and key in PEM.
func (ca *authority) issue(spec leafSpec) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:   randSerial(),
		Subject:        pkix.Name{CommonName: spec.CommonName, Organization: spec.Organization},
		NotBefore:      now.Add(-time.Hour),
		NotAfter:       now.Add(leafValidity),
		KeyUsage:       x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:       spec.DNSNames,
		IPAddresses:    spec.IPs,
		AuthorityKeyId: ca.Cert.SubjectKeyId,
	}
	if spec.Server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign certificate for %s: %w", spec.CommonName, err)
	}
	keyPEM, err = marshalKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}

func (ca *authority) issueToFiles(dir, certFile, keyFile string, spec leafSpec) error {
	certPEM, keyPEM, err := ca.issue(spec)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, keyFile), keyPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, certFile), certPEM, 0o644)
}

// writeServiceAccountKeys writes the RSA key pair the apiserver signs service account tokens with.
func writeServiceAccountKeys(dir string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("marshal service account public key: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, saKeyFile), pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, saPubFile), pemBlock("PUBLIC KEY", pub), 0o644)
}

// certCovers reports whether the certificate at path is valid for at least a day more and
// carries every IP in ips as a SAN.
func certCovers(path string, ips []net.IP) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	cert, err := parseCertPEM(b)
	if err != nil {
		return false, err
	}
	if time.Until(cert.NotAfter) < 24*time.Hour {
		return false, nil
	}
	for _, want := range ips {
		found := false
		for _, have := range cert.IPAddresses {
			if have.Equal(want) {
				found = true
				break
			}
		}
		if !found {
			return false, nil
		}
	}
	return true, nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKeyPEM(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key block")
	}
	switch blk.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(blk.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, err
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("PKCS#8 key of type %T cannot sign", k)
		}
		return s, nil
	}
	return nil, fmt.Errorf("unsupported PEM block %q", blk.Type)
}

func marshalKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // crypto/rand never fails on Linux
	}
	return n
}

func keyID(pub *ecdsa.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(pub)
	sum := sha1.Sum(der)
	return sum[:]
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}
