package stack

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// TLSFiles are the files of a stack running over TLS.
type TLSFiles struct {
	CA   string `json:"ca_file"`   // the throwaway CA: clients trust it (--ca-file)
	Cert string `json:"cert_file"` // every server's certificate (127.0.0.1, ::1, localhost)
	Key  string `json:"key_file"`
}

// newThrowawayTLS makes a CA that lives as long as this stack run and one
// server certificate it signed, valid for the loopback names the roles
// listen on, under dir (keys 0600). Each run makes new ones: nothing
// outside the stack ever trusts them.
func newThrowawayTLS(dir string) (TLSFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return TLSFiles{}, err
	}
	f := TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem")}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "payouts dev stack throwaway CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, fmt.Errorf("throwaway CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "payouts dev stack"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return f, fmt.Errorf("server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return f, err
	}
	for _, w := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{{f.CA, "CERTIFICATE", caDER, 0o644}, {f.Cert, "CERTIFICATE", der, 0o644}, {f.Key, "PRIVATE KEY", keyDER, 0o600}} {
		if err := writeFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), w.mode); err != nil {
			return f, err
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// writeFile replaces path with b, created with mode (os.WriteFile keeps
// the mode of a file that exists; a secret must never stay readable).
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
