package redistest

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
)

// CA is a throwaway certificate authority for tests of TLS connections.
type CA struct {
	Cert *x509.Certificate
	File string // Cert, PEM-encoded
	key  *ecdsa.PrivateKey
}

// NewCA returns a self-signed CA called name, its certificate written in
// dir.
func NewCA(tb testing.TB, dir, name string) *CA {
	tb.Helper()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	c := &CA{}
	c.Cert, c.key = c.sign(tb, tmpl)
	c.File = filepath.Join(dir, name+".crt")
	writePEM(tb, c.File, "CERTIFICATE", c.Cert.Raw)
	return c
}

// Pool returns a pool that trusts c.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Cert)
	return p
}

// Issue writes a certificate for name signed by c, and its key, in dir, and
// returns their files. A server certificate is for 127.0.0.1 and
// localhost; any other is a client certificate.
func (c *CA) Issue(tb testing.TB, dir, name string, server bool) (certFile, keyFile string) {
	tb.Helper()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	cert, key := c.sign(tb, tmpl)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(tb, certFile, "CERTIFICATE", cert.Raw)
	writePEM(tb, keyFile, "PRIVATE KEY", der)
	return certFile, keyFile
}

// sign signs a new key's certificate made from tmpl with c, or self-signs
// it when c has no certificate yet.
func (c *CA) sign(tb testing.TB, tmpl *x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	parent, signer := tmpl, key
	if c.Cert != nil {
		parent, signer = c.Cert, c.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return cert, key
}

// writePEM writes one PEM block to file.
func writePEM(tb testing.TB, file, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// OwnTLSServer starts a redis-server of tb's own that serves TLS on a port
// of its own with the server certificate certFile and its key keyFile,
// trusting the client certificates that ca signs, with --tls-auth-clients
// authClients ("yes", "no" or "optional"). The server keeps its plain port
// too (srv.Addr), which its readiness probe uses. OwnTLSServer returns the
// server, stopped when tb ends, and its TLS address.
func OwnTLSServer(tb testing.TB, ca *CA, certFile, keyFile, authClients string) (srv *Server, tlsAddr string) {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		// A free port may be taken before the server binds it: try others.
		ports, err := freePorts(1)
		if err != nil {
			tb.Fatal(err)
		}
		port := strconv.Itoa(ports[0])
		srv, err := StartServer("--tls-port", port, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
			"--tls-ca-cert-file", ca.File, "--tls-auth-clients", authClients)
		if err == nil {
			tb.Cleanup(func() {
				if err := srv.Stop(); err != nil {
					tb.Error(err)
				}
			})
			return srv, net.JoinHostPort("127.0.0.1", port)
		}
		if attempt == 3 || !strings.Contains(err.Error(), "Address already in use") {
			tb.Fatal(err)
		}
	}
}
