package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
)

// ca is a throwaway certificate authority.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // its certificate, PEM
}

// newCA returns a CA called name, its certificate written in dir.
func newCA(t *testing.T, dir, name string) *ca {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	c := &ca{}
	c.cert, c.key = c.sign(t, tmpl, nil)
	c.file = filepath.Join(dir, name+".crt")
	writePEM(t, c.file, "CERTIFICATE", c.cert.Raw)
	return c
}

// sign signs a new key's certificate made from tmpl with c, or self-signs
// it when c.cert is nil.
func (c *ca) sign(t *testing.T, tmpl *x509.Certificate, _ any) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	parent, signer := tmpl, key
	if c.cert != nil {
		parent, signer = c.cert, c.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// issue writes a certificate for name signed by c, and its key, in dir, and
// returns their files. A server certificate is for 127.0.0.1 and localhost.
func (c *ca) issue(t *testing.T, dir, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	cert, key := c.sign(t, tmpl, nil)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", cert.Raw)
	writePEM(t, keyFile, "PRIVATE KEY", der)
	return certFile, keyFile
}

// writePEM writes one PEM block to file.
func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// tlsServer starts a redis-server of the test's own that serves TLS with
// the server certificate certFile, trusting the client certificates that
// authority signs, with --tls-auth-clients authClients. The server keeps a
// plain port too, which its readiness probe uses. tlsServer returns the
// plain and the TLS address.
func tlsServer(t *testing.T, authority *ca, certFile, keyFile, authClients string) (plain, secure string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		// A free port may be taken before the server binds it: try others.
		port := strconv.Itoa(freePort(t))
		srv, err := redistest.StartServer("--tls-port", port, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
			"--tls-ca-cert-file", authority.file, "--tls-auth-clients", authClients)
		if err == nil {
			t.Cleanup(func() {
				if err := srv.Stop(); err != nil {
					t.Error(err)
				}
			})
			return srv.Addr, net.JoinHostPort("127.0.0.1", port)
		}
		if attempt == 3 || !strings.Contains(err.Error(), "Address already in use") {
			t.Fatal(err)
		}
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestTLS connects to real TLS servers: with the right CA, through --tls
// or rediss://, with and without a client certificate; and fails with a
// message that says what to do with a CA that did not sign the server's
// certificate, a wrong server name, a plain port, a missing client
// certificate, and a client certificate that the server does not trust.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authority, other := newCA(t, dir, "ca"), newCA(t, dir, "other-ca")
	serverCert, serverKey := authority.issue(t, dir, "server", true)
	clientCert, clientKey := authority.issue(t, dir, "client", false)
	strangerCert, strangerKey := other.issue(t, dir, "stranger", false)
	plain, optional := tlsServer(t, authority, serverCert, serverKey, "optional")
	_, required := tlsServer(t, authority, serverCert, serverKey, "yes")

	const (
		unknownCA    = "tls: failed to verify certificate: x509: certificate signed by unknown authority (the server's certificate is not signed by a CA that keyswap trusts: pass the CA's certificate with --cacert, or skip the check with --insecure)"
		wrongName    = "tls: failed to verify certificate: x509: certificate is valid for localhost, not other.example (the server's certificate is not for the name it was verified against: pass a name it holds with --sni)"
		notTLS       = "context deadline exceeded (the server did not answer the TLS handshake in time: is this its TLS port?)"
		certRequired = " (the server ended the connection, as it does when it requires a client certificate: pass --cert and --key)"
		certRejected = " (the server ended the connection, as it does when it does not trust the client certificate: is --cert signed by a CA that the server trusts?)"
	)
	for _, tc := range []struct {
		name string
		args []string
		addr string // the address in the message
		want string // "": success; else the end of stderr, after the address
	}{
		{"rediss", []string{"-u", "rediss://" + optional, "--cacert", authority.file}, "", ""},
		{"--tls", []string{"-u", optional, "--tls", "--cacert", authority.file}, "", ""},
		{"--sni", []string{"-u", "rediss://" + optional, "--cacert", authority.file, "--sni", "localhost"}, "", ""},
		{"--insecure", []string{"-u", "rediss://" + optional, "--insecure"}, "", ""},
		{"skip_verify", []string{"-u", "rediss://" + optional + "?skip_verify=true"}, "", ""},
		{"client certificate", []string{"-u", "rediss://" + required, "--cacert", authority.file, "--cert", clientCert, "--key", clientKey}, "", ""},
		{"system CAs", []string{"-u", "rediss://" + optional}, optional, unknownCA},
		{"wrong CA", []string{"-u", "rediss://" + optional, "--cacert", other.file}, optional, unknownCA},
		{"wrong name", []string{"-u", "rediss://" + optional, "--cacert", authority.file, "--sni", "other.example"}, optional, wrongName},
		{"plain port", []string{"-u", plain + "?dial_timeout=1s", "--tls", "--cacert", authority.file}, plain, notTLS},
		{"no client certificate", []string{"-u", "rediss://" + required, "--cacert", authority.file}, required, certRequired},
		{"untrusted client certificate", []string{"-u", "rediss://" + required, "--cacert", authority.file, "--cert", strangerCert, "--key", strangerKey},
			required, certRejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := keyswap(t, append([]string{"status", "-json", redistest.Prefix(t) + "*"}, tc.args...)...)
			if tc.want == "" {
				r.wantCode(t, exitOK)
				if rep := decodeStatus(t, r.stdout); rep.Cluster || len(rep.TempKeys) != 0 {
					t.Errorf("got %+v, want an empty standalone report", rep)
				}
				return
			}
			r.wantCode(t, exitError)
			prefix := "keyswap: TLS handshake with " + tc.addr + " failed: "
			if !strings.HasPrefix(r.stderr, prefix) || !strings.HasSuffix(r.stderr, tc.want+"\n") {
				t.Errorf("got stderr\n%q\nwant\n%q...%q", r.stderr, prefix, tc.want)
			}
		})
	}
}

