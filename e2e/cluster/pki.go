package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certPair is a certificate with its key, both PEM-encoded on disk.
type certPair struct {
	cert     *x509.Certificate
	key      crypto.Signer
	CertFile string
	KeyFile  string
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err)
	}
	return n
}

func newCA(dir, name string) (*certPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gpusizer-local-" + name},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	p := &certPair{cert: cert, key: key,
		CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key")}
	if err := writePEM(p.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	return p, writeKey(p.KeyFile, key)
}

// issue signs a serving and/or client certificate with ca.
func (ca *certPair) issue(dir, name, cn string, orgs []string, dns []string, ips []net.IP, server bool) (*certPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now,
		NotAfter:     now.Add(5 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	p := &certPair{cert: cert, key: key,
		CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key")}
	if err := writePEM(p.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	return p, writeKey(p.KeyFile, key)
}

// newServiceAccountKey writes an RSA key pair used to sign and verify
// service-account tokens (TokenRequest, `kubectl create token`).
func newServiceAccountKey(dir string) (keyFile, pubFile string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", err
	}
	keyFile = filepath.Join(dir, "sa.key")
	pubFile = filepath.Join(dir, "sa.pub")
	if err := writePEM(keyFile, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key), 0o600); err != nil {
		return "", "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	if err := writePEM(pubFile, "PUBLIC KEY", pub, 0o644); err != nil {
		return "", "", err
	}
	return keyFile, pubFile, nil
}

// pki holds every file the components need.
type pki struct {
	Dir           string
	CA            *certPair
	APIServer     *certPair
	Admin         *certPair
	ControllerMgr *certPair
	Scheduler     *certPair
	Kwok          *certPair
	Operator      *certPair
	FrontProxyCA  *certPair
	FrontProxy    *certPair
	SAKey, SAPub  string
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{Dir: dir}
	var err error
	if p.CA, err = newCA(dir, "ca"); err != nil {
		return nil, err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local"}
	steps := []struct {
		dst    **certPair
		name   string
		cn     string
		orgs   []string
		server bool
	}{
		{&p.APIServer, "apiserver", "kube-apiserver", nil, true},
		{&p.Admin, "admin", "kubernetes-admin", []string{"system:masters"}, false},
		{&p.ControllerMgr, "controller-manager", "system:kube-controller-manager", nil, false},
		{&p.Scheduler, "scheduler", "system:kube-scheduler", nil, false},
		// kwok writes node and pod status for every fake node: it runs as admin.
		{&p.Kwok, "kwok", "kwok-controller", []string{"system:masters"}, false},
		// A client identity WITHOUT system:masters: bind RBAC to user "gpusizer-operator".
		{&p.Operator, "operator", "gpusizer-operator", nil, false},
	}
	for _, s := range steps {
		var d []string
		var i []net.IP
		if s.server {
			d, i = dns, ips
		}
		if *s.dst, err = p.CA.issue(dir, s.name, s.cn, s.orgs, d, i, s.server); err != nil {
			return nil, fmt.Errorf("issue %s: %w", s.name, err)
		}
	}
	// The aggregation layer (APIService backends such as a metrics adapter) and the
	// requestheader authentication of controller-manager and scheduler need a front proxy CA.
	if p.FrontProxyCA, err = newCA(dir, "front-proxy-ca"); err != nil {
		return nil, err
	}
	if p.FrontProxy, err = p.FrontProxyCA.issue(dir, "front-proxy-client", "front-proxy-client", nil, nil, nil, false); err != nil {
		return nil, err
	}
	if p.SAKey, p.SAPub, err = newServiceAccountKey(dir); err != nil {
		return nil, err
	}
	return p, nil
}
