package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/migrations"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// tlsFiles is a throwaway CA with one server certificate (127.0.0.1,
// localhost) every role serves with and one client certificate every
// caller presents.
type tlsFiles struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func writeThrowawayCA(t *testing.T, dir string) tlsFiles {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "payouts e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	pemFile := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
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
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pemFile(name+".crt", "CERTIFICATE", der), pemFile(name+".key", "PRIVATE KEY", keyDER)
	}
	f := tlsFiles{ca: pemFile("ca.crt", "CERTIFICATE", caDER)}
	f.serverCert, f.serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	f.clientCert, f.clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return f
}

// TestWholeSystemOverTLS runs the rail stub, the lock service (PostgreSQL
// backend), the payment resource, the rail proxy and an executor from the
// real binary, every server requiring TLS with client certificates and
// every secret passed in a file; it pays payouts end to end, once each at
// the rail, and shows that plain HTTP and a client without a certificate
// get nothing.
func TestWholeSystemOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := ctxT(t, 5*time.Minute)
	pki := writeThrowawayCA(t, dir)

	pg, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	secretFile := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	dbURLFile := map[migrations.DB]string{}
	for _, db := range []migrations.DB{migrations.PayDB, migrations.ProxyDB, migrations.LockDB} {
		if err := pg.CreateDatabase(ctx, string(db), ""); err != nil {
			t.Fatal(err)
		}
		if err := migrations.Apply(ctx, db, pg.URL(string(db))); err != nil {
			t.Fatal(err)
		}
		dbURLFile[db] = secretFile(string(db)+".url", pg.URL(string(db)))
	}

	tokens := map[auth.Role]string{}
	var af auth.File
	for _, role := range auth.AllRoles {
		tokens[role] = fmt.Sprintf("%s-tls-e2e-token-%d", role, time.Now().UnixNano())
		af.Tokens = append(af.Tokens, auth.FileToken{Token: tokens[role], Role: role, Name: "tls-" + string(role)})
	}
	b, _ := json.Marshal(af)
	authFile := secretFile("auth.json", string(b))

	port := func() string {
		p, err := infra.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return "127.0.0.1:" + strconv.Itoa(p)
	}
	addr := map[string]string{"rail": port(), "lock": port(), "payment": port(), "proxy": port()}
	url := func(role string) string { return "https://" + addr[role] }
	serverTLS := []string{"--auth-file", authFile, "--tls-cert-file", pki.serverCert, "--tls-key-file", pki.serverKey, "--tls-client-ca-file", pki.ca}
	clientTLS := []string{"--ca-file", pki.ca, "--cert-file", pki.clientCert, "--key-file", pki.clientKey}
	procs := map[string]*proctest.Proc{}
	serve := func(role string, args ...string) {
		args = append(append([]string{"serve", role, "--listen", addr[role]}, serverTLS...), args...)
		procs[role] = proctest.Start(t, role, nil, args...)
	}
	serve("rail", "--settlement-window", "1s")
	serve("lock", "--backend", "postgres", "--database-url-file", dbURLFile[migrations.LockDB])
	serve("payment", "--database-url-file", dbURLFile[migrations.PayDB])
	serve("proxy", append([]string{"--database-url-file", dbURLFile[migrations.ProxyDB], "--rail-url", url("rail"),
		"--rail-token-file", secretFile("proxy.token", tokens[auth.Proxy])}, clientTLS...)...)

	clientCfg, err := httpx.ClientTLS(pki.ca, pki.clientCert, pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	hc := httpx.NewHTTPClient(clientCfg)
	for _, role := range []string{"rail", "lock", "payment", "proxy"} {
		waitUntil(t, 2*time.Minute, role+" ready over TLS", func() (bool, error) {
			resp, err := hc.Get(url(role) + "/readyz")
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false, fmt.Errorf("/readyz: %d", resp.StatusCode)
			}
			return true, nil
		})
	}
	proctest.Start(t, "executor", nil, append([]string{"run", "executor", "--lock-url", url("lock"), "--payment-url", url("payment"),
		"--proxy-url", url("proxy"), "--token-file", secretFile("executor.token", tokens[auth.Executor]),
		"--session-ttl", "10s", "--poll-interval", "100ms"}, clientTLS...)...)

	pay, err := pc.New(url("payment"), tokens[auth.Operator], httpx.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "tls-acc", Currency: "EUR", OpeningBalance: 100_000}); err != nil {
		t.Fatalf("create account over TLS: %v", err)
	}
	const n = 4
	for i := range n {
		if _, err := pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: fmt.Sprintf("tls-po-%d", i), AccountID: "tls-acc",
			Amount: 1_000, Currency: "EUR", BeneficiaryRef: "ben-tls"}); err != nil {
			t.Fatalf("create payout over TLS: %v", err)
		}
	}
	for i := range n {
		id := fmt.Sprintf("tls-po-%d", i)
		waitUntil(t, 3*time.Minute, id+" posted", func() (bool, error) {
			p, err := pay.Payout(context.Background(), id)
			if err != nil {
				return false, err
			}
			if p.State != pc.Posted {
				return false, fmt.Errorf("%s is %s", id, p.State)
			}
			return true, nil
		})
	}
	rail, err := railclient.New(url("rail"), tokens[auth.Operator], httpx.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	report, err := rail.SettlementReport(ctx)
	if err != nil {
		t.Fatalf("settlement report over TLS: %v", err)
	}
	perRef := map[string]int{}
	for _, p := range report {
		perRef[p.ClientRef]++
	}
	if len(report) != n || len(perRef) != n {
		t.Fatalf("the rail holds %d payments under %d references; want %d payouts paid once each: %v", len(report), len(perRef), n, perRef)
	}

	// Plain HTTP to a TLS server is refused: no API answer, token or not.
	for _, role := range []string{"rail", "lock", "payment", "proxy"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr[role]+"/v1/accounts/tls-acc", nil)
		req.Header.Set("Authorization", "Bearer "+tokens[auth.Operator])
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("plain HTTP to %s answered %d; want the TLS server's refusal (400)", role, resp.StatusCode)
			}
		}
	}
	// So is a TLS client that presents no certificate.
	noCert, err := httpx.ClientTLS(pki.ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	anon, _ := pc.New(url("payment"), tokens[auth.Operator], httpx.WithHTTPClient(httpx.NewHTTPClient(noCert)), httpx.WithGetRetries(0))
	if _, err := anon.Payout(ctx, "tls-po-0"); err == nil {
		t.Fatal("a TLS client without a client certificate read a payout from a server requiring one")
	}

	// Token rotation without a restart: the auth file gets the operator's
	// next token in place of the old one, SIGHUP, and the server takes the
	// new token and refuses the old.
	next := "operator-rotated-tls-e2e-token"
	for i := range af.Tokens {
		if af.Tokens[i].Role == auth.Operator {
			af.Tokens[i].Token = next
		}
	}
	b, _ = json.Marshal(af)
	if err := os.WriteFile(authFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := procs["payment"].Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	rotated, _ := pc.New(url("payment"), next, httpx.WithHTTPClient(hc))
	waitUntil(t, time.Minute, "the payment resource to take the rotated token", func() (bool, error) {
		_, err := rotated.Payout(context.Background(), "tls-po-0")
		return err == nil, err
	})
	if _, err := pay.Payout(ctx, "tls-po-0"); !problem.Has(err, problem.Unauthorized) {
		t.Fatalf("the old operator token after the rotation: %v; want unauthorized", err)
	}
	if procs["payment"].Exited() {
		t.Fatal("SIGHUP stopped the payment resource")
	}
}
