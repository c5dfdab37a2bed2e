package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// TestTLS connects to real TLS servers: with the right CA, through --tls
// or rediss://, with and without a client certificate; and fails with a
// message that says what to do with a CA that did not sign the server's
// certificate, a wrong server name, a plain port, a missing client
// certificate, and a client certificate that the server does not trust.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	authority, other := redistest.NewCA(t, dir, "ca"), redistest.NewCA(t, dir, "other-ca")
	serverCert, serverKey := authority.Issue(t, dir, "server", true)
	clientCert, clientKey := authority.Issue(t, dir, "client", false)
	strangerCert, strangerKey := other.Issue(t, dir, "stranger", false)
	srv, optional := redistest.OwnTLSServer(t, authority, serverCert, serverKey, "optional")
	plain := srv.Addr
	_, required := redistest.OwnTLSServer(t, authority, serverCert, serverKey, "yes")

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
		{"rediss", []string{"-u", "rediss://" + optional, "--cacert", authority.File}, "", ""},
		{"--tls", []string{"-u", optional, "--tls", "--cacert", authority.File}, "", ""},
		{"--sni", []string{"-u", "rediss://" + optional, "--cacert", authority.File, "--sni", "localhost"}, "", ""},
		{"--insecure", []string{"-u", "rediss://" + optional, "--insecure"}, "", ""},
		{"skip_verify", []string{"-u", "rediss://" + optional + "?skip_verify=true"}, "", ""},
		{"client certificate", []string{"-u", "rediss://" + required, "--cacert", authority.File, "--cert", clientCert, "--key", clientKey}, "", ""},
		{"system CAs", []string{"-u", "rediss://" + optional}, optional, unknownCA},
		{"wrong CA", []string{"-u", "rediss://" + optional, "--cacert", other.File}, optional, unknownCA},
		{"wrong name", []string{"-u", "rediss://" + optional, "--cacert", authority.File, "--sni", "other.example"}, optional, wrongName},
		{"plain port", []string{"-u", plain + "?dial_timeout=1s", "--tls", "--cacert", authority.File}, plain, notTLS},
		{"no client certificate", []string{"-u", "rediss://" + required, "--cacert", authority.File}, required, certRequired},
		{"untrusted client certificate", []string{"-u", "rediss://" + required, "--cacert", authority.File, "--cert", strangerCert, "--key", strangerKey},
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
	authority := redistest.NewCA(t, dir, "ca")
	cert, key := authority.Issue(t, dir, "client", false)
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
		{[]string{"--cacert", authority.File}, "keyswap status: --cacert needs TLS: add --tls, or use a rediss:// URL\n"},
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
	authority := redistest.NewCA(t, dir, "ca")
	serverCert, serverKey := authority.Issue(t, dir, "server", true)
	srv, secure := redistest.OwnTLSServer(t, authority, serverCert, serverKey, "optional")
	plain := srv.Addr
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