// TestTLSUsageErrors gives TLS flags that cannot work: a usage error that
// names the flag, before any connection.
func TestTLSUsageErrors(t *testing.T) {
	dir := t.TempDir()
	authority := newCA(t, dir, "ca")
	cert, key := authority.issue(t, dir, "client", false)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-u", "unix:///run/redis.sock", "--tls"},
			"keyswap status: TLS over a unix socket is not supported: drop --tls, or connect to the server's TLS port\n"},
		{[]string{"--cacert", authority.file}, "keyswap status: --cacert needs TLS: add --tls, or use a rediss:// URL\n"},
		{[]string{"--insecure"}, "keyswap status: --insecure needs TLS: add --tls, or use a rediss:// URL\n"},
		{[]string{"--sni", "x"}, "keyswap status: --sni needs TLS: add --tls, or use a rediss:// URL\n"},
		{[]string{"--cert", cert, "--key", key}, "keyswap status: --cert needs TLS: add --tls, or use a rediss:// URL\n"},
		{[]string{"--tls", "--cert", cert}, "keyswap status: --cert and --key go together: give both or neither\n"},
		{[]string{"--tls", "--key", key}, "keyswap status: --cert and --key go together: give both or neither\n"},
		{[]string{"--tls", "--cacert", missing}, "keyswap status: --cacert: open " + missing + ": no such file or directory\n"},
		{[]string{"--tls", "--cacert", notPEM}, "keyswap status: --cacert " + notPEM + ": no PEM certificate in it\n"},
		{[]string{"--tls", "--cert", notPEM, "--key", key},
			"keyswap status: --cert " + notPEM + ", --key " + key + ": tls: failed to find any PEM data in certificate input\n"},
	} {
		args := tc.args
		if args[0] != "-u" {
			args = append([]string{"-u", "127.0.0.1:1"}, args...)
		}
		r := keyswap(t, append([]string{"status"}, args...)...)
		r.wantCode(t, exitUsage)
		if want := tc.want + "Run 'keyswap help status' for usage.\n"; r.stderr != want {
			t.Errorf("keyswap status %q: got stderr\n%q\nwant\n%q", tc.args, r.stderr, want)
		}
	}
}

// TestPlainToTLSPort connects without TLS to a server's TLS port: the
// message asks whether it is one, and says what to try.
func TestPlainToTLSPort(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authority := newCA(t, dir, "ca")
	serverCert, serverKey := authority.issue(t, dir, "server", true)
	plain, secure := tlsServer(t, authority, serverCert, serverKey, "optional")
	for _, args := range [][]string{{"-u", secure}, {"-u", "redis://" + secure + "/2"}, {"-p", strings.TrimPrefix(secure, "127.0.0.1:")}} {
		r := keyswap(t, append([]string{"status"}, args...)...)
		r.wantCode(t, exitError)
		prefix := "keyswap: " + secure + " ended the connection before it answered: "
		if !strings.HasPrefix(r.stderr, prefix) || !strings.HasSuffix(r.stderr, " (is this a TLS port? try --tls, or a rediss:// URL)\n") {
			t.Errorf("keyswap status %q: got stderr\n%q\nwant\n%q... (is this a TLS port? try --tls, or a rediss:// URL)", args, r.stderr, prefix)
		}
	}
	// The plain port of the same server is no TLS port: no such hint.
	r := keyswap(t, "status", "-u", plain, redistest.Prefix(t)+"*")
	r.wantCode(t, exitOK)
}
