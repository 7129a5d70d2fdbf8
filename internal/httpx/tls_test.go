package httpx_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
)

// testCA writes a throwaway CA, a server certificate for 127.0.0.1 and a
// client certificate into dir and returns their paths.
type testCA struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newTestCA(t *testing.T, dir string) testCA {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "payouts test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
		return writePEM(t, dir, name+".crt", "CERTIFICATE", der), writePEM(t, dir, name+".key", "PRIVATE KEY", keyDER)
	}
	c := testCA{ca: writePEM(t, dir, "ca.crt", "CERTIFICATE", caDER)}
	c.serverCert, c.serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	c.clientCert, c.clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return c
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A server with TLS and a client CA answers only clients that trust its CA
// and present a certificate; plain HTTP gets no answer from the API.
func TestMutualTLS(t *testing.T) {
	ca := newTestCA(t, t.TempDir())
	srvTLS, err := httpx.NewServerTLS(ca.serverCert, ca.serverKey, ca.ca)
	if err != nil {
		t.Fatal(err)
	}
	s := httpx.NewServer(httpx.Config{Role: "test", Addr: "127.0.0.1:0", Auth: auth.Insecure(), TLS: srvTLS.Config()})
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	base := "https://" + addr.String()
	call := func(caFile, cert, key string) error {
		cfg, err := httpx.ClientTLS(caFile, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		c, err := httpx.NewClient(base, "", httpx.WithHTTPClient(httpx.NewHTTPClient(cfg)), httpx.WithGetRetries(0))
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]string
		return c.Get(context.Background(), "/version", nil, &out)
	}
	if err := call(ca.ca, ca.clientCert, ca.clientKey); err != nil {
		t.Fatalf("client with the CA and a client certificate: %v", err)
	}
	if err := call(ca.ca, "", ""); err == nil {
		t.Fatal("a client without a certificate was answered by a server that requires one")
	}
	if err := call("", ca.clientCert, ca.clientKey); err == nil {
		t.Fatal("a client that does not trust the server's CA completed a request")
	}
	resp, err := http.Get("http://" + addr.String() + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("plain HTTP to a TLS server answered %d", resp.StatusCode)
		}
	}
	if _, err := httpx.ClientTLS("", ca.clientCert, ""); err == nil {
		t.Fatal("--cert-file without --key-file was accepted")
	}
	if _, err := httpx.NewServerTLS(ca.serverCert, "", ""); err == nil {
		t.Fatal("--tls-cert-file without --tls-key-file was accepted")
	}
}

// Reload puts a new certificate in force for new handshakes: after the
// files are replaced by ones from another CA and Reload runs, a client that
// trusts only the old CA is refused and one that trusts the new CA is
// answered.
func TestServerTLSReload(t *testing.T) {
	old := newTestCA(t, t.TempDir())
	fresh := newTestCA(t, t.TempDir())
	srvTLS, err := httpx.NewServerTLS(old.serverCert, old.serverKey, "")
	if err != nil {
		t.Fatal(err)
	}
	s := httpx.NewServer(httpx.Config{Role: "test", Addr: "127.0.0.1:0", Auth: auth.Insecure(), TLS: srvTLS.Config()})
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	get := func(caFile string) error {
		cfg, err := httpx.ClientTLS(caFile, "", "")
		if err != nil {
			t.Fatal(err)
		}
		c, _ := httpx.NewClient("https://"+addr.String(), "", httpx.WithHTTPClient(httpx.NewHTTPClient(cfg)), httpx.WithGetRetries(0))
		return c.Get(context.Background(), "/version", nil, nil)
	}
	if err := get(old.ca); err != nil {
		t.Fatalf("before the reload: %v", err)
	}
	for src, dst := range map[string]string{fresh.serverCert: old.serverCert, fresh.serverKey: old.serverKey} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := srvTLS.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := get(old.ca); err == nil {
		t.Fatal("after the reload the server still presents the old certificate")
	}
	if err := get(fresh.ca); err != nil {
		t.Fatalf("after the reload, a client trusting the new CA: %v", err)
	}
	// A broken file leaves the certificate in force.
	if err := os.WriteFile(old.serverKey, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srvTLS.Reload(); err == nil {
		t.Fatal("Reload accepted a broken key file")
	}
	if err := get(fresh.ca); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
}
