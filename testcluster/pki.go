package main

// Certificates and keys for one cluster: a CA, the apiserver's serving
// certificate for 127.0.0.1/localhost, an admin client certificate in group
// system:masters, and the service-account signing key.

import (
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

type pkiFiles struct {
	CACert, CAKey           string
	ServingCert, ServingKey string
	AdminCert, AdminKey     string
	SAKey, SAPub            string
}

func pkiPaths(dir string) pkiFiles {
	p := func(n string) string { return filepath.Join(dir, "pki", n) }
	return pkiFiles{
		CACert: p("ca.crt"), CAKey: p("ca.key"),
		ServingCert: p("apiserver.crt"), ServingKey: p("apiserver.key"),
		AdminCert: p("admin.crt"), AdminKey: p("admin.key"),
		SAKey: p("sa.key"), SAPub: p("sa.pub"),
	}
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func newSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func generatePKI(dir string) (pkiFiles, error) {
	f := pkiPaths(dir)
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		return f, err
	}
	now := time.Now().Add(-time.Hour)
	until := now.Add(10 * 365 * 24 * time.Hour)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          newSerial(),
		Subject:               pkix.Name{CommonName: "kiln-testcluster-ca"},
		NotBefore:             now,
		NotAfter:              until,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	if err := writePEM(f.CACert, "CERTIFICATE", caDER); err != nil {
		return f, err
	}
	if err := writeKey(f.CAKey, caKey); err != nil {
		return f, err
	}

	issue := func(certPath, keyPath string, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = newSerial()
		tmpl.NotBefore, tmpl.NotAfter = now, until
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return err
		}
		return writeKey(keyPath, key)
	}
	if err := issue(f.ServingCert, f.ServingKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	}); err != nil {
		return f, fmt.Errorf("serving cert: %w", err)
	}
	if err := issue(f.AdminCert, f.AdminKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kiln-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return f, fmt.Errorf("admin cert: %w", err)
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return f, err
	}
	if err := writePEM(f.SAKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return f, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return f, err
	}
	return f, writePEM(f.SAPub, "PUBLIC KEY", pubDER)
}
